"""Qwen2.5-VL video preprocessing in numpy/PIL, torch-free: frame sampling, frame size, temporal patches.

Sampling follows Qwen's own utilities (qwen-vl-utils, vision_process.py; the rules re-stated here, no code taken):

* A video FILE is sampled at ``fps`` (default FPS = 2.0) frames per second: nframes = total / video_fps * fps, clamped
  to [FPS_MIN_FRAMES = 4 rounded up to even, min(FPS_MAX_FRAMES = 768, total) rounded down to even] (``max_frames``
  replaces that upper bound) and to total, then rounded down to a multiple of FRAME_FACTOR = 2. Fewer than 2 frames
  is an error. The frames taken are round(linspace(0, total - 1, nframes)); the sampled rate is
  nframes / total * video_fps. Every frame is resized to one size: smart resize (28-px multiples) with the per-frame
  pixel budget min_pixels = VIDEO_MIN_PIXELS = 128*28*28, max_pixels = max(min(VIDEO_MAX_PIXELS = 768*28*28,
  VIDEO_TOTAL_PIXELS / nframes * FRAME_FACTOR), 1.05 * min_pixels), VIDEO_TOTAL_PIXELS = 128000*28*28*0.9; both
  clamped into the checkpoint's image limits (its preprocessor_config min/max pixels), which a small checkpoint
  sets lower than Qwen's video defaults.
* A LIST of frames is taken whole (no sampling), each frame sized like an image (the checkpoint's min/max pixels),
  padded by repeating the last frame to an even count; ``fps`` (default 2.0) says how far apart they were taken.
  All frames must be the same size.

Then as transformers' Qwen2VL video processor: rescale / normalize as an image, pad to a multiple of
temporal_patch_size (2) with the last frame, and cut [t, 2, C, H, W] into patches [t*gh*gw, C*2*14*14] in
merge-block-major order per temporal patch: video_grid_thw = (nframes / 2, H / 14, W / 14) and
second_per_grid_t = temporal_patch_size / fps (the sampled fps), which M-RoPE spaces temporal positions by.
Frames are resized with PIL bicubic like images (qwen-vl-utils resizes with torchvision's antialiased bicubic, a few
grey levels apart); frames already at the target size are not resized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from coverpruner.errors import VideoError
from coverpruner.families.qwen_vl import (QwenImage, QwenImageSettings, frame_list, frame_size, normalize, patchify,
                                          probe_header, read_frames, resize_rgb, sample_indices, smart_resize,
                                          video_tokens)
from coverpruner.video import VideoCost, VideoInput

FPS = 2.0
FRAME_FACTOR = 2
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28
VIDEO_TOTAL_PIXELS = int(128000 * 28 * 28 * 0.9)
#: frames per video a request may hold when neither the request nor the manifest says (option max_video_frames)
DEFAULT_MAX_VIDEO_FRAMES = 64

__all__ = ["DEFAULT_MAX_VIDEO_FRAMES", "FRAME_FACTOR", "QwenVideo", "file_pixel_limits", "preprocess_qwen_video",
           "sample_count", "sample_indices", "sampled_frames", "video_cost"]


@dataclass(frozen=True)
class QwenVideo(QwenImage):
    """One preprocessed video: qwen_vl.QwenImage's pixel_values [t*gh*gw, C*T*P*P] (T = temporal_patch_size),
    grid_thw (t, gh, gw), resized (H, W) of every frame and original (H, W) of the input frames, plus num_frames:
    frames after sampling and padding (= t*T) and second_per_grid_t: seconds one temporal patch spans (T / fps)."""

    num_frames: int = 0
    second_per_grid_t: float = 0.0


def _ceil(x: float, f: int) -> int:
    return math.ceil(x / f) * f


def _floor(x: float, f: int) -> int:
    return math.floor(x / f) * f


def sample_count(total: int, video_fps: float, fps: float | None = None, max_frames: int | None = None) -> int:
    """Frames to take from a file of ``total`` frames at ``video_fps`` (qwen-vl-utils' smart_nframes, module doc).
    VideoError when fewer than FRAME_FACTOR frames result."""
    fps = FPS if fps is None else float(fps)
    lo = _ceil(FPS_MIN_FRAMES, FRAME_FACTOR)
    hi = _floor(max_frames if max_frames is not None else min(FPS_MAX_FRAMES, total), FRAME_FACTOR)
    n = total / video_fps * fps
    n = _floor(min(min(max(n, lo), hi), total), FRAME_FACTOR)
    if not FRAME_FACTOR <= n <= total:
        raise VideoError(f"video of {total} frames at {video_fps:g} fps gives {n} frames at fps {fps:g} and "
                         f"max_frames {max_frames}; at least {FRAME_FACTOR} are needed")
    return n


def file_pixel_limits(nframes: int, s: QwenImageSettings) -> tuple[int, int]:
    """(min_pixels, max_pixels) of one frame of a file sampled to ``nframes`` (module doc), clamped into the
    checkpoint's image limits."""
    lo = VIDEO_MIN_PIXELS
    hi = max(min(VIDEO_MAX_PIXELS, VIDEO_TOTAL_PIXELS / nframes * FRAME_FACTOR), int(lo * 1.05))
    hi = min(max(hi, s.min_pixels), s.max_pixels)
    lo = min(max(lo, s.min_pixels), hi)
    return int(lo), int(hi)


def _sampled(video: VideoInput, total: int, video_fps: float, max_video_frames: int, where: str) -> int:
    """sample_count of a file of ``total`` frames; VideoError (one line) above max_video_frames."""
    n = sample_count(total, video_fps, video.fps, video.max_frames)
    if n > max_video_frames:
        raise VideoError(f"{where}: samples {n} frames ({total} at {video_fps:g} fps, fps "
                         f"{FPS if video.fps is None else video.fps:g}); at most {max_video_frames} per video "
                         "(max_video_frames; lower fps or max_frames)")
    return n


def video_cost(video: VideoInput, s: QwenImageSettings, max_video_frames: int = DEFAULT_MAX_VIDEO_FRAMES,
               where: str = "video") -> VideoCost | None:
    """What a video FILE will cost, from its header only (coverpruner.video.probe_video: no frame decoded): the
    frames sample_count takes (max_video_frames when the header states neither a frame count nor a duration, the
    most decoding may keep), padded to an even count, each resized by file_pixel_limits and smart_resize ->
    (n / T) x (H / factor) x (W / factor) tokens, as preprocess_qwen_video gives them. None for a frame list (its
    frames are decoded already). VideoError (one line, starting with ``where``) for an unreadable header or more
    than max_video_frames frames."""
    if video.is_frames:
        return None
    header = probe_header(video, where)
    if header.frames > 0:
        n = _sampled(video, header.frames, header.fps, max_video_frames, where)
    else:
        n = max_video_frames if video.max_frames is None else min(video.max_frames, max_video_frames)
    n = _ceil(n, s.temporal_patch_size)
    lo, hi = file_pixel_limits(n, s)
    try:
        size = smart_resize(header.height, header.width, s.factor, lo, hi)
    except (ValueError, ZeroDivisionError) as exc:
        raise VideoError(f"{where}: frames {header.width}x{header.height}: {exc}") from None
    return VideoCost(n, header.height, header.width, video_tokens(n, size, s))


def _frames(video: VideoInput, max_video_frames: int, where: str) -> tuple[list[np.ndarray], float, tuple | None]:
    """(uint8 RGB frames, fps for second_per_grid_t, "file" or None for the image limits)."""
    if video.is_frames:
        return frame_list(video, max_video_frames, where), FPS if video.fps is None else float(video.fps), None
    box = {}

    def pick(total: int, video_fps: float):
        n = _sampled(video, total, video_fps, max_video_frames, where)
        box["fps"] = n / max(total, 1e-6) * video_fps
        return sample_indices(total, n)

    frames, _ = read_frames(video, pick, where)
    return frames, box["fps"], "file"


def sampled_frames(video: VideoInput, max_video_frames: int = DEFAULT_MAX_VIDEO_FRAMES,
                   where: str = "video") -> list[np.ndarray]:
    """The frames the model sees, before resizing: uint8 [H, W, 3] each, sampled from a file by the rules above (a
    frame list taken whole) and padded with the last frame to an even count, as preprocess_qwen_video pads them.
    What the video selection picture draws (runtime/visualize.draw_video_selection)."""
    frames = _frames(video, max_video_frames, where)[0]
    return frames + [frames[-1]] * (_ceil(len(frames), FRAME_FACTOR) - len(frames))


def preprocess_qwen_video(video: VideoInput, s: QwenImageSettings, max_video_frames: int = DEFAULT_MAX_VIDEO_FRAMES,
                          where: str = "video") -> QwenVideo:
    """A video content part -> QwenVideo (module doc). VideoError (one line, starting with ``where``) for unreadable
    frames or files, frames of different sizes, or more than ``max_video_frames`` frames."""
    frames, fps, source = _frames(video, max_video_frames, where)
    h, w = frame_size(frames, fps, where)
    nframes = _ceil(len(frames), FRAME_FACTOR)
    lo, hi = file_pixel_limits(nframes, s) if source == "file" else (s.min_pixels, s.max_pixels)
    try:
        size = smart_resize(h, w, s.factor, lo, hi)
    except ValueError as exc:
        raise VideoError(f"{where}: frames {w}x{h}: {exc}") from None
    frames = [resize_rgb(f, size, s.resample) for f in frames]
    frames += [frames[-1]] * (nframes - len(frames))  # an even count, as qwen-vl-utils
    x = normalize(np.stack(frames).transpose(0, 3, 1, 2), s)  # [F, C, H, W]
    patches, grid = patchify(x, s)
    return QwenVideo(patches, grid, size, (h, w), num_frames=grid[0] * s.temporal_patch_size,
                     second_per_grid_t=s.temporal_patch_size / fps)
