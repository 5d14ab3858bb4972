"""Issue 29: no hostile request blocks the event loop, and a deadline passing mid-decode frees the batch slot.

/health is answered by the event loop alone, so its latency while a hostile request is in flight measures whether
anything of that request runs on the loop for long. Each hostile request is sent from a thread while /health is
polled every 20 ms; the slowest /health must be under 100 ms of this machine's time (the issue's bound: a
correctness property of the loop, not a speed target). On a machine shared with other jobs a process gets only a
share of a core, which stretches every wall time alike, so the bound is scaled by that stretch, measured just before
each case as wall / thread CPU time of a 50 ms pure-Python spin (1 on an idle machine, ~4 on this 2-core box under
its usual load): a loop blocked for 0.25 s of CPU (json.loads + pydantic of 100,000 parts, as it was) still fails it.
Hostile
requests (the issue's list): 100,000 text parts, 1,000 stop strings of 10 KB, a body that never ends (slowloris),
a remote image whose server drips its headers, a stream matched against 16 adversarial 1 KB stop strings (the
matcher's worst case inside the limits); the 64-frame 2048x2048 video is in test_video_admission.py (its server and
clip), measured the same way (``slowest_health``, ``stretch``).

Deadline (--request-timeout) on the batched worker pool: two requests whose deadline passes mid-decode (one
streamed) end with a 504 JSON body / an error event then [DONE]; the batch is then empty and the next request is
answered. The deadline is a fifth of the same long answer's time on that server, measured first (as
test_deadline.py), so it falls mid-decode on a slow or a fast machine.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

from tests.serving.conftest import serve_app
from tests.serving.http_raw import assert_openai_error, get, post

pytestmark = pytest.mark.slow

HEALTH_BOUND_S = 0.100
LONG = 400  # tokens of the long answer (ignore_eos): ~1-5 s on the tiny model


@pytest.fixture(scope="module")
def ort_export(builds):
    return builds.export("tiny", "ort")


@pytest.fixture(scope="module")
def hostile_server(ort_export):
    from coverpruner.serving import ServerConfig, create_app

    app = create_app(ServerConfig(str(ort_export), workers=1, threads=1, model_name="tiny", max_batch=2,
                                  batch_context=1024, allow_remote_images=True, remote_timeout_s=1.0,
                                  body_timeout_s=1.0))
    with serve_app(app) as url:
        yield url


def _body(content, **extra) -> dict:
    return {"model": "tiny", "max_tokens": 2, **extra, "messages": [{"role": "user", "content": content}]}


def stretch() -> float:
    """Wall seconds per CPU second of this thread right now (>= 1): how much the machine's load stretches time."""
    t0, c0 = time.perf_counter(), time.thread_time()
    while time.thread_time() - c0 < 0.05:
        pass
    return max(1.0, (time.perf_counter() - t0) / (time.thread_time() - c0))


def slowest_health(base: str, send) -> tuple[float, object]:
    """Run send() in a thread; poll /health every 20 ms while it runs (at least 3 times) -> (slowest s, result)."""
    out = {}
    worker = threading.Thread(target=lambda: out.update(r=send()), daemon=True)
    worker.start()
    times = []
    while worker.is_alive() or len(times) < 3:
        t0 = time.monotonic()
        status, _ = get(base, "/health", timeout=30)
        times.append(time.monotonic() - t0)
        assert status == 200
        time.sleep(0.02)
    worker.join()
    return max(times), out["r"]


def _raw_never_ending(base: str) -> str:
    """A chunked body that never ends (a byte every 0.1 s): the status line the server answers with."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(base)
    with socket.create_connection((u.hostname, u.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n")
        sock.settimeout(0.1)
        for _ in range(100):
            try:
                return sock.recv(4096).split(b"\r\n", 1)[0].decode()
            except socket.timeout:
                sock.sendall(b"1\r\n \r\n")
    return ""


@pytest.fixture(scope="module")
def header_dripper():
    """An HTTP server that sends its status line and headers a byte every 0.1 s (for 10 s)."""
    import contextlib
    import http.server

    class Drip(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            with contextlib.suppress(OSError):
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                for _ in range(100):
                    self.wfile.write(b"z")
                    self.wfile.flush()
                    time.sleep(0.1)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Drip)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/x.png"
    srv.shutdown()


def _stream_with_stops(base: str, stops: list[str]) -> list[str]:
    req = urllib.request.Request(f"{base}/v1/chat/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps(_body("Say hi.", max_tokens=200, ignore_eos=True, stream=True,
                                                       stop=stops)).encode())
    with urllib.request.urlopen(req, timeout=60) as resp:
        return [ln.decode() for ln in resp.read().splitlines() if ln.startswith(b"data: ")]


def test_health_stays_fast_while_hostile_requests_run(hostile_server, header_dripper):
    from coverpruner.runtime.options import MAX_STOP_CHARS, MAX_STOP_STRINGS

    many_parts = json.dumps(_body([{"type": "text", "text": "a"}] * 100_000))
    big_stops = json.dumps(_body("Say hi.", stop=["x" * 10_240] * 1000))
    # KMP's worst case: a long run of 'a' then a mismatch, for every string
    adversarial = ["a" * (MAX_STOP_CHARS - 1) + chr(98 + i) for i in range(MAX_STOP_STRINGS)]
    remote = _body([{"type": "image_url", "image_url": {"url": header_dripper}}, {"type": "text", "text": "Hi"}])
    cases = {
        "100,000 text parts": lambda: post(hostile_server, many_parts, timeout=60)[0],
        "1,000 x 10 KB stop strings": lambda: post(hostile_server, big_stops, timeout=60)[0],
        "a never-ending body": lambda: _raw_never_ending(hostile_server),
        "a header-dripping remote image": lambda: post(hostile_server, remote, timeout=60)[0],
        "16 adversarial 1 KB stop strings, streamed": lambda: _stream_with_stops(hostile_server, adversarial),
    }
    slowest, bound = {}, {}
    for name, send in cases.items():
        # the load is read before and after the case; a /health over its bound is measured once more (under
        # pytest-xdist the other worker may take the core during one case and not during the stretch reading)
        for _ in range(2):
            before = stretch()
            slowest[name], result = slowest_health(hostile_server, send)
            bound[name] = HEALTH_BOUND_S * max(before, stretch())
            if name.startswith("16"):
                assert result[-1] == "data: [DONE]", result[-3:]
            elif name.startswith("a never"):
                assert result.startswith("HTTP/1.1 408"), result
            else:
                assert 400 <= result < 500, (name, result)
            if slowest[name] < bound[name]:
                break
    print("slowest /health (s) / bound:", {k: (round(v, 3), round(bound[k], 3)) for k, v in slowest.items()})
    assert all(slowest[k] < bound[k] for k in cases), (slowest, bound)


# -- a deadline passing mid-decode in a batch ------------------------------------------------------

def _long(**extra) -> dict:
    return _body("Tell me a story.", max_tokens=LONG, ignore_eos=True, **extra)


def test_deadline_mid_decode_is_504_and_frees_the_batch_slots(ort_export):
    from coverpruner.serving import ServerConfig, create_app

    app = create_app(ServerConfig(str(ort_export), workers=1, threads=1, model_name="tiny", max_batch=2,
                                  batch_context=1024, request_timeout_s=None))
    with serve_app(app) as url:
        runs = [post(url, _long(), timeout=120) for _ in range(2)]  # the whole answer, no deadline yet: the faster
        assert all(r[0] == 200 and r[1]["usage"]["completion_tokens"] == LONG for r in runs), runs
        full_s = min(r[2] for r in runs)
        config = app.state.server.config
        config.request_timeout_s = full_s / 5  # read per request (_answer); both slots' requests pass it mid-decode
        streamed = {}

        def stream():
            req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(_long(stream=True)).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                streamed["events"] = [ln[6:].decode() for ln in resp.read().splitlines() if ln.startswith(b"data: ")]

        t = threading.Thread(target=stream)
        t.start()
        status, data, took = post(url, _long(), timeout=60)
        t.join(timeout=60)
        err = assert_openai_error(status, data, 504, 504)
        assert err["code"] == "request_timeout" and took < full_s * 0.6, (err, took, full_s)
        events = streamed["events"]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "request_timeout", events[-3:]
        # both slots are given back: the batch drains and a following request is answered within the deadline
        deadline = time.monotonic() + full_s * 0.6
        while json.loads(get(url, "/health")[1])["running"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert json.loads(get(url, "/health")[1])["running"] == 0
        status, data, _ = post(url, _body("Say hi.", max_tokens=4), timeout=60)
        assert status == 200 and data["choices"][0]["finish_reason"] == "length", data
