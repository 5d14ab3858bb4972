"""Qwen3-VL's run-time rules (numpy only): dynamic resolution at 32 px per visual token, host-side position-grid
interpolation tables, every merger output a candidate with its DeepStack rows as decoder extras, native M-RoPE
positions (rank 3), videos as timestamped temporal patches (video.py)."""

from __future__ import annotations

import numpy as np

from coverpruner.families.contract import VisionInputs
from coverpruner.families.qwen_vl import native_positions
from coverpruner.families.qwen_vl_base import IMAGE_TOKEN, VIDEO_TOKEN, QwenVLRuntime
from coverpruner.families.qwen3_vl.preprocess import Qwen3ImageSettings
from coverpruner.families.qwen3_vl.video import (DEFAULT_MAX_VIDEO_FRAMES, Qwen3VideoSettings, placeholder,
                                                 preprocess_video, sampled_frames, video_cost)
from coverpruner.families.qwen3_vl.vision import vision_inputs

__all__ = ["IMAGE_TOKEN", "Qwen3VLRuntime", "extra_names"]


def extra_names(levels: int) -> list[str]:
    """The decoder-extra names of ``levels`` DeepStack levels (graph outputs of vision.onnx, inputs of the
    decoder): visual_extra.0, visual_extra.1, ..."""
    return [f"visual_extra.{k}" for k in range(levels)]


class Qwen3VLRuntime(QwenVLRuntime):
    """contract.FamilyRuntime for a Qwen3-VL engine dir (the shared Qwen rules: qwen_vl_base.QwenVLRuntime)."""

    def __init__(self, manifest):
        super().__init__(manifest)
        self.settings = Qwen3ImageSettings.from_dict(manifest.processor)
        dims = manifest.dims
        self.merge, self.patch = int(dims["spatial_merge_size"]), int(dims["patch_size"])
        self.num_position_embeddings = int(dims["num_position_embeddings"])
        self.extras = tuple(extra_names(int(dims["deepstack_levels"])))
        self.video_settings = Qwen3VideoSettings.from_dict(manifest.processor.get("video") or {})
        video_id = manifest.token_ids.get("video_token_id")
        if video_id is not None:
            self.video_token, self.video_token_id = VIDEO_TOKEN, int(video_id)

    def prepare_image(self, image, options: dict) -> VisionInputs:
        """Vision feeds (VISION_INPUTS; pixel_values [N, 1536] in the graph's float dtype), n = gh*gw/4, and one
        picture panel: the merged-patch grid (32x32 px cells of the resized image) over the whole image."""
        img = self.image(image, options)
        feeds = vision_inputs(img.pixel_values.astype(self.float_dtype, copy=False), img.grid_thw, self.merge,
                              self.num_position_embeddings)
        panel = self.grid_panel(img.grid_thw, img.resized, img.original, "resized image")
        return VisionInputs(feeds, img.num_visual_tokens, (panel,),
                            {"grid_thw": img.grid_thw, "resized": img.resized, "original": img.original})

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
        panel = self.grid_panel(vid.grid_thw, vid.resized, vid.original,
                                f"frames (temporal patch 0 of {vid.grid_thw[0]})")
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

    def native_positions(self, layout, visions) -> np.ndarray:
        """int64 [3, L]: get_rope_index's positions of the full native sequence (visions: the images and videos in
        order); a video of t temporal patches is t runs of grid (1, gh, gw), one per timestamped span."""
        visions = [visions] if isinstance(visions, VisionInputs) else list(visions)
        grids = [(1, g[1], g[2]) for v in visions for g in [v.facts["grid_thw"]] for _ in range(g[0])]
        return native_positions(layout.input_ids, self.visual_ids(), grids, self.merge)  # t = 1: temporal 0
