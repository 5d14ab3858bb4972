"""Qwen3-VL video preprocessing in numpy/PIL, torch-free: transformers' Qwen3VLVideoProcessor and the
Qwen3VLProcessor's timestamped layout, which Qwen3.5 checkpoints use as they are (rules re-stated from
transformers 5.24, no code taken).

* A video FILE is sampled at ``fps`` (default the checkpoint's, 2.0): n = int(total / video_fps * fps), clamped to
  [min_frames (4), max_frames (768)] and to total; the frames taken are round(linspace(0, total - 1, n)).
  ``max_frames`` of the request replaces the upper bound. A frame LIST is taken whole; ``fps`` (default 2.0) says
  how far apart its frames were taken (HF falls back to 24 fps with a warning when it has no rate).
* Every frame is resized to one size: the video smart resize, whose pixel limits bound the WHOLE clip
  (t_bar * H * W within [shortest_edge, longest_edge] of video_preprocessor_config.json's size, t_bar = the frame
  count rounded to an even number; a side shorter than 32 px is first scaled up), sides multiples of 32 px; PIL
  bicubic (HF: torchvision's antialiased bicubic, a few grey levels apart; frames already at the size are kept).
* Rescale and normalize as an image, pad with the last frame to an even count, cut into temporal patches of 2
  frames: grid_thw = (F / 2, H / 16, W / 16), patches in merge-block-major order per temporal patch.
* Timestamps: frame k was taken at index_k / fps seconds (indices padded like the frames); temporal patch j is
  stamped with the mean of its first and last frame's time, written f"<{t:.1f} seconds>". The chat template's
  video placeholder becomes, per temporal patch, "<t seconds><|vision_start|><|video_pad|>*(gh*gw/4)<|vision_end|>"
  (so each temporal patch is its own visual run for get_rope_index).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coverpruner.errors import VideoError
from coverpruner.families.qwen3_preprocess import Qwen3ImageSettings
from coverpruner.families.qwen_vl import (QwenImage, frame_list, frame_size, normalize, patchify, pixel_limits,
                                          probe_header, read_frames, resize_rgb, sample_indices, smart_resize,
                                          video_tokens)
from coverpruner.families.qwen_vl_base import VIDEO_TOKEN
from coverpruner.video import VideoCost, VideoInput

#: frames per video a request may hold when neither the request nor the manifest says (option max_video_frames)
DEFAULT_MAX_VIDEO_FRAMES = 64


@dataclass(frozen=True)
class Qwen3VideoSettings:
    """video_preprocessor_config.json's fields that matter (HF reads preprocessor_config.json's size when the
    checkpoint has no video config; defaults: Qwen3VLVideoProcessor's)."""

    # transformers 5.24 models/qwen3_vl/video_processing_qwen3_vl.py, class Qwen3VLVideoProcessor: size
    # {"shortest_edge": 128*32*32, "longest_edge": 32*32*768}, fps 2, min_frames 4, max_frames 768. (The
    # Qwen3-VL-*-Instruct checkpoints' own video_preprocessor_config.json sets size {4096, 25165824}; from_dict reads
    # it from the checkpoint.)
    min_pixels: int = 128 * 32 * 32
    max_pixels: int = 768 * 32 * 32
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768

    @classmethod
    def from_dict(cls, d: dict) -> "Qwen3VideoSettings":
        kw = pixel_limits(d)
        for key in ("min_frames", "max_frames"):
            if d.get(key) is not None:
                kw[key] = int(d[key])
        if d.get("fps") is not None:
            kw["fps"] = float(d["fps"])
        return cls(**kw)

    def to_dict(self) -> dict:
        return {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels, "fps": self.fps,
                "min_frames": self.min_frames, "max_frames": self.max_frames}


@dataclass(frozen=True)
class Qwen3Video(QwenImage):
    """qwen_vl.QwenImage's pixel_values [t*gh*gw, C*T*P*P], grid_thw (t, gh, gw), resized / original (H, W), plus
    num_frames after padding (t*T), timestamps: seconds of each temporal patch [t], and the fps they were computed
    with."""

    num_frames: int = 0
    timestamps: tuple[float, ...] = ()
    fps: float = 0.0


def video_smart_resize(num_frames: int, height: int, width: int, factor: int, min_pixels: int,
                       max_pixels: int, temporal: int = 2) -> tuple[int, int]:
    """(H, W) of every frame (module doc): a side shorter than ``factor`` first scaled up, then qwen_vl.smart_resize
    bounding t_bar * H * W within [min_pixels, max_pixels]. ValueError (one line) for an aspect ratio above 200."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    return smart_resize(height, width, factor, min_pixels, max_pixels, num_frames, temporal)


def sample_count(total: int, video_fps: float, fps: float, v: Qwen3VideoSettings, max_frames: int | None) -> int:
    """Frames taken from a file of ``total`` frames at ``video_fps`` (module doc)."""
    n = int(total / video_fps * fps)
    return min(max(n, v.min_frames), v.max_frames if max_frames is None else int(max_frames), total)


def timestamps(indices, fps: float, temporal: int = 2) -> tuple[float, ...]:
    """Seconds of each temporal patch: indices padded with the last to a multiple of ``temporal``, index / fps,
    the mean of each patch's first and last."""
    idx = [int(i) for i in indices]
    idx += [idx[-1]] * (-len(idx) % temporal)
    secs = [i / fps for i in idx]
    return tuple((secs[k] + secs[k + temporal - 1]) / 2 for k in range(0, len(secs), temporal))


def placeholder(stamps, rows_per_patch: int, video_token: str = VIDEO_TOKEN) -> str:
    """The text a video's placeholder becomes (module doc)."""
    return "".join(f"<{t:.1f} seconds><|vision_start|>{video_token * rows_per_patch}<|vision_end|>" for t in stamps)


def _sampled(video: VideoInput, total: int, video_fps: float, v: Qwen3VideoSettings, limit: int, where: str) -> int:
    fps = v.fps if video.fps is None else float(video.fps)
    n = sample_count(total, video_fps, fps, v, video.max_frames)
    if n > limit:
        raise VideoError(f"{where}: samples {n} frames ({total} at {video_fps:g} fps, fps {fps:g}); at most {limit} "
                         "per video (max_video_frames; lower fps or max_frames)")
    return n


def _frames(video: VideoInput, v: Qwen3VideoSettings, limit: int, where: str):
    """(uint8 RGB frames, the frame indices, the rate the indices count at)."""
    if video.is_frames:
        rgb = frame_list(video, limit, where)
        return rgb, np.arange(len(rgb)), v.fps if video.fps is None else float(video.fps)
    box = {}

    def pick(total: int, video_fps: float):
        box["idx"] = sample_indices(total, _sampled(video, total, video_fps, v, limit, where))
        return box["idx"]

    frames, rate = read_frames(video, pick, where)
    return frames, box["idx"], rate


def video_cost(video: VideoInput, s: Qwen3ImageSettings, v: Qwen3VideoSettings, limit: int = DEFAULT_MAX_VIDEO_FRAMES,
               where: str = "video") -> VideoCost | None:
    """What a video FILE costs from its header alone (no frame decoded); None for a frame list. VideoError (one
    line) for an unreadable header or more than ``limit`` frames."""
    if video.is_frames:
        return None
    header = probe_header(video, where)
    n = (_sampled(video, header.frames, header.fps, v, limit, where) if header.frames > 0
         else limit if video.max_frames is None else min(video.max_frames, limit))
    try:
        size = video_smart_resize(n, header.height, header.width, s.factor, v.min_pixels, v.max_pixels)
    except (ValueError, ZeroDivisionError) as exc:
        raise VideoError(f"{where}: frames {header.width}x{header.height}: {exc}") from None
    n += n % s.temporal_patch_size
    return VideoCost(n, header.height, header.width, video_tokens(n, size, s))


def sampled_frames(video: VideoInput, v: Qwen3VideoSettings, limit: int = DEFAULT_MAX_VIDEO_FRAMES,
                   where: str = "video") -> list[np.ndarray]:
    """The frames the model sees before resizing (uint8 [H, W, 3]), padded with the last to an even count."""
    frames = _frames(video, v, limit, where)[0]
    return frames + [frames[-1]] * (len(frames) % 2)


def preprocess_video(video: VideoInput, s: Qwen3ImageSettings, v: Qwen3VideoSettings,
                     limit: int = DEFAULT_MAX_VIDEO_FRAMES, where: str = "video") -> Qwen3Video:
    """A video content part -> Qwen3Video (module doc). VideoError (one line, starting with ``where``) for
    unreadable frames or files, frames of different sizes, a bad fps or more than ``limit`` frames."""
    frames, indices, fps = _frames(video, v, limit, where)
    h, w = frame_size(frames, fps, where)
    try:
        size = video_smart_resize(len(frames), h, w, s.factor, v.min_pixels, v.max_pixels, s.temporal_patch_size)
    except ValueError as exc:
        raise VideoError(f"{where}: frames {w}x{h}: {exc}") from None
    x = normalize(np.stack([resize_rgb(f, size, s.resample) for f in frames]).transpose(0, 3, 1, 2), s)
    patches, grid = patchify(x, s)  # pads with the last frame to an even count
    return Qwen3Video(patches, grid, size, (h, w), num_frames=grid[0] * s.temporal_patch_size,
                      timestamps=timestamps(indices, fps, s.temporal_patch_size), fps=fps)
