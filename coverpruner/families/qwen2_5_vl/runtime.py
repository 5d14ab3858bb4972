"""Qwen2.5-VL's run-time rules (numpy only): dynamic resolution, host-side window tables, every merger output a
candidate, native M-RoPE positions (rank 3)."""

from __future__ import annotations

import numpy as np

from coverpruner.families.contract import GridPanel, ImageSpan, NativeLayout, VisionInputs
from coverpruner.families.hf import HFRuntime
from coverpruner.families.qwen2_5_vl.positions import decode_position, native_positions, pruned_positions
from coverpruner.families.qwen2_5_vl.preprocess import QwenImageSettings, preprocess_qwen_image
from coverpruner.families.qwen2_5_vl.vision import vision_inputs

IMAGE_TOKEN = "<|image_pad|>"


class QwenRuntime(HFRuntime):
    """Qwen2.5-VL's run-time rules for one engine dir (contract.FamilyRuntime): dynamic resolution, host-side
    window tables, every merger output a candidate, native M-RoPE positions (rank 3)."""

    position_rank = 3
    image_token = IMAGE_TOKEN

    def __init__(self, manifest):
        super().__init__(manifest)
        self.settings = QwenImageSettings.from_dict(manifest.processor)
        dims = manifest.dims
        self.merge, self.window, self.patch = (int(dims["spatial_merge_size"]), int(dims["window_size"]),
                                               int(dims["patch_size"]))

    def prepare_image(self, image, options: dict) -> VisionInputs:
        """Vision feeds (VISION_INPUTS; pixel_values [N, 1176] in the graph's float dtype), n = gh*gw/merge^2,
        and one picture panel: the merged-patch grid (28x28 px cells of the resized image), which covers the
        whole original image (the resize keeps everything)."""
        img = preprocess_qwen_image(image, self.settings, image_size=options.get("image_size"))
        feeds = vision_inputs(img.pixel_values.astype(self.float_dtype, copy=False), img.grid_thw, self.merge,
                              self.window, self.patch)
        n = img.num_visual_tokens
        rows, cols = img.grid_thw[1] // self.merge, img.grid_thw[2] // self.merge
        h, w = img.original
        cell = self.merge * self.patch
        panel = GridPanel(f"{cell}x{cell} px cells of the {img.resized[1]}x{img.resized[0]} resized image",
                          (rows, cols), (0.0, 0.0, float(w), float(h)), np.arange(n, dtype=np.int64))
        return VisionInputs(feeds, n, (panel,), {"grid_thw": img.grid_thw, "resized": img.resized,
                                                 "original": img.original})

    def image_span(self, outputs: dict, vision: VisionInputs, options: dict) -> ImageSpan:
        """image_features [n, d] (native order) -> rows [n, d], every row a candidate."""
        feats = outputs["image_features"]
        n = vision.num_candidates
        if feats.ndim != 2 or feats.shape[0] != n:
            raise ValueError(f"vision graph returned image_features {list(feats.shape)}, expected [{n}, d]")
        return ImageSpan(feats, np.arange(n, dtype=np.int64))

    def layout(self, tokenizer, prompt: str, num_image_rows: int) -> NativeLayout:
        """The published chat template around [image, prompt], <|image_pad|> expanded to n (no BOS)."""
        if any(m in prompt for m in ("<|vision_start|>", "<|vision_end|>")):
            raise ValueError("the prompt must not contain the image markers '<|vision_start|>' / '<|vision_end|>'")
        return super().layout(tokenizer, prompt, num_image_rows)

    def native_positions(self, layout: NativeLayout, vision: VisionInputs) -> np.ndarray:
        """int64 [3, L]: HF get_rope_index's positions for the full native sequence."""
        return native_positions(layout.input_ids, self.image_token_id, [vision.facts["grid_thw"]], self.merge)

    def pruned_positions(self, native: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """int64 [3, L']: kept rows keep their native positions (no re-packing)."""
        return pruned_positions(native, rows)

    def decode_position(self, native: np.ndarray, pruned: np.ndarray, step: int) -> np.ndarray:
        """int64 [3]: the step-th generated token at max(native) + 1 + step, where it sits without pruning."""
        return decode_position(native, step)
