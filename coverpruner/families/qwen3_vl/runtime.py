"""Qwen3-VL's run-time rules (numpy only): dynamic resolution at 32 px per visual token, host-side position-grid
interpolation tables, every merger output a candidate with its DeepStack rows as decoder extras, native M-RoPE
positions (rank 3)."""

from __future__ import annotations

import numpy as np

from coverpruner.families.contract import GridPanel, ImageSpan, VisionInputs
from coverpruner.families.hf import HFRuntime
from coverpruner.families.qwen3_vl.positions import decode_position, native_positions
from coverpruner.families.qwen3_vl.preprocess import Qwen3ImageSettings, preprocess_image
from coverpruner.families.qwen3_vl.vision import vision_inputs

IMAGE_TOKEN = "<|image_pad|>"


def extra_names(levels: int) -> list[str]:
    """The decoder-extra names of ``levels`` DeepStack levels (graph outputs of vision.onnx, inputs of the
    decoder): visual_extra.0, visual_extra.1, ..."""
    return [f"visual_extra.{k}" for k in range(levels)]


class Qwen3VLRuntime(HFRuntime):
    """contract.FamilyRuntime for a Qwen3-VL engine dir."""

    position_rank = 3
    image_token = IMAGE_TOKEN
    reserved_strings = ("<|vision_start|>", "<|vision_end|>")

    def __init__(self, manifest):
        super().__init__(manifest)
        self.settings = Qwen3ImageSettings.from_dict(manifest.processor)
        dims = manifest.dims
        self.merge, self.patch = int(dims["spatial_merge_size"]), int(dims["patch_size"])
        self.num_position_embeddings = int(dims["num_position_embeddings"])
        self.extras = extra_names(int(dims["deepstack_levels"]))

    def prepare_image(self, image, options: dict) -> VisionInputs:
        """Vision feeds (VISION_INPUTS; pixel_values [N, 1536] in the graph's float dtype), n = gh*gw/4, and one
        picture panel: the merged-patch grid (32x32 px cells of the resized image) over the whole image."""
        img = preprocess_image(image, self.settings)
        feeds = vision_inputs(img.pixel_values.astype(self.float_dtype, copy=False), img.grid_thw, self.merge,
                              self.num_position_embeddings)
        n = img.num_visual_tokens
        rows, cols = img.grid_thw[1] // self.merge, img.grid_thw[2] // self.merge
        h, w = img.original
        cell = self.merge * self.patch
        panel = GridPanel(f"{cell}x{cell} px cells of the {img.resized[1]}x{img.resized[0]} resized image",
                          (rows, cols), (0.0, 0.0, float(w), float(h)), np.arange(n, dtype=np.int64))
        return VisionInputs(feeds, n, (panel,), {"grid_thw": img.grid_thw, "resized": img.resized,
                                                 "original": img.original})

    def image_span(self, outputs: dict, vision: VisionInputs, options: dict) -> ImageSpan:
        """image_features [n, d] -> rows, every row a candidate; visual_extra.k [n, d] (the DeepStack levels, the
        same rows in the same order) -> extras."""
        n = vision.num_candidates
        for name in ["image_features", *self.extras]:
            got = outputs[name]
            if got.ndim != 2 or got.shape[0] != n:
                raise ValueError(f"vision graph returned {name} {list(got.shape)}, expected [{n}, d]")
        return ImageSpan(outputs["image_features"], np.arange(n, dtype=np.int64),
                         extras={name: outputs[name] for name in self.extras})

    def native_positions(self, layout, visions) -> np.ndarray:
        """int64 [3, L]: get_rope_index's positions of the full native sequence (visions: the images in order)."""
        visions = [visions] if isinstance(visions, VisionInputs) else list(visions)
        return native_positions(layout.input_ids, [self.image_token_id], [v.facts["grid_thw"] for v in visions],
                                self.merge)

    def pruned_positions(self, native: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """int64 [3, L']: kept rows keep their native positions (no re-packing)."""
        return np.ascontiguousarray(np.asarray(native)[:, np.asarray(rows, dtype=np.int64)])

    def decode_position(self, native: np.ndarray, pruned: np.ndarray, step: int) -> np.ndarray:
        """int64 [3]: max(native) + 1 + step, where the token sits without pruning."""
        return decode_position(native, step)
