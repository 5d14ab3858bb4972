"""Issue 25: a pipeline error carries its code and param from where it is raised; the server maps the code to an
HTTP status and OpenAI error type in one table (serving.errors.ERROR_STATUS) and never reads the message.

Each code of coverpruner.errors.CODES is raised through a running server: while the request is checked (before its
images are fetched), while its one runtime Request is built, and inside the worker's engine loop (its input stages),
and the HTTP status and the error body are checked against the literal expectations below (written from the
OpenAI error shape, not read from the table).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from coverpruner.errors import (CODES, CoverPrunerError, ImageError, ManifestError, OptionError, PromptError,
                                SamplingError, VideoError)
from coverpruner.serving import ServerConfig, create_app
from coverpruner.serving.errors import ERROR_STATUS
from tests.serving.conftest import data_url, serve_app, user_message

#: code -> (error class raised, param raised, HTTP status, OpenAI type, param reported)
EXPECTED = {
    "invalid_request": (CoverPrunerError, None, 400, "invalid_request_error", None),
    "invalid_value": (OptionError, "tau", 400, "invalid_request_error", "tau"),
    "invalid_image": (ImageError, "messages[0].content[0]", 400, "invalid_request_error", "messages[0].content[0]"),
    "invalid_video": (VideoError, None, 400, "invalid_request_error", "messages"),
    "invalid_prompt": (PromptError, None, 400, "invalid_request_error", "messages"),
    "context_length_exceeded": (PromptError, None, 400, "invalid_request_error", "messages"),
    "too_many_images": (PromptError, None, 400, "invalid_request_error", "messages"),
    "too_many_parts": (PromptError, None, 400, "invalid_request_error", "messages"),
    "video_too_large": (VideoError, None, 400, "invalid_request_error", "messages"),
    "invalid_engine_dir": (ManifestError, None, 500, "server_error", None),
    "grammar_too_complex": (OptionError, None, 400, "invalid_request_error", "response_format"),
    "sampling_failed": (SamplingError, None, 500, "server_error", None),
}


@pytest.fixture(scope="module")
def app_url(tiny_export):
    app = create_app(ServerConfig(str(tiny_export), threads=1, model_name="tiny"))
    with serve_app(app) as url:
        yield app, url


def _post(url: str, demo_png: bytes, stream: bool = False) -> tuple[int, dict]:
    body = json.dumps({"model": "tiny", "messages": user_message(data_url(demo_png)), "max_tokens": 2,
                       "stream": stream}).encode()
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, {}
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _failing(real, exc: Exception):
    """``real`` that raises ``exc`` on its first call and runs as itself afterwards."""
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise exc
        return real(*args, **kwargs)

    return failing


#: where a request meets the error -> (the part of the Pipeline, its method) that raises it there: the check before
#: the images are fetched, the one build of the runtime Request, the first input stage in the worker's engine loop
WHERE = {"check": (lambda pipe: pipe, "check_chat"), "build": (lambda pipe: pipe, "chat_request"),
         "worker": (lambda pipe: pipe.inputs, "native_sequence")}


def test_every_code_has_a_status():
    assert set(ERROR_STATUS) == set(CODES) == set(EXPECTED)


@pytest.mark.parametrize("where", list(WHERE))
@pytest.mark.parametrize("code", list(EXPECTED))
def test_each_code_through_the_server(app_url, demo_png, monkeypatch, code, where):
    app, url = app_url
    cls, raised_param, status, kind, param = EXPECTED[code]
    # the message names another problem on purpose: the code, not the text, decides
    exc = cls("the context is full of max_images and budget words", code=code, param=raised_param)
    assert exc.code == code
    pipe = app.state.server.pipelines[0]
    part, name = WHERE[where]
    monkeypatch.setattr(part(pipe), name, _failing(getattr(part(pipe), name), exc))
    got_status, body = _post(url, demo_png, stream=where == "worker")
    assert got_status == status
    assert body == {"error": {"message": "the context is full of max_images and budget words", "type": kind,
                              "param": param, "code": code}}
    monkeypatch.undo()
    assert _post(url, demo_png)[0] == 200  # still serving


def test_option_param_is_named_in_body_terms(app_url, demo_png, monkeypatch):
    """A GenerationOptions field that OpenAI's body calls otherwise is reported by its body name."""
    app, url = app_url
    pipe = app.state.server.pipelines[0]
    exc = OptionError("max_new_tokens must be an integer in 1..5, got 9", param="max_new_tokens")
    monkeypatch.setattr(pipe, "check_chat", _failing(pipe.check_chat, exc))
    status, body = _post(url, demo_png)
    assert status == 400 and body["error"]["param"] == "max_tokens" and body["error"]["code"] == "invalid_value"


def test_default_codes_per_class():
    assert [c("x").code for c in (CoverPrunerError, ManifestError, ImageError, VideoError, PromptError, OptionError,
                                  SamplingError)] \
        == ["invalid_request", "invalid_engine_dir", "invalid_image", "invalid_video", "invalid_prompt",
            "invalid_value", "sampling_failed"]
    assert PromptError("x", code="too_many_images", param="messages").param == "messages"
    with pytest.raises(TypeError):
        OptionError("x", "tau")  # code and param are keyword-only
