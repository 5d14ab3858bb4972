"""Qwen3-VL's run-time rules (numpy only): dynamic resolution at 32 px per visual token, host-side position-grid
interpolation tables, every merger output a candidate with its DeepStack rows as decoder extras, native M-RoPE
positions (rank 3), videos as timestamped temporal patches (video.py)."""

from __future__ import annotations

import numpy as np

from coverpruner.families.contract import GridPanel, ImageSpan, VisionInputs
from coverpruner.families.hf import HFRuntime
from coverpruner.families.qwen3_vl.positions import decode_position, native_positions
from coverpruner.families.qwen3_vl.preprocess import Qwen3ImageSettings, preprocess_image
from coverpruner.families.qwen3_vl.video import (DEFAULT_MAX_VIDEO_FRAMES, VIDEO_TOKEN, Qwen3VideoSettings,
                                                 placeholder, preprocess_video, sampled_frames, video_cost)
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
        self.video_settings = Qwen3VideoSettings.from_dict(manifest.processor.get("video") or {})
        video_id = manifest.token_ids.get("video_token_id")
        if video_id is not None:
            self.video_token, self.video_token_id = VIDEO_TOKEN, int(video_id)

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

    def _limit(self, options: dict) -> int:
        return options.get("max_video_frames") or DEFAULT_MAX_VIDEO_FRAMES

    def video_cost(self, video, options: dict):
        """contract.FamilyRuntime.video_cost: the header's geometry through video.py's sampling and resize."""
        return video_cost(video, self.settings, self.video_settings, self._limit(options), where=video.where)

    def prepare_video(self, video, options: dict) -> VisionInputs:
        """A coverpruner.video.VideoInput -> vision feeds of its temporal patches (attention within each), n =
        t*gh*gw/4, one picture panel (the merged grid of temporal patch 0). Facts: kind "video", grid_thw,
        num_frames, second_per_grid_t (2 / fps), timestamps (seconds per temporal patch: the layout's text)."""
        vid = preprocess_video(video, self.settings, self.video_settings, self._limit(options), where=video.where)
        feeds = vision_inputs(vid.pixel_values.astype(self.float_dtype, copy=False), vid.grid_thw, self.merge,
                              self.num_position_embeddings)
        t, gh, gw = vid.grid_thw
        rows, cols = gh // self.merge, gw // self.merge
        h, w = vid.original
        cell = self.merge * self.patch
        panel = GridPanel(f"{cell}x{cell} px cells of the {vid.resized[1]}x{vid.resized[0]} frames (temporal patch 0 "
                          f"of {t})", (rows, cols), (0.0, 0.0, float(w), float(h)),
                          np.arange(rows * cols, dtype=np.int64))
        return VisionInputs(feeds, vid.num_visual_tokens, (panel,),
                            {"kind": "video", "grid_thw": vid.grid_thw, "resized": vid.resized,
                             "original": vid.original, "num_frames": vid.num_frames,
                             "second_per_grid_t": self.settings.temporal_patch_size / vid.fps,
                             "timestamps": vid.timestamps})

    def sampled_frames(self, video, options: dict) -> list:
        """A VideoInput -> its sampled frames (uint8 [H, W, 3] each, padded to an even count), for the picture."""
        return sampled_frames(video, self.video_settings, self._limit(options), video.where)

    def placeholder_text(self, token: str, rows: int, facts: dict) -> str:
        """An image: ``rows`` image tokens; a video: per temporal patch its timestamp and its vision span."""
        if facts.get("kind") != "video":
            return token * rows
        stamps = facts["timestamps"]
        return placeholder(stamps, rows // len(stamps), token)

    def image_span(self, outputs: dict, vision: VisionInputs, options: dict) -> ImageSpan:
        """image_features [n, d] -> rows, every row a candidate; visual_extra.k [n, d] (the DeepStack levels, the
        same rows in the same order) -> extras."""
        n = vision.num_candidates
        for name in ["image_features", *self.extras]:
            got = outputs[name]
            if got.ndim != 2 or got.shape[0] != n:
                raise ValueError(f"vision graph returned {name} {list(got.shape)}, expected [{n}, d]")
        temporal = None
        if vision.facts.get("kind") == "video":  # rows are temporal patch by temporal patch
            t = vision.facts["grid_thw"][0]
            temporal = np.repeat(np.arange(t, dtype=np.int64), n // t)
        return ImageSpan(outputs["image_features"], np.arange(n, dtype=np.int64), temporal=temporal,
                         extras={name: outputs[name] for name in self.extras})

    def native_positions(self, layout, visions) -> np.ndarray:
        """int64 [3, L]: get_rope_index's positions of the full native sequence (visions: the images and videos in
        order); a video of t temporal patches is t runs of grid (1, gh, gw), one per timestamped span."""
        visions = [visions] if isinstance(visions, VisionInputs) else list(visions)
        grids = [(1, g[1], g[2]) for v in visions for g in [v.facts["grid_thw"]] for _ in range(g[0])]
        ids = [self.image_token_id] + ([self.video_token_id] if self.video_token_id is not None else [])
        return native_positions(layout.input_ids, ids, grids, self.merge)

    def pruned_positions(self, native: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """int64 [3, L']: kept rows keep their native positions (no re-packing)."""
        return np.ascontiguousarray(np.asarray(native)[:, np.asarray(rows, dtype=np.int64)])

    def decode_position(self, native: np.ndarray, pruned: np.ndarray, step: int) -> np.ndarray:
        """int64 [3]: max(native) + 1 + step, where the token sits without pruning."""
        return decode_position(native, step)
