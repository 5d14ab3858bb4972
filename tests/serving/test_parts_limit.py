"""Issue 29 item 4: 100,000 one-letter text parts (2.7 MB) held the only worker for minutes; 1,000 stop strings of
10 KB froze the event loop. Both are refused from their counts before tokenizing or matching (runtime/messages.MAX_PARTS,
runtime/options.py: MAX_STOP_STRINGS, MAX_STOP_CHARS), with a 4xx in well under a second on loopback (the bound is generous for a loaded CI
machine: both took ~0.1-0.5 s here), and the server answers a normal request right after."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi", reason="serving tests need the serve extra (fastapi)")

from tests.serving.conftest import serve_app  # noqa: E402
from tests.serving.http_raw import assert_openai_error, post  # noqa: E402


@pytest.fixture(scope="module")
def url(tiny_export):
    from coverpruner.serving import ServerConfig, create_app

    app = create_app(ServerConfig(str(tiny_export), threads=1, model_name="tiny"))
    with serve_app(app) as base:
        yield base
    app.state.server.pool.shutdown()


def _body(content, **extra) -> bytes:
    return json.dumps({"model": "tiny", "max_tokens": 2, **extra,
                       "messages": [{"role": "user", "content": content}]}).encode()


def test_100k_text_parts_are_refused_from_their_count(url):
    from coverpruner.runtime.messages import MAX_PARTS

    status, data, seconds = post(url, _body([{"type": "text", "text": "a"}] * 100_000), timeout=60)
    err = assert_openai_error(status, data)
    # refused while the body is read: its messages hold more JSON values than MAX_PARTS parts can (serving.app)
    assert (err["code"], err["param"]) == ("too_many_parts", "messages") and "65,536 JSON values" in err["message"], err
    assert seconds < 1.0, seconds
    status, data, _ = post(url, _body([{"type": "text", "text": "a"}] * (MAX_PARTS + 1)))
    assert assert_openai_error(status, data)["code"] == "too_many_parts"
    status, data, _ = post(url, _body([{"type": "text", "text": "Say hi."}] * 3))  # a few parts still answer
    assert status == 200, data


def test_1000_stop_strings_of_10kb_are_refused_fast(url):
    status, data, seconds = post(url, _body("Say hi.", stop=["x" * 10_240] * 1000), timeout=60)
    err = assert_openai_error(status, data)
    assert err["param"] == "stop", err
    assert seconds < 1.0, seconds
