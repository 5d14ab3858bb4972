"""Qwen2.5-VL's run-time rules (numpy only): dynamic resolution, host-side window tables, every merger output a
candidate, native M-RoPE positions (rank 3)."""

from __future__ import annotations

import numpy as np

from coverpruner.families.contract import VisionInputs
from coverpruner.families.qwen_vl import QwenImageSettings, native_positions
from coverpruner.families.qwen_vl_base import IMAGE_TOKEN, VIDEO_TOKEN, QwenVLRuntime
from coverpruner.families.qwen2_5_vl.video import (DEFAULT_MAX_VIDEO_FRAMES, preprocess_qwen_video, sampled_frames,
                                                   video_cost)
from coverpruner.families.qwen2_5_vl.vision import temporal_chunks, vision_inputs

__all__ = ["IMAGE_TOKEN", "VIDEO_TOKEN", "QwenRuntime"]

#: temporal patches (frame pairs) per vision run of a video: 1 keeps a video's vision peak at one frame pair's
VIDEO_CHUNK_TEMPORAL = 1


class QwenRuntime(QwenVLRuntime):
    """Qwen2.5-VL's run-time rules for one engine dir (contract.FamilyRuntime): dynamic resolution, host-side
    window tables, every merger output a candidate, native M-RoPE positions (rank 3; qwen_vl_base.QwenVLRuntime)."""

    def __init__(self, manifest):
        super().__init__(manifest)
        self.settings = QwenImageSettings.from_dict(manifest.processor)
        dims = manifest.dims
        self.merge, self.window, self.patch = (int(dims["spatial_merge_size"]), int(dims["window_size"]),
                                               int(dims["patch_size"]))
        # video needs the video token and tokens_per_second (engine dirs exported before video lack them)
        video_id, self.tokens_per_second = manifest.token_ids.get("video_token_id"), dims.get("tokens_per_second")
        if video_id is not None and self.tokens_per_second is not None:
            self.video_token, self.video_token_id = VIDEO_TOKEN, int(video_id)

    def prepare_image(self, image, options: dict) -> VisionInputs:
        """Vision feeds (VISION_INPUTS; pixel_values [N, 1176] in the graph's float dtype), n = gh*gw/merge^2,
        and one picture panel: the merged-patch grid (28x28 px cells of the resized image), which covers the
        whole original image (the resize keeps everything)."""
        img = self.image(image, options)
        feeds = vision_inputs(img.pixel_values.astype(self.float_dtype, copy=False), img.grid_thw, self.merge,
                              self.window, self.patch)
        panel = self.grid_panel(img.grid_thw, img.resized, img.original, "resized image")
        return VisionInputs(feeds, img.num_visual_tokens, (panel,),
                            {"grid_thw": img.grid_thw, "resized": img.resized, "original": img.original})

    def video_cost(self, video, options: dict):
        """contract.FamilyRuntime.video_cost: the header's geometry through this family's sampling and resize
        rules (qwen2_5_vl/video.video_cost)."""
        if self.video_token is None:
            return None  # prepare_video refuses it in one line
        limit = options.get("max_video_frames") or DEFAULT_MAX_VIDEO_FRAMES
        return video_cost(video, self.settings, limit, where=video.where)

    def prepare_video(self, video, options: dict) -> VisionInputs:
        """A coverpruner.video.VideoInput -> vision feeds of its temporal patches (the same graph as images: full
        attention within each temporal patch, windows per temporal patch), n = t*gh*gw/merge^2, one picture panel
        (the merged grid of the first temporal patch). Facts: kind "video", grid_thw, num_frames,
        second_per_grid_t, time_interval (tokens_per_second * second_per_grid_t in float32, the M-RoPE temporal
        step). ValueError when this engine dir lacks the video facts."""
        if self.video_token is None:
            raise ValueError("this engine dir has no video token / tokens_per_second in its manifest; re-export it "
                             "to take video")
        limit = options.get("max_video_frames") or DEFAULT_MAX_VIDEO_FRAMES
        vid = preprocess_qwen_video(video, self.settings, limit, where=video.where)
        pixels = vid.pixel_values.astype(self.float_dtype, copy=False)
        feeds = vision_inputs(pixels, vid.grid_thw, self.merge, self.window, self.patch)
        # one temporal patch per vision run: peak memory of one frame pair whatever the frame count (docs/video.md)
        chunks = temporal_chunks(pixels, vid.grid_thw, self.merge, self.window, self.patch, VIDEO_CHUNK_TEMPORAL)
        panel = self.grid_panel(vid.grid_thw, vid.resized, vid.original,
                                f"frames (temporal patch 0 of {vid.grid_thw[0]})")
        interval = np.float32(np.float32(self.tokens_per_second) * np.float32(vid.second_per_grid_t))
        return VisionInputs(feeds, vid.num_visual_tokens, (panel,),
                            {"kind": "video", "grid_thw": vid.grid_thw, "resized": vid.resized,
                             "original": vid.original, "num_frames": vid.num_frames,
                             "second_per_grid_t": vid.second_per_grid_t, "time_interval": float(interval)},
                            chunks)

    def sampled_frames(self, video, options: dict) -> list:
        """A VideoInput -> its sampled frames (uint8 [H, W, 3] each, padded to an even count), for the picture."""
        return sampled_frames(video, options.get("max_video_frames") or DEFAULT_MAX_VIDEO_FRAMES, video.where)

    def native_positions(self, layout, visions) -> np.ndarray:
        """int64 [3, L]: HF get_rope_index's positions for the full native sequence (visions: the images and
        videos in order, or one VisionInputs)."""
        visions = [visions] if isinstance(visions, VisionInputs) else list(visions)
        return native_positions(layout.input_ids, self.visual_ids(), [v.facts["grid_thw"] for v in visions],
                                self.merge, [v.facts.get("time_interval") for v in visions])
