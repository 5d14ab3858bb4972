"""video_url parts in the server: refusals (400 with OpenAI's error body naming messages[i].content[j]), the body
limit of a video server, and a real tiny Qwen2.5-VL engine answering a video as Pipeline.chat does.

The apps run in-process under FastAPI's TestClient on the session's tiny engine dirs (LLaVA-1.5 and Qwen2.5-VL).
A request that reaches the pipeline's checks needs the video core (coverpruner.video and the video parts of
Pipeline.chat_request); those tests skip with a reason where it is absent, and the same refusals are also checked
on serving.request.build_request alone (no engine), which needs nothing from the core.
"""

from __future__ import annotations

import base64
import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="serving tests need the serve extra (fastapi)")
av = pytest.importorskip("av", reason="the video tests encode their clips with PyAV (video extra)")

from fastapi.testclient import TestClient  # noqa: E402

PROMPT = "What happens in this video?"
needs_core = pytest.mark.skipif(importlib.util.find_spec("coverpruner.video") is None,
                                reason="coverpruner.video (the video core, branch video) is not in this tree yet")


def encode_video(frames: int = 8, size=(56, 84), fps: int = 4, seed: int = 0, fmt: str = "mp4") -> bytes:
    """An MPEG-4 clip in an mp4 (or `fmt`) container: `frames` smooth moving frames of (H, W) = size."""
    rng = np.random.default_rng(seed)
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    phase = rng.random(3) * 6
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for t in range(frames):
            img = np.stack([np.sin(6 * xx + phase[0] + t), np.cos(5 * yy + phase[1] - t), xx * yy], -1)
            rgb = ((img - img.min()) / (img.max() - img.min()) * 255).astype(np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
        out.mux(stream.encode())
    return buf.getvalue()


def video_url(data: bytes, mime: str = "video/mp4") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def body(url: str, model: str = "tiny", part_extra: dict | None = None, **extra) -> dict:
    part = {"type": "video_url", "video_url": {"url": url}, **(part_extra or {})}
    return {"model": model, "max_tokens": 4, **extra,
            "messages": [{"role": "user", "content": [part, {"type": "text", "text": PROMPT}]}]}


def openai_error(resp, status: int = 400) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and "\n" not in err["message"], err
    return err


def _client(engine_dir, **config):
    from coverpruner.serving import ServerConfig, create_app

    app = create_app(ServerConfig(str(engine_dir), workers=1, threads=1, model_name="tiny", **config))
    return app, TestClient(app)


@pytest.fixture(scope="module")
def qwen_client(qwen_export):
    app, client = _client(qwen_export, max_video_bytes=200_000)
    with client:
        yield client
    app.state.server.pool.shutdown()


@pytest.fixture(scope="module")
def llava_client(tiny_export):
    app, client = _client(tiny_export)
    with client:
        yield client
    app.state.server.pool.shutdown()


@pytest.fixture(scope="module")
def clip() -> bytes:
    return encode_video()


# -- refusals ---------------------------------------------------------------------------------------------------

def test_video_on_a_llava_engine_is_refused_by_name(llava_client, clip):
    err = openai_error(llava_client.post("/v1/chat/completions", json=body(video_url(clip))))
    assert err["param"] == "messages[0].content[0]" and err["code"] == "video_not_supported"
    assert "llava family" in err["message"] and "does not take video" in err["message"]


def test_a_server_without_pyav_says_so_with_501_and_in_health(qwen_client, clip, monkeypatch):
    """A missing server dependency is the server's limitation (501, server_error), not the client's 400; /health
    lists the input kinds the server takes. Simulated: PyAV is a test dependency, so it is hidden here."""
    from coverpruner.serving import app as app_module, videos

    assert "video_url" in qwen_client.get("/health").json()["inputs"]
    monkeypatch.setattr(videos, "has_video_reader", lambda: False)
    monkeypatch.setattr(app_module, "has_video_reader", lambda: False)
    err = openai_error(qwen_client.post("/v1/chat/completions", json=body(video_url(clip))), 501)
    assert err["code"] == "video_support_not_installed" and err["type"] == "server_error"
    assert "coverpruner[video]" in err["message"] and err["param"] == "messages[0].content[0].video_url.url"
    assert qwen_client.get("/health").json()["inputs"] == ["text", "image_url"]


def test_health_lists_no_video_for_a_family_without_it(llava_client):
    assert llava_client.get("/health").json()["inputs"] == ["text", "image_url"]


@needs_core
def test_wrong_base64_is_refused(qwen_client):
    err = openai_error(qwen_client.post("/v1/chat/completions", json=body("data:video/mp4;base64,AAA*AAA=")))
    assert err["param"] == "messages[0].content[0].video_url.url" and err["code"] == "invalid_base64"


@needs_core
def test_too_big_is_refused(qwen_client):
    data = encode_video(frames=4) + bytes(200_001)  # the server above allows 200,000 bytes
    err = openai_error(qwen_client.post("/v1/chat/completions", json=body(video_url(data))))
    assert err["param"] == "messages[0].content[0].video_url.url" and err["code"] == "video_too_large"
    assert "200000" in err["message"]


@needs_core
def test_non_video_mime_is_refused(qwen_client, demo_png):
    err = openai_error(qwen_client.post("/v1/chat/completions", json=body(video_url(demo_png, "image/png"))))
    assert err["param"] == "messages[0].content[0].video_url.url" and err["code"] == "unsupported_video_format"
    assert "'image/png'" in err["message"]


@needs_core
def test_undecodable_video_is_refused(qwen_client):
    err = openai_error(qwen_client.post("/v1/chat/completions", json=body(video_url(b"not a video " * 50))))
    assert err["param"] == "messages[0].content[0].video_url.url" and err["code"] == "invalid_video"


@needs_core
def test_local_video_paths_follow_the_image_rule(qwen_client, tmp_path, clip):
    path = tmp_path / "clip.mp4"
    path.write_bytes(clip)
    for url in (str(path), f"file://{path}"):
        err = openai_error(qwen_client.post("/v1/chat/completions", json=body(url)))
        assert err["code"] == "local_files_disabled" and err["param"].endswith("video_url.url")


@needs_core
def test_remote_video_urls_follow_the_image_rule(qwen_client):
    err = openai_error(qwen_client.post("/v1/chat/completions", json=body("https://example.com/clip.mp4")))
    assert err["code"] == "remote_images_disabled" and "video" in err["message"]


@pytest.mark.parametrize("extra,param", [({"fps": 0}, "fps"), ({"fps": "2"}, "fps"), ({"max_frames": 0}, "max_frames"),
                                         ({"max_frames": 2.5}, "max_frames")])
def test_bad_sampling_fields_are_named(qwen_client, clip, extra, param):
    err = openai_error(qwen_client.post("/v1/chat/completions", json=body(video_url(clip), part_extra=extra)))
    assert err["param"] == f"messages[0].content[0].{param}"


def test_video_in_an_assistant_message_is_refused(qwen_client, clip):
    req = {"model": "tiny", "messages": [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": [{"type": "video_url", "video_url": {"url": video_url(clip)}}]},
        {"role": "user", "content": PROMPT}]}
    err = openai_error(qwen_client.post("/v1/chat/completions", json=req))
    assert err["param"] == "messages[1].content[0]" and "user messages" in err["message"]


def test_missing_url_is_named(qwen_client):
    req = body("x")
    req["messages"][0]["content"][0] = {"type": "video_url", "video_url": {}}
    err = openai_error(qwen_client.post("/v1/chat/completions", json=req))
    assert err["param"] == "messages[0].content[0].video_url.url"


def test_a_bad_option_is_reported_before_the_video_is_read(qwen_client):
    # the options are checked with stand-ins first: a broken video behind a bad option costs no reading
    err = openai_error(qwen_client.post("/v1/chat/completions",
                                        json=body("data:video/mp4;base64,AAA*AAA=", budget=-3)))
    assert err["param"] == "budget"


def test_body_limit_holds_a_whole_video_only_where_video_is_taken(qwen_export, tiny_export):
    from coverpruner.serving.app import MAX_BODY_BYTES, ServerState
    from coverpruner.serving import ServerConfig

    big = ServerState(ServerConfig(str(qwen_export), threads=1, max_video_bytes=96 * 2 ** 20))
    llava = ServerState(ServerConfig(str(tiny_export), threads=1, max_video_bytes=96 * 2 ** 20))
    try:
        assert big.max_body_bytes >= 96 * 2 ** 20 * 4 // 3 > MAX_BODY_BYTES
        assert llava.max_body_bytes == MAX_BODY_BYTES
    finally:
        big.pool.shutdown()
        llava.pool.shutdown()


@needs_core
def test_frames_are_bounded_by_the_server(qwen_export):
    # 16 frames at 4 fps = 4 s, sampled at Qwen's default 2 fps: 8 frames, above this server's 4
    app, client = _client(qwen_export, max_video_frames=4)
    try:
        with client:
            clip = video_url(encode_video(frames=16, fps=4))
            err = openai_error(client.post("/v1/chat/completions", json=body(clip)))
            assert "max_video_frames" in err["message"] and err["param"].startswith("messages"), err
            for asked in (64, "64"):  # the family's parser reads digit strings too
                err = openai_error(client.post("/v1/chat/completions", json=body(clip, max_video_frames=asked)))
                assert err["param"] == "max_video_frames" and err["code"] == "too_many_frames"
                assert "bound of 4 frames" in err["message"]
            ok = client.post("/v1/chat/completions", json=body(clip, part_extra={"max_frames": 4}))
            assert ok.status_code == 200, ok.text
    finally:
        app.state.server.pool.shutdown()


# -- a real answer ----------------------------------------------------------------------------------------------

@needs_core
@pytest.mark.parametrize("budget,options", [("full", {}), (24, {}), (24, {"video_window": 1})])
def test_tiny_qwen_answers_a_video_url_as_pipeline_chat(qwen_client, qwen_export, clip, budget, options):
    from coverpruner.runtime import Pipeline

    resp = qwen_client.post("/v1/chat/completions", json=body(video_url(clip), part_extra={"fps": 2.0},
                                                               budget=budget, max_tokens=6, **options))
    assert resp.status_code == 200, resp.text
    got = resp.json()
    reference = Pipeline.load(qwen_export, provider="cpu", threads=1)
    want = reference.chat([{"role": "user", "content": [{"type": "video", "video": clip, "fps": 2.0},
                                                        {"type": "text", "text": PROMPT}]}],
                          budget=budget, max_new_tokens=6, **options)
    assert got["choices"][0]["message"]["content"] == want.text
    assert got["coverpruner"]["kept_indices"] == [int(i) for i in want.kept_indices]


# -- the same refusals on build_request alone (no engine, no video core) ---------------------------------------

def _build(url: str, max_video_bytes: int = 200_000, family: str = "qwen2_5_vl", **kwargs):
    from coverpruner.serving.request import build_request
    from coverpruner.serving.schema import ChatCompletionRequest

    return build_request(ChatCompletionRequest.model_validate(body(url)), {}, allowed={}, family=family,
                         max_video_bytes=max_video_bytes, takes_video=family == "qwen2_5_vl", **kwargs)


@pytest.mark.parametrize("url,code", [
    ("data:video/mp4;base64,AAA*AAA=", "invalid_base64"),
    (video_url(bytes(200_001)), "video_too_large"),
    ("data:image/png;base64,iVBORw0KGgo=", "unsupported_video_format"),
    ("data:video/mp4,notbase64", "invalid_video_url"),
    (video_url(b"not a video " * 50), "invalid_video"),
    (video_url(encode_video(frames=2, fmt="matroska")[:200]), "invalid_video"),  # truncated
    # FFmpeg would read a PNG as a one-frame video, and an ffconcat script would open local files
    (video_url((Path(__file__).parents[2] / "coverpruner" / "assets" / "demo.png").read_bytes()), "invalid_video"),
    (video_url(b"ffconcat version 1.0\nfile clip.mp4\n"), "invalid_video"),
    ("/tmp/clip.mp4", "local_files_disabled"),
    ("ftp://host/clip.mp4", "invalid_video_url"),
])
def test_build_request_refusals(url, code):
    from coverpruner.serving.errors import APIError

    with pytest.raises(APIError) as info:
        _build(url, allow_local_files=False, allow_remote_images=False)
    assert info.value.status == 400 and info.value.code == code
    assert info.value.param == "messages[0].content[0].video_url.url"


@pytest.mark.parametrize("fmt", ["mp4", "matroska", "avi", "mpegts"])
def test_build_request_takes_common_containers(fmt):
    data = encode_video(frames=4, fmt=fmt)
    gen = _build(video_url(data), allow_local_files=False, allow_remote_images=False)
    assert gen.messages[0]["content"][0] == {"type": "video", "video": data}


def test_build_request_hands_on_the_bytes_and_sampling_fields(clip, tmp_path):
    from coverpruner.serving.request import build_request
    from coverpruner.serving.schema import ChatCompletionRequest

    req = body(video_url(clip), part_extra={"fps": 2, "max_frames": 16})
    gen = build_request(ChatCompletionRequest.model_validate(req), {}, False, False, allowed={}, family="qwen2_5_vl",
                        takes_video=True)
    assert gen.messages[0]["content"][0] == {"type": "video", "video": clip, "fps": 2.0, "max_frames": 16}
    path = tmp_path / "clip.mp4"
    path.write_bytes(clip)
    for url in (str(path), f"file://{path}"):
        gen = _build(url, allow_local_files=True, allow_remote_images=False)
        assert gen.messages[0]["content"][0] == {"type": "video", "video": clip}


def test_build_request_checks_with_stand_ins_before_reading():
    seen = []

    def validate(messages, options):
        seen.append(messages[0]["content"][0])
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):  # the broken base64 is never reached
        _build("data:video/mp4;base64,AAA*AAA=", validate=validate, allow_local_files=False,
               allow_remote_images=False)
    part = seen[0]
    assert part["type"] == "video" and len(part["video"]) == 2 and part["video"][0].size == (28, 28)


def test_build_request_refuses_video_for_other_families(clip):
    from coverpruner.serving.errors import APIError

    for family in ("llava", "llava_next", None):
        with pytest.raises(APIError) as info:
            _build(video_url(clip), family=family, allow_local_files=False, allow_remote_images=False)
        assert info.value.code == "video_not_supported" and info.value.param == "messages[0].content[0]"
