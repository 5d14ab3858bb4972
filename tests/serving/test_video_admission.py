"""Issue 29 item 1: a video is admitted from its header alone. Its sampled frames, decoded size and visual tokens are
known before any frame is decoded (FamilyRuntime.video_cost), so a video that cannot fit the context or
--max-video-pixels is refused in milliseconds with a 4xx, and the server's memory does not grow.

The hostile video is the issue's: 64 plain 2048x2048 frames in an mp4 (a few hundred KB: plain colour compresses to
almost nothing) against a real coverpruner-serve process on loopback; RSS is the server process's (as
test_limits.server_process reads it). The token count is checked against an independent recount from the sampling
and resize rules written out here (qwen-vl-utils' rules: 2 fps, even frame counts, 28-px multiples).
"""

from __future__ import annotations

import base64
import io
import math
import time

import numpy as np
import pytest

av = pytest.importorskip("av", reason="the video admission tests encode their clips with PyAV (video extra)")
pytest.importorskip("fastapi", reason="serving tests need the serve extra (fastapi)")

from tests.serving.http_raw import assert_openai_error, post, rss_bytes  # noqa: E402


def plain_video(frames: int, height: int, width: int, fps: int = 2) -> bytes:
    """An mp4 of ``frames`` plain grey frames (MPEG-4 part 2: compresses a plain frame to a few hundred bytes)."""
    buf = io.BytesIO()
    grey = np.full((height, width, 3), 96, np.uint8)
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for _ in range(frames):
            out.mux(stream.encode(av.VideoFrame.from_ndarray(grey, format="rgb24")))
        out.mux(stream.encode())
    return buf.getvalue()


def body(data: bytes, **extra) -> dict:
    url = "data:video/mp4;base64," + base64.b64encode(data).decode()
    return {"model": "tiny", "max_tokens": 2, **extra, "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "What happens?"}]}]}


@pytest.fixture(scope="module")
def huge_video():
    return plain_video(64, 2048, 2048)


@pytest.fixture(scope="module")
def video_server(qwen_export, tmp_path_factory):
    """(url, pid) of a coverpruner-serve process on the tiny Qwen2.5-VL engine (video bytes up to 4 MB)."""
    from tests.serving.test_cli import _serve, _stop, _wait_healthy

    proc, url = _serve(qwen_export, "--max-video-bytes", str(4 * 2 ** 20), "--max-batch", "1",
                       log=tmp_path_factory.mktemp("serve") / "serve.log")
    try:
        _wait_healthy(url, proc, 120)
        yield url, proc.pid
    finally:
        _stop(proc)


def test_header_cost_matches_an_independent_recount(qwen_export, huge_video):
    """video_cost from the header alone == the frames and tokens recounted here from the rules (module doc)."""
    from coverpruner.runtime.pipeline import Pipeline
    from coverpruner.video import VideoInput

    pipe = Pipeline.load(qwen_export)
    rt = pipe.family_runtime
    s = rt.settings
    cost = rt.video_cost(VideoInput(huge_video, max_frames=8), {"max_video_frames": 64})
    # 64 frames at 2 fps sampled at 2 fps -> every frame, capped by max_frames 8 -> 8 frames (even already)
    n = 8
    hi = max(min(768 * 28 * 28, 128000 * 28 * 28 * 0.9 / n * 2), int(128 * 28 * 28 * 1.05))
    hi = min(max(hi, s.min_pixels), s.max_pixels)
    beta = math.sqrt(2048 * 2048 / hi)  # a square frame above the budget: floor to 28-px multiples
    side = max(28, math.floor(2048 / beta / 28) * 28)
    assert (cost.frames, cost.height, cost.width) == (8, 2048, 2048)
    assert cost.visual_tokens == (n // 2) * (side // 28) ** 2
    assert cost.decoded_pixels == 8 * 2048 * 2048


def test_huge_video_is_refused_from_its_header_fast_and_cheaply(video_server, huge_video):
    """The issue's 64 x 2048x2048 mp4 took the server to 24 GB. Now: a 4xx in well under a second (the bound is
    generous for a loaded CI machine; it took ~0.1 s here), the server's RSS unchanged to within 100 MB."""
    url, pid = video_server
    assert len(huge_video) < 2 * 2 ** 20
    rss0 = rss_bytes(pid)
    status, data, seconds = post(url, body(huge_video), timeout=60)
    err = assert_openai_error(status, data)
    assert err["code"] in ("video_too_large", "context_length_exceeded") and "frames" in err["message"], err
    assert seconds < 1.0, seconds
    assert rss_bytes(pid) - rss0 < 100 * 2 ** 20


def test_health_stays_fast_while_the_huge_video_is_refused(video_server, huge_video):
    """Issue 29: /health under 100 ms (scaled by the machine's stretch, test_event_loop.py says why) while the
    64-frame 2048x2048 video is probed and refused."""
    from tests.serving.test_event_loop import HEALTH_BOUND_S, slowest_health, stretch

    url, _ = video_server
    bound = HEALTH_BOUND_S * stretch()
    slowest, status = slowest_health(url, lambda: post(url, body(huge_video), timeout=60)[0])
    assert 400 <= status < 500 and slowest < bound, (status, slowest, bound)


def test_context_and_pixel_bound_are_each_checked_before_decoding(qwen_export, huge_video, video_server):
    """Pipeline.chat_request alone (no decode): with no pixel bound the 64 frames' 4,608 tokens exceed the context of
    2,048 (context_length_exceeded); 2 frames under a bound one pixel short of them are video_too_large; a small
    video still gets an answer from the server."""
    from coverpruner.errors import PromptError, VideoError
    from coverpruner.runtime.pipeline import Pipeline

    pipe = Pipeline.load(qwen_export)

    def messages(**part):
        return [{"role": "user", "content": [{"type": "video", "video": huge_video, **part},
                                             {"type": "text", "text": "What happens?"}]}]

    pipe.max_video_pixels = None
    with pytest.raises(PromptError) as exc:
        pipe.chat_request(messages(), max_video_frames=64)
    assert exc.value.code == "context_length_exceeded" and "4608 visual tokens" in str(exc.value), exc.value
    pipe.max_video_pixels = 2 * 2048 * 2048 - 1
    with pytest.raises(VideoError) as exc:
        pipe.chat_request(messages(max_frames=2))
    assert exc.value.code == "video_too_large" and "2 sampled frames of 2048x2048" in str(exc.value), exc.value
    pipe.max_video_pixels = 2 * 2048 * 2048
    pipe.chat_request(messages(max_frames=2))  # exactly at the bound: admitted
    status, data, _ = post(video_server[0], body(plain_video(8, 56, 84)), timeout=120)
    assert status == 200, data
