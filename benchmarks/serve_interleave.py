"""Streams that keep decoding while an image request is admitted (issue 35's measurement), through one batched
coverpruner-serve worker, in one run.

  streams    STREAMS clients stream long answers (ignore_eos, logprobs on: one SSE chunk per token, so a chunk's
             arrival is its token's) about the demo image at budget STREAM_BUDGET.
  newcomer   once every stream has sent WARM_TOKENS tokens, one image request arrives: an image new to the server's
             caches (a fresh random picture each time: no vision or prefix reuse), budget "full" (every visual token:
             576 for LLaVA-1.5), streamed; its time to first token (TTFT) is timed from its send.
  idle       the same kind of request (another fresh picture) on the same server with nothing else running: the
             TTFT it is compared with. Rounds alternate idle and loaded (round-robin: a slow spell of a shared
             machine hits both alike).

Per stream: the gaps between consecutive tokens; its median gap outside the admission (the gaps that end before the
newcomer's send or start after its first token: the stream's normal pace) and its worst gap during the admission
(any gap that overlaps the interval from the newcomer's send to its first token). The acceptance reads
worst / median <= 2.5 for every stream and loaded / idle TTFT <= 2.
"""

from __future__ import annotations

import io
import json
import statistics
import threading
import time
import urllib.request

import numpy as np

STREAMS = 3
STREAM_BUDGET = 64
STREAM_TOKENS = 400
WARM_TOKENS = 16
AFTER_TOKENS = 16  # tokens each stream must still send after the newcomer's first token before they are closed
PROMPT = "Describe this picture in detail."
NEW_PROMPT = "What is in this image?"


def fresh_image_url(seed: int) -> str:
    """A PNG data URL of a random 640x480 picture (never seen by the server's caches)."""
    import base64

    from PIL import Image

    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _sse(url: str, body: dict, on_chunk, stop: threading.Event | None = None) -> float:
    """POST a streamed chat completion; on_chunk(t, chunk) for every data chunk with choices; returns the send time.
    Stops reading (closing the connection) once ``stop`` is set."""
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=1200) as resp:
        for line in resp:
            if stop is not None and stop.is_set():
                break
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk.get("choices"):
                on_chunk(time.perf_counter(), chunk["choices"][0])
    return t0


def newcomer(url: str, seed: int) -> dict:
    """One image request (a fresh picture, budget full) -> {"send": t, "first": t of its first content, "ttft_s"}."""
    got = {}

    def on_chunk(t, choice):
        if "first" not in got and (choice["delta"].get("content") or choice.get("logprobs")):
            got["first"] = t

    body = {"model": "bench", "max_tokens": 4, "temperature": 0, "logprobs": True,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": fresh_image_url(seed)}},
                                                      {"type": "text", "text": NEW_PROMPT}]}],
            "budget": "full", "ignore_eos": True}
    got["send"] = _sse(url, body, on_chunk)
    got["ttft_s"] = got["first"] - got["send"]
    return got


def loaded_round(url: str, image_url: str, seed: int) -> dict:
    """STREAMS streams; the newcomer once all are warm; the streams closed AFTER_TOKENS tokens after its first."""
    times = [[] for _ in range(STREAMS)]
    stop = threading.Event()
    after = threading.Event()

    def stream(i):
        def on_chunk(t, choice):
            if choice.get("logprobs") or choice["delta"].get("content"):
                times[i].append(t)
        body = {"model": "bench", "max_tokens": STREAM_TOKENS, "temperature": 0, "logprobs": True,
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                                          {"type": "text", "text": f"{PROMPT} ({i})"}]}],
                "budget": STREAM_BUDGET, "ignore_eos": True}
        try:
            _sse(url, body, on_chunk, stop)
        except OSError:
            pass

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(STREAMS)]
    for t in threads:
        t.start()
    while min(len(t) for t in times) < WARM_TOKENS:
        time.sleep(0.01)
    new = newcomer(url, seed)
    marks = [len(t) for t in times]
    while min(len(t) - m for t, m in zip(times, marks)) < AFTER_TOKENS and all(th.is_alive() for th in threads):
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join(60)
    streams = []
    for ts in times:
        gaps = np.diff(ts)
        spans = list(zip(ts[:-1], ts[1:]))
        during = [g for g, (a, b) in zip(gaps, spans) if b > new["send"] and a < new["first"]]
        normal = [g for g, (a, b) in zip(gaps, spans) if b <= new["send"] or a >= new["first"]]
        median = float(statistics.median(normal[1:]))  # the first gap waits for the others' admissions
        worst = float(max(during)) if during else float("nan")
        streams.append({"tokens": len(ts), "median_gap_s": median, "normal_gaps": len(normal) - 1,
                        "worst_gap_during_admission_s": worst,
                        "worst_over_median": worst / median, "t": [t - new["send"] for t in ts]})
    return {"newcomer": {"ttft_s": new["ttft_s"], "admission_s": [0.0, new["first"] - new["send"]]},
            "streams": streams}


def measure(url: str, image_url: str, rounds: int, seed0: int = 1000) -> dict:
    """Round-robin idle / loaded newcomers; summary ratios over the rounds (medians of TTFT, worst of gaps)."""
    idle, loaded = [], []
    for r in range(rounds):
        for kind in (("idle", "loaded") if r % 2 == 0 else ("loaded", "idle")):
            seed = seed0 + 2 * r + (kind == "loaded")
            if kind == "idle":
                idle.append(newcomer(url, seed)["ttft_s"])
                print(f"[interleave] idle newcomer TTFT {idle[-1]:.2f} s", flush=True)
            else:
                loaded.append(loaded_round(url, image_url, seed))
                s = loaded[-1]
                print(f"[interleave] loaded newcomer TTFT {s['newcomer']['ttft_s']:.2f} s; streams worst/median "
                      f"{[round(x['worst_over_median'], 2) for x in s['streams']]} (median gaps "
                      f"{[round(x['median_gap_s'] * 1e3) for x in s['streams']]} ms)", flush=True)
    ttft_idle = statistics.median(idle)
    ttft_loaded = statistics.median(r["newcomer"]["ttft_s"] for r in loaded)
    worst = max(x["worst_over_median"] for r in loaded for x in r["streams"])
    return {"idle_ttft_s": idle, "loaded": loaded, "median_idle_ttft_s": ttft_idle,
            "median_loaded_ttft_s": ttft_loaded, "ttft_loaded_over_idle": ttft_loaded / ttft_idle,
            "worst_gap_over_median": worst}


def plot(path, data: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = data["measure"]["loaded"]
    fig, axes = plt.subplots(len(rounds), 1, figsize=(10, 3.2 * len(rounds)), squeeze=False)
    for ax, r in zip(axes[:, 0], rounds):
        lo, hi = r["newcomer"]["admission_s"]
        ax.axvspan(lo, hi, color="C3", alpha=0.15, label=f"admission of a 576-token image (TTFT {hi:.2f} s)")
        for i, s in enumerate(r["streams"]):
            t = np.asarray(s["t"])
            ax.plot(t[1:], np.diff(t) * 1e3, ".-", color=f"C{i}", lw=0.8, ms=3,
                    label=f"stream {i}: median outside {s['median_gap_s'] * 1e3:.0f} ms, worst during admission "
                          f"{s['worst_gap_during_admission_s'] * 1e3:.0f} ms ({s['worst_over_median']:.2f}x)")
        ax.set_xlabel("seconds from the newcomer's send")
        ax.set_ylabel("gap to previous token (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    m = data["measure"]
    fig.suptitle(f"{STREAMS} streams decoding while a new 576-token image is admitted; "
                 f"newcomer TTFT {m['median_loaded_ttft_s']:.2f} s vs idle {m['median_idle_ttft_s']:.2f} s "
                 f"({m['ttft_loaded_over_idle']:.2f}x); worst gap / normal median {m['worst_gap_over_median']:.2f}x\n"
                 f"{data['setup']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
