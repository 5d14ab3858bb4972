"""Turn a ``video_url`` part of a chat message into the encoded video's bytes, or a 400 naming the field.

Accepted as for images (serving.images.url_bytes): ``data:video/<subtype>;base64,...`` always; a local path or
``file://`` URL only with ``--allow-local-files``; ``http(s)://`` only with ``--allow-remote-images``. At most
``max_bytes`` (``--max-video-bytes``) from any source. The bytes are only probed here (PyAV opens the container
and finds a video stream: no frame is decoded); the frames are decoded and sampled by the pipeline
(coverpruner.video), which bounds their number with the request's ``max_frames``.
"""

from __future__ import annotations

import importlib.util
import io
import numbers

from coverpruner.serving.errors import APIError, bad_request
from coverpruner.video import VIDEO_DEMUXERS
from coverpruner.serving.images import REMOTE_TIMEOUT_S, url_bytes

#: Largest encoded video accepted from any source (bytes); --max-video-bytes. 64 MiB: a minute of 1080p H.264
#: at 8 Mbit/s; the request body limit grows to hold it as base64 on a server whose model takes video.
MAX_VIDEO_BYTES = 64 * 2 ** 20
_CONTAINERS = "mp4/mov, mkv/webm, avi, mpeg-ts, flv, ogg, mpeg-ps"


def load_video_url(url: str, param: str, allow_local_files: bool = False, allow_remote: bool = False,
                   max_bytes: int = MAX_VIDEO_BYTES, timeout_s: float = REMOTE_TIMEOUT_S) -> bytes:
    """url -> the encoded video file's bytes (probed, not decoded). Raises APIError(400) naming ``param``; 501
    before anything is read when PyAV is missing (the server's own limitation, not the client's mistake)."""
    if not has_video_reader():
        raise APIError(501, "this server has no video support: PyAV is not installed on it (pip install "
                            "'coverpruner[video]')", param, "video_support_not_installed")
    url = url.strip()
    if url[:5].lower() == "data:":
        mime = url[5:].partition(",")[0].partition(";")[0].strip().lower()
        if not mime.startswith("video/"):
            raise bad_request(f"video_url data: URL has media type {mime or 'none'!r}; expected video/* "
                              "(e.g. data:video/mp4;base64,...)", param, "unsupported_video_format")
    data = url_bytes(url, param, allow_local_files, allow_remote, timeout_s, max_bytes, "video")
    _probe(data, param)
    return data


def _probe(data: bytes, param: str) -> None:
    """Open the container with one of VIDEO_DEMUXERS and check it holds a video stream (headers only)."""
    import av

    try:
        with av.open(io.BytesIO(data), mode="r", options={"format_whitelist": VIDEO_DEMUXERS}) as container:
            if not container.streams.video:
                raise bad_request(f"the {container.format.name} file holds no video stream", param, "invalid_video")
    except (av.FFmpegError, OSError, ValueError, EOFError):
        raise bad_request(f"data is not a video in a container this server reads ({_CONTAINERS})", param,
                          "invalid_video") from None


def has_video_reader() -> bool:
    """Whether PyAV (the optional extra ``coverpruner[video]``) is importable here."""
    return importlib.util.find_spec("av") is not None


def sampling_fields(part: dict, param: str) -> dict:
    """The part's optional ``fps`` (number > 0) and ``max_frames`` (integer >= 1), checked; {} when absent."""
    out = {}
    fps = part.get("fps")
    if fps is not None:
        if isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not 0 < fps < float("inf"):
            raise bad_request(f"fps must be a number > 0, got {fps!r}", f"{param}.fps", "invalid_video_option")
        out["fps"] = float(fps)
    frames = part.get("max_frames")
    if frames is not None:
        if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
            raise bad_request(f"max_frames must be an integer >= 1, got {frames!r}", f"{param}.max_frames",
                              "invalid_video_option")
        out["max_frames"] = frames
    return out
