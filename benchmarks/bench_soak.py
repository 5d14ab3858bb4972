"""Soak (issue 29): valid, client-error and hostile requests against ONE coverpruner-serve process for N minutes.

The server runs the tiny Qwen2.5-VL engine (images, video and text in one model; random weights) as its own process
on loopback, --max-batch 1, --allow-remote-images, --body-timeout 2, --remote-timeout 2. Three client threads:

* valid (2 threads): text, image, two-image conversation, 8-frame video and a 16-frame 448x448 video, greedy
  (temperature 0) with a few max_tokens; and (issue 40) a json_schema answer, a forced tool call, a /v1/completions
  list of 3 prompts, logprobs with 5 alternatives and a temperature of 1e-310 (greedy); the first answer of each is
  recorded and every later answer must equal it;
* hostile (1 thread): client errors (bad field values, unknown model, malformed JSON, 5,000 content parts,
  100,000 text parts, 1,000 x 10 KB stop strings, a 64-frame 2048x2048 video, an empty body, and issue 40's
  findings from tests/serving/hostile_cases.py: $ref cycles, a 36 MB schema, 50,000 tools, 10^6 logit_bias entries,
  a 100 KB const, "²" integers, 100,000 prompts, ...), each must get a 4xx with OpenAI's error body (never a 5xx),
  and slow attacks (a never-ending chunked body, a remote image whose server drips its headers), each cut near its
  2 s deadline.

The server's RSS (/proc/PID/statm) is sampled every 0.5 s. Checks: no valid answer changed, no 5xx for a client
error, RSS flat after warm-up (the largest RSS of the last half of the run at most --rss-slack-mb above the largest
of the first warm-up minute... see `flat`), /health answered throughout. Writes benchmarks/results/soak_<tag>.json
and .png (RSS over time, request kinds marked).

    python benchmarks/bench_soak.py --minutes 3            # builds the tiny engine into benchmarks/work/ once
    python benchmarks/bench_soak.py --engine DIR --minutes 30
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import http.server
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
PAGE = os.sysconf("SC_PAGE_SIZE")


# -- inputs -------------------------------------------------------------------------------------------
def _mp4(frames: int, h: int, w: int, plain: bool = False) -> bytes:
    import av

    buf, rng = io.BytesIO(), np.random.default_rng(frames * h)
    with av.open(buf, "w", format="mp4") as out:
        s = out.add_stream("mpeg4", rate=2)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for i in range(frames):
            img = (np.full((h, w, 3), 96, np.uint8) if plain else
                   np.clip(rng.normal(128, 40, (h // 8, w // 8, 3)), 0, 255).astype(np.uint8).repeat(8, 0).repeat(8, 1))
            out.mux(s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        out.mux(s.encode())
    return buf.getvalue()


def _url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _png() -> bytes:
    from importlib.resources import files

    return (files("coverpruner") / "assets" / "demo.png").read_bytes()


def _msg(*parts) -> list:
    return [{"role": "user", "content": list(parts)}]


def _text(t: str) -> dict:
    return {"type": "text", "text": t}


def valid_requests() -> dict[str, dict]:
    """name -> chat body (or {"_path": another endpoint, ...the body})."""
    img = {"type": "image_url", "image_url": {"url": _url(_png(), "image/png")}}
    v8 = {"type": "video_url", "video_url": {"url": _url(_mp4(8, 112, 168), "video/mp4")}}
    v16 = {"type": "video_url", "video_url": {"url": _url(_mp4(16, 448, 448), "video/mp4")}}
    base = {"model": "tiny", "temperature": 0}
    return {
        "text": {**base, "max_tokens": 12, "messages": _msg(_text("Tell me about the sea."))},
        "image": {**base, "max_tokens": 8, "budget": 16, "messages": _msg(img, _text("What is shown?"))},
        "two_images": {**base, "max_tokens": 6, "messages": [
            {"role": "user", "content": [img, _text("And this one?")]},
            {"role": "assistant", "content": "A picture."},
            {"role": "user", "content": [img, _text("Compare them.")]}]},
        "video_8f": {**base, "max_tokens": 6, "messages": _msg(v8, _text("What happens?"))},
        "video_16f_448": {**base, "max_tokens": 4, "budget": 64, "messages": _msg(v16, _text("What happens?"))},
        # issue 40's request kinds, each with an answer that must not change
        "json_schema": {**base, "max_tokens": 48, "messages": _msg(_text("Describe the sea.")), "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": {
                "type": "object", "additionalProperties": False, "required": ["kind", "n"],
                "properties": {"kind": {"enum": ["calm", "rough"]}, "n": {"type": "integer", "minimum": 0,
                                                                           "maximum": 9}}}}}},
        "tool_call": {**base, "max_tokens": 24, "messages": _msg(_text("Where is it?")), "tool_choice": {
            "type": "function", "function": {"name": "locate"}}, "tools": [{"type": "function", "function": {
                "name": "locate", "parameters": {"type": "object", "additionalProperties": False, "required": ["x"],
                                                 "properties": {"x": {"type": "integer", "minimum": 0,
                                                                      "maximum": 99}}}}}]},
        "completions_list": {**base, "_path": "/v1/completions", "max_tokens": 4, "prompt": ["Sea?", "Sky?", "Sun?"]},
        "logprobs": {**base, "max_tokens": 6, "logprobs": True, "top_logprobs": 5, "messages": _msg(_text("Hi"))},
        "temperature_1e-310": {**base, "temperature": 1e-310, "max_tokens": 8,
                               "messages": _msg(_text("Tell me about the sea."))},
    }


def client_errors() -> dict[str, bytes]:
    ok = {"model": "tiny", "max_tokens": 2, "messages": _msg(_text("Hi"))}
    huge = {"type": "video_url", "video_url": {"url": _url(_mp4(64, 2048, 2048, plain=True), "video/mp4")}}
    out = {f"bad_{k}": json.dumps({**ok, k: v}) for k, v in
           (("budget", 1e24), ("temperature", -1), ("max_tokens", "16"), ("seed", -1), ("tau", [1]))}
    out.update({
        "unknown_model": json.dumps({**ok, "model": "nope"}),
        "not_json": "not json at all", "empty": "", "array_body": "[1, 2]",
        "5000_parts": json.dumps({**ok, "messages": _msg(*[_text("a")] * 5000)}),
        "100k_parts": json.dumps({**ok, "messages": _msg(*[_text("a")] * 100_000)}),
        "1000_stops_10kb": json.dumps({**ok, "stop": ["x" * 10_240] * 1000}),
        "video_64f_2048": json.dumps({**ok, "messages": _msg(huge, _text("What happens?"))}),
    })
    out = {k: ("/v1/chat/completions", v.encode()) for k, v in out.items()}
    from tests.serving.hostile_cases import cases

    # issue 40's findings that are client errors (built once: several are 5-40 MB)
    out.update({c.name: (c.path, c.body()) for c in cases("qwen3_vl") if c.expect == "4xx"})
    return out


def answer_of(data) -> str:
    """What must not change between two answers: the choices' texts (a tool call's arguments; not its random id)
    and their logprob tokens (not the values: a prefix restored from the cache and one prefilled again differ in
    the last float32 bits, ~2e-6 in the logprobs, which picks the same tokens)."""
    texts = []
    for c in data["choices"]:
        message = c.get("message") or {}
        calls = message.get("tool_calls") or []
        tokens = [[e["token"]] + [t["token"] for t in e["top_logprobs"]]
                  for e in ((c.get("logprobs") or {}).get("content") or [])]
        texts.append(json.dumps([c.get("text", message.get("content")), [t["function"] for t in calls], tokens]))
    return "\n".join(texts)


# -- HTTP ---------------------------------------------------------------------------------------------
def post(base: str, body: bytes, timeout: float = 300, path: str = "/v1/chat/completions") -> tuple[int, dict | str]:
    u = urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        return -1, repr(exc)
    finally:
        conn.close()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, raw.decode("utf-8", "replace")


def never_ending_body(base: str, limit_s: float = 30) -> str:
    u = urlparse(base)
    with socket.create_connection((u.hostname, u.port), timeout=limit_s) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n")
        sock.settimeout(0.2)
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit_s:
            try:
                return sock.recv(4096).split(b"\r\n", 1)[0].decode()
            except socket.timeout:
                with contextlib.suppress(OSError):
                    sock.sendall(b"1\r\n \r\n")
    return ""


class _Dripper(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        with contextlib.suppress(OSError):
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            for _ in range(100):
                self.wfile.write(b"z")
                self.wfile.flush()
                time.sleep(0.1)

    def log_message(self, *args):
        pass


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2 ** 20


# -- the run ------------------------------------------------------------------------------------------
#: the soak server's flags beside the engine, port, threads and name
SOAK_ARGS = ("--max-batch", "1", "--allow-remote-images", "--remote-timeout", "2", "--body-timeout", "2",
             "--max-video-bytes", str(8 * 2 ** 20))


def tiny_engine(preset: str = "qwen2.5-vl-tiny", name: str = "soak_qwen2.5-vl-tiny", form: str = "auto") -> Path:
    """The preset's fp32 engine dir (decoder form ``form``) under benchmarks/work/<name>, built once."""
    out = ROOT / "benchmarks" / "work" / name
    if not (out / "manifest.json").is_file():
        from coverpruner.export.exporter import ExportOptions, export_model
        from coverpruner.testing.checkpoints import write_checkpoint

        ck = write_checkpoint(out.with_name(out.name + "_ck"), preset=preset, seed=0)
        export_model(ck, out, preset, ExportOptions(dtype="fp32", progress=False, decoder_form=form))
    return out


def start_server(engine: Path, log: Path, args=SOAK_ARGS) -> tuple[subprocess.Popen, str]:
    """coverpruner-serve ENGINE on a free loopback port with ``args``, as its own process -> (process, base URL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "coverpruner.serving.cli", str(engine), "--port", str(port), "--threads", "1",
           "--model-name", "tiny", "--log-level", "warning", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 300:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}; see {log}")
        with contextlib.suppress(OSError):
            http.client.HTTPConnection("127.0.0.1", port, timeout=2).request("GET", "/health")
            return proc, url
        time.sleep(0.25)
    raise SystemExit("server not healthy after 300 s")


def run(engine: Path, minutes: float, warmup_s: float, tag: str, slack_mb: float) -> dict:
    valid, errors = valid_requests(), client_errors()
    drip = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Dripper)
    drip.daemon_threads = True
    threading.Thread(target=drip.serve_forever, daemon=True).start()
    remote = json.dumps({"model": "tiny", "max_tokens": 2, "messages": _msg(
        {"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{drip.server_address[1]}/x.png"}},
        _text("Hi"))}).encode()
    log = RESULTS / f"soak_{tag}.log"
    proc, url = start_server(engine, log)
    t0 = time.monotonic()
    stop = threading.Event()
    samples, events, lock = [], [], threading.Lock()
    answers, changed, fivexx, slow, failed = {}, [], [], [], []
    counts = {"valid": 0, "client_error": 0, "slow_attack": 0}

    def note(kind, name, status, seconds):
        with lock:
            events.append({"t": round(time.monotonic() - t0, 2), "kind": kind, "name": name, "status": status,
                           "s": round(seconds, 3)})

    def sampler():
        while not stop.is_set():
            samples.append((round(time.monotonic() - t0, 2), rss_mb(proc.pid)))
            time.sleep(0.5)

    def valid_client(offset: int):
        names, i = list(valid), offset
        while not stop.is_set():
            name = names[i % len(names)]
            i += 1
            s = time.monotonic()
            body = dict(valid[name])
            path = body.pop("_path", "/v1/chat/completions")
            status, data = post(url, json.dumps(body).encode(), path=path)
            note("valid", name, status, time.monotonic() - s)
            text = answer_of(data) if status == 200 else f"HTTP {status}: {data}"
            if status != 200:
                failed.append({"name": name, "status": status, "body": str(data)[:300]})
            with lock:
                counts["valid"] += 1
                first = answers.setdefault(name, text)
                if text != first:
                    changed.append({"name": name, "first": first, "now": text, "t": time.monotonic() - t0})

    def hostile_client():
        names, i = list(errors) + ["never_ending_body", "header_dripping_remote"], 0
        while not stop.is_set():
            name = names[i % len(names)]
            i += 1
            s = time.monotonic()
            if name == "never_ending_body":
                line = never_ending_body(url)
                status = int(line.split()[1]) if line.startswith("HTTP/") else -1
            elif name == "header_dripping_remote":
                status, _ = post(url, remote)
            else:
                path, body = errors[name]
                status, data = post(url, body, path=path)
                if not (400 <= status < 500 and isinstance(data, dict) and "error" in data):
                    fivexx.append({"name": name, "status": status, "body": str(data)[:300]})
            took = time.monotonic() - s
            note("hostile", name, status, took)
            with lock:
                counts["slow_attack" if name in ("never_ending_body", "header_dripping_remote") else
                       "client_error"] += 1
            if name in ("never_ending_body", "header_dripping_remote") and (status >= 500 or took > 2.0 + 1.0):
                slow.append({"name": name, "status": status, "s": took})
            time.sleep(0.2)

    threads = [threading.Thread(target=sampler, daemon=True), threading.Thread(target=hostile_client, daemon=True)]
    threads += [threading.Thread(target=valid_client, args=(k,), daemon=True) for k in (0, 2)]
    for t in threads:
        t.start()
    try:
        while time.monotonic() - t0 < minutes * 60:
            time.sleep(15)
            print(f"{time.monotonic() - t0:6.0f} s  RSS {samples[-1][1] if samples else 0:7.0f} MB  "
                  f"{counts}  changed {len(changed)}  5xx {len(fivexx)}", flush=True)
    finally:
        stop.set()
        for t in threads[1:]:
            t.join(timeout=320)
        time.sleep(1.0)
        idle = rss_mb(proc.pid)
        proc.terminate()
        proc.wait(60)
        drip.shutdown()
    after_warmup = [r for t, r in samples if warmup_s <= t <= warmup_s + 60]
    late = [r for t, r in samples if t >= minutes * 60 / 2]
    warm_peak = max(after_warmup) if after_warmup else float("nan")
    late_peak = max(late) if late else float("nan")
    flat = bool(late_peak <= warm_peak + slack_mb)
    return {
        "command": "python " + " ".join(sys.argv), "engine": str(engine), "minutes": minutes, "warmup_s": warmup_s,
        "counts": counts, "valid_answers": answers, "changed_answers": changed, "client_error_not_4xx": fivexx,
        "slow_attacks_not_cut": slow, "rss_mb": {"start": samples[0][1] if samples else None,
                                                  "warm_minute_peak": warm_peak, "second_half_peak": late_peak,
                                                  "idle_at_end": idle, "slack": slack_mb},
        "valid_not_200": failed,
        "checks": {"every_valid_request_answered": not failed, "no_answer_changed": not changed, "no_5xx_for_client_errors": not fivexx,
                   "slow_attacks_cut_near_deadline": not slow, "rss_flat_after_warmup": flat},
        "samples": samples, "events": events,
    }


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, r = zip(*report["samples"])
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot(t, r, lw=1, color="k", label="server RSS")
    marks = {"video_16f_448": ("tab:blue", "16-frame 448x448 video"), "video_64f_2048": ("tab:red", "64 x 2048^2 video (4xx)"),
             "100k_parts": ("tab:orange", "100k parts (4xx)")}
    for name, (color, label) in marks.items():
        xs = [e["t"] for e in report["events"] if e["name"] == name]
        if xs:
            ax.scatter(xs, [min(r)] * len(xs), marker="|", s=80, color=color, label=label)
    ax.axvline(report["warmup_s"], ls=":", color="grey", label="end of warm-up")
    ax.set_xlabel("seconds")
    ax.set_ylabel("RSS (MB)")
    c = report["checks"]
    ax.set_title(f"soak {report['minutes']:g} min: {report['counts']}; " +
                 ", ".join(k for k, v in c.items() if v) + (" | FAILED: " + ", ".join(k for k, v in c.items() if not v)
                                                             if not all(c.values()) else ""), fontsize=8)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", type=Path, help="a Qwen2.5-VL engine dir (default: the tiny preset, built once)")
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=45.0, help="seconds before RSS must stay flat")
    ap.add_argument("--rss-slack-mb", type=float, default=100.0,
                    help="how far the second half's RSS peak may rise above the first minute after warm-up")
    ap.add_argument("--tag", default="qwen2.5-vl-tiny_cpu")
    args = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = run(args.engine or tiny_engine(), args.minutes, args.warmup, args.tag, args.rss_slack_mb)
    out = RESULTS / f"soak_{args.tag}.json"
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(out)
    plot(report, out.with_suffix(".png"))
    print(json.dumps({k: report[k] for k in ("counts", "rss_mb", "checks")}, indent=1))
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
