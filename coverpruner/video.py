"""Video input shared by every layer: the video content part's value, and decoding video files with PyAV.

A video reaches a family as a `VideoInput` (runtime/messages.py builds it from a content part
``{"type": "video", "video": V, "fps": float, "max_frames": int}``): V is a list of frames (each a path, a PIL image
or a uint8 [H, W, 3] array), a local video file path, or ``bytes`` (an encoded video file's content, what the server
hands over after decoding a data: URL). Sampling frames is the family's rule (Qwen2.5-VL: families/qwen2_5_vl/video.py).

`read_video` decodes a file or bytes with PyAV (the FFmpeg binding; the optional extra ``coverpruner[video]``),
imported lazily so that nothing else pays for it. Every failure is one VideoError line.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from coverpruner.errors import VideoError

__all__ = ["DEFAULT_MAX_VIDEO_PIXELS", "VIDEO_DEMUXERS", "VideoCost", "VideoHeader", "VideoInput", "read_video", "probe_video", "describe"]

#: FFmpeg demuxers a video may be opened with (PyAV's format_whitelist): video containers only. Left to probe
#: freely, FFmpeg also takes script formats: an "ffconcat" file reads other files relative to the working
#: directory, and an image would pass as a one-frame video.
VIDEO_DEMUXERS = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi,mpegts,flv,ogg,mpeg"

#: Most decoded pixels one video may hold after sampling (frames x height x width; x 3 bytes as RGB): 2**27 is
#: 64 frames of 1456x1440, ~400 MB of frames. Pipeline.max_video_pixels; the server's --max-video-pixels.
DEFAULT_MAX_VIDEO_PIXELS = 2 ** 27


@dataclass(frozen=True)
class VideoInput:
    """One video content part. video: list of frames | str/Path of a video file | bytes of one.
    fps: frames per second to sample a file at (None: the family's default), or the rate a frame list was
    taken at. max_frames: the most frames to sample from a file (None: the family's default). where: how errors
    name the part (runtime/messages.py sets "messages[i].content[j]")."""

    video: object
    fps: float | None = None
    max_frames: int | None = None
    where: str = "video"

    @property
    def is_frames(self) -> bool:
        return isinstance(self.video, (list, tuple))


@dataclass(frozen=True)
class VideoHeader:
    """What a video file's container and codec headers state, before any frame is decoded: frames (the stated
    count, else duration x rate rounded up; 0 when neither is stated), fps (average rate), height, width (px)."""

    frames: int
    fps: float
    height: int
    width: int


@dataclass(frozen=True)
class VideoCost:
    """What a video will cost, from its header alone (FamilyRuntime.video_cost): frames the model sees after the
    family's sampling and padding, each decoded at height x width px (the header's size),
    visual_tokens in all. decoded_pixels = frames x height x width: the RGB frames decoding holds (x 3 bytes),
    which --max-video-pixels bounds."""

    frames: int
    height: int
    width: int
    visual_tokens: int

    @property
    def decoded_pixels(self) -> int:
        return self.frames * self.height * self.width


def probe_video(source: str | Path | bytes) -> VideoHeader:
    """The header geometry of a video file (path) or an encoded file's bytes; no frame is decoded, so its cost
    does not grow with the frames' size or count (admission checks use it). VideoError (one line) as read_video."""
    where = describe(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        return _header(lambda: io.BytesIO(data), where)
    if not Path(source).is_file():
        raise VideoError(f"video not found: {source}")
    return _header(lambda: str(source), where)


def describe(source) -> str:
    """How an error names a video source: its path, or 'video (N bytes)'."""
    return str(source) if isinstance(source, (str, os.PathLike)) else f"video ({len(source)} bytes)"


def _av():
    try:
        import av  # noqa: PLC0415 (optional extra, imported on first use)
    except ImportError:
        raise VideoError("reading video files needs PyAV: pip install 'coverpruner[video]'") from None
    return av


def read_video(source: str | Path | bytes,
               pick: Callable[[int, float], Sequence[int]] | None = None) -> tuple[list[np.ndarray], float]:
    """Decode a video file (path) or an encoded file's bytes -> (frames: list of uint8 [H, W, 3] RGB arrays, fps).

    pick(total_frames, fps) -> frame indices: when given, only those frames are converted to RGB arrays and kept
    (one decoding pass when the container states its frame count and that count is right, else a second pass once
    the real count is known), so memory holds the sampled frames only. fps is the stream's average rate.
    VideoError (one line) for a missing file, data FFmpeg cannot decode, no video stream, no frames or no rate.
    """
    where = describe(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)

        def target():
            return io.BytesIO(data)
    elif isinstance(source, (str, os.PathLike)):
        if not Path(source).is_file():
            raise VideoError(f"video not found: {source}")

        def target():
            return str(source)
    else:
        raise VideoError(f"video must be a file path, bytes or a list of frames, got {type(source).__name__}")
    stated, fps = _probe(target, where)
    if pick is None:
        frames, _ = _decode(target, where, None)
        return frames, fps
    if stated > 0:
        wanted = [int(i) for i in pick(stated, fps)]
        frames, count = _decode(target, where, wanted)
        if count == stated:
            return frames, fps
        stated = count  # the container's count was wrong: pick again from the real one
    else:
        _, stated = _decode(target, where, [])
    if stated == 0:
        raise VideoError(f"{where}: the video has no frames")
    frames, _ = _decode(target, where, [int(i) for i in pick(stated, fps)])
    return frames, fps


def _probe(target, where: str) -> tuple[int, float]:
    """(frame count the container states, 0 when unknown; average frame rate) of the first video stream."""
    header = _header(target, where, stated_only=True)
    return header.frames, header.fps


def _header(target, where: str, stated_only: bool = False) -> VideoHeader:
    """The first video stream's VideoHeader; stated_only: frames is the container's stated count (0 if none)."""
    av = _av()
    try:
        with av.open(target(), mode="r", options={"format_whitelist": VIDEO_DEMUXERS}) as container:
            if not container.streams.video:
                raise VideoError(f"{where}: no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            stated = int(stream.frames or 0)
            height, width = int(stream.codec_context.height or 0), int(stream.codec_context.width or 0)
            seconds = (float(stream.duration * stream.time_base) if stream.duration and stream.time_base else
                       container.duration / av.time_base if container.duration else 0.0)
    except VideoError:
        raise
    except (av.FFmpegError, ValueError, OSError, EOFError) as exc:  # av.error.InvalidDataError is an FFmpegError
        raise VideoError(f"{where}: cannot decode the video ({type(exc).__name__}: {str(exc).splitlines()[0]})") \
            from None
    fps = float(rate) if rate else 0.0
    if not fps > 0:
        raise VideoError(f"{where}: the video stream has no frame rate")
    if not stated_only and stated == 0 and seconds > 0:
        stated = math.ceil(seconds * fps)
    return VideoHeader(stated, fps, height, width)


def _decode(target, where: str, wanted: Sequence[int] | None) -> tuple[list[np.ndarray], int]:
    """Decode every frame; (RGB arrays of the frames at ``wanted`` in that order, every frame when None; the number
    of frames decoded)."""
    av = _av()
    keep = None if wanted is None else set(wanted)
    got, count = {}, 0
    try:
        with av.open(target(), mode="r", options={"format_whitelist": VIDEO_DEMUXERS}) as container:
            for k, frame in enumerate(container.decode(container.streams.video[0])):
                if keep is None or k in keep:
                    got[k] = frame.to_ndarray(format="rgb24")
                count = k + 1
    except (av.FFmpegError, ValueError, OSError, EOFError) as exc:
        raise VideoError(f"{where}: cannot decode the video ({type(exc).__name__}: {str(exc).splitlines()[0]})") \
            from None
    if count == 0:
        raise VideoError(f"{where}: the video has no frames")
    order = range(count) if wanted is None else wanted
    missing = [i for i in order if i not in got]
    if missing:
        return [], count  # the caller picked from a wrong stated count and decodes again
    return [got[i] for i in order], count
