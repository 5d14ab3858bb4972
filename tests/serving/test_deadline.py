"""Issue 17, server limits: a per-request deadline (--request-timeout). A request not answered within it gets a
504 with OpenAI's error JSON (an error event when it is already streaming), is counted in /metrics, and its
generation is cancelled: the worker is free again long before the answer would have ended.

The deadline is a fifth of the time the same long answer (ignore_eos, up to the tiny model's context end)
takes on a pipeline loaded the same way, measured here, so the test holds on a slow or a fast machine.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from tests.serving.conftest import data_url, start_server, user_message
from tests.serving.http_raw import assert_openai_error, get, metric, post

pytestmark = pytest.mark.slow

LONG = 4096  # max_tokens past the tiny model's context (1,024 positions): the answer runs to the context end


def _long_body(demo_png, **extra) -> dict:
    return {"model": "tiny", "messages": user_message(data_url(demo_png)), "max_tokens": LONG, "ignore_eos": True,
            "budget": 8, **extra}


@pytest.fixture(scope="module")
def full_seconds(reference, demo_image) -> float:
    """Seconds the long answer takes when nothing stops it (the best of two runs)."""
    times = []
    for _ in range(2):
        t0 = time.monotonic()
        reference.generate(str(demo_image), "What is shown in this image?", budget=8, max_new_tokens=LONG,
                           ignore_eos=True)
        times.append(time.monotonic() - t0)
    return min(times)


@pytest.fixture(scope="module")
def deadline_server(tiny_export, full_seconds):
    from coverpruner.serving import ServerConfig

    config = ServerConfig(str(tiny_export), workers=1, threads=1, model_name="tiny",
                          request_timeout_s=full_seconds / 5)
    with start_server(config) as url:
        yield url


def _wait_idle(base: str, limit_s: float) -> float:
    """Seconds until /health reports no running and no queued request (fails past limit_s)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        health = json.loads(get(base, "/health")[1])
        if health["running"] == 0 and health["queued"] == 0:
            return time.monotonic() - t0
        time.sleep(0.01)
    pytest.fail(f"the worker was still busy {limit_s:.2f} s after the deadline")


def test_past_the_deadline_is_504_json_and_the_generation_stops(deadline_server, demo_png, full_seconds):
    before = metric(deadline_server, "coverpruner_requests_total", outcome="timeout")
    t0 = time.monotonic()
    status, data, took = post(deadline_server, _long_body(demo_png), timeout=60)
    err = assert_openai_error(status, data, 504, 504)
    assert err["code"] == "request_timeout" and "--request-timeout" in err["message"]
    assert took < full_seconds * 0.6  # answered at the deadline, not when the generation would have ended
    # cancelled: the worker stops after its current token, long before the answer's natural end
    _wait_idle(deadline_server, max(0.0, full_seconds * 0.6 - (time.monotonic() - t0)))
    assert metric(deadline_server, "coverpruner_requests_total", outcome="timeout") == before + 1
    assert metric(deadline_server, "coverpruner_errors_total", code="request_timeout") >= 1


def test_a_stream_past_the_deadline_ends_with_an_error_event(deadline_server, demo_png, full_seconds):
    req = urllib.request.Request(f"{deadline_server}/v1/chat/completions",
                                 data=json.dumps(_long_body(demo_png, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200  # the first token came within the deadline
        events = [line[len(b"data: "):].decode() for line in resp.read().splitlines() if line.startswith(b"data: ")]
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])
    assert set(err) == {"error"} and err["error"]["code"] == "request_timeout"
    assert time.monotonic() - t0 < full_seconds * 0.6
    _wait_idle(deadline_server, max(0.0, full_seconds * 0.6 - (time.monotonic() - t0)))


@pytest.mark.parametrize("bad", ["-1", "nan", "1e9"])
def test_request_timeout_flag_is_checked(tiny_export, capsys, bad):
    from coverpruner.serving.cli import main

    assert main([str(tiny_export), "--request-timeout", bad]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--request-timeout" in lines[0], lines
