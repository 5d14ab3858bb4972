"""n answers from one request vs n separate requests (issue 30): one request with ``n`` = N against N concurrent
requests with the same image and question, through one batched server (coverpruner-serve --workers 1
--max-batch 8), in one run.

A request with n forks its prefix after one vision pass, one selection and one prefill into N batch slots
(runtime/engine.py ``_fork``); N separate requests each pay their own. Both sides decode ``new_tokens`` tokens per
answer (ignore_eos, greedy: every answer is the same text, checked) side by side in one batch, so the difference is
the admission work. Measured: wall time until the last answer is complete, rounds alternating the two sides
(fork, separate, separate, fork, ...), medians; ratio fork / separate (the issue's target: <= 0.5). Run on a server
with the prefix cache off (--prefix-cache-mb 0: separate requests cannot reuse each other's prefill by
timing luck) and on the default one (256 MB: the vision and selection stores can serve the later separate
requests' stages).
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

QUESTION = "What is the color of the house next to the tree, and is there a stop sign in the picture?"
BUDGET = 64


def _messages(image_url: str) -> list:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                         {"type": "text", "text": QUESTION}]}]


def _fork(client, image_url: str, n: int, new_tokens: int) -> tuple[float, list[str]]:
    t0 = time.perf_counter()
    r = client.chat.completions.create(model="bench", messages=_messages(image_url), max_tokens=new_tokens, n=n,
                                       temperature=0, extra_body={"budget": BUDGET, "ignore_eos": True})
    return time.perf_counter() - t0, [c.message.content for c in r.choices]


def _separate(client, image_url: str, n: int, new_tokens: int) -> tuple[float, list[str]]:
    def one(_):
        r = client.chat.completions.create(model="bench", messages=_messages(image_url), max_tokens=new_tokens,
                                           temperature=0, extra_body={"budget": BUDGET, "ignore_eos": True})
        return r.choices[0].message.content

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as ex:
        answers = list(ex.map(one, range(n)))
    return time.perf_counter() - t0, answers


def measure(client, image_url: str, n: int, rounds: int, new_tokens: int, label: str) -> dict:
    """Rounds alternating fork / separate -> medians, ratio, and whether every answer equals the first."""
    # warm-up (sessions, allocator), text only: an image pass would cost as much as a measured side here
    client.chat.completions.create(model="bench", messages=[{"role": "user", "content": "Hi."}], max_tokens=2)
    rows, answers = {"fork": [], "separate": []}, []
    for r in range(rounds):
        for side in (("fork", "separate") if r % 2 == 0 else ("separate", "fork")):
            wall, got = (_fork if side == "fork" else _separate)(client, image_url, n, new_tokens)
            rows[side].append(wall)
            answers += got
            print(f"[{label}] {side}: {wall:.2f} s", flush=True)
    med = {side: statistics.median(v) for side, v in rows.items()}
    return {"wall_s": rows, "median_wall_s": med, "x_fork_over_separate": med["fork"] / med["separate"],
            "answers_equal": all(a == answers[0] for a in answers)}


def plot(path, data: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(data["servers"])
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    width = 0.38
    for k, side in enumerate(("separate", "fork")):
        vals = [data["servers"][c]["median_wall_s"][side] for c in cases]
        bars = ax.bar([i + (k - 0.5) * width for i in range(len(cases))], vals, width,
                      label=f"{data['n']} separate requests" if side == "separate" else f"one request, n={data['n']}")
        ax.bar_label(bars, fmt="%.2f s", fontsize=8)
    ax.set_xticks(range(len(cases)),
                  [f"{c}\nfork/separate = {data['servers'][c]['x_fork_over_separate']:.2f}x" for c in cases])
    ax.set_ylabel("time to the last answer (s, median)")
    ax.set_title(f"n={data['n']} answers, {data['new_tokens']} tokens each: {data['engine_name']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
