"""The engine loop through the default server (issue 25's acceptance), on one ORT-form engine dir, in one run.

  throughput  coverpruner-serve --workers 1 --max-batch 8 (prefix cache on, the default): 8 clients each send one
              chat completion of ``new_tokens`` tokens (ignore_eos) at once vs one client alone; aggregate
              tokens/s = requests x new_tokens / wall, admission (vision, probe, selection, prefill) included.
              Stream i asks QUESTIONS[i] about the same image; rounds alternate 1, 8, 8, 1, ...; medians.
  ttft        8 concurrent two-turn conversations (turn 1: image + QUESTIONS[i], TURN1_TOKENS tokens; turn 2: the
              history + a follow-up, streamed): turn-2 time to the first content chunk, on a server with the
              prefix cache (--prefix-cache-mb 256) and on one without (0), each conversation's turn 2 sent as
              soon as its turn 1 is answered. Ratio of medians (off / on); the answers of both servers must agree.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from serve_streams import BUDGET, QUESTIONS

TURN1_TOKENS = 16
TURN2_TOKENS = 4
FOLLOW_UP = "Tell me more about it."


def _user(image_url: str, text: str) -> dict:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                        {"type": "text", "text": text}]}


def _throughput_level(client, image_url: str, c: int, new_tokens: int) -> dict:
    def one(i):
        r = client.chat.completions.create(model="bench", messages=[_user(image_url, QUESTIONS[i])],
                                           max_tokens=new_tokens, temperature=0,
                                           extra_body={"budget": BUDGET, "ignore_eos": True})
        return r.choices[0].message.content, r.usage.completion_tokens

    t0 = time.perf_counter()
    with ThreadPoolExecutor(c) as ex:
        out = list(ex.map(one, range(c)))
    wall = time.perf_counter() - t0
    tokens = sum(n for _, n in out)
    return {"requests": c, "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall,
            "answers": [a for a, _ in out]}


def throughput(client, image_url: str, rounds: int, new_tokens: int) -> dict:
    rows = []
    for r in range(rounds):
        for c in ((1, 8) if r % 2 == 0 else (8, 1)):
            row = _throughput_level(client, image_url, c, new_tokens)
            print(f"[throughput] {c} request(s): {row['tokens_per_s']:.1f} tok/s (wall {row['wall_s']:.1f} s)",
                  flush=True)
            rows.append(row)
    med = {c: statistics.median(r["tokens_per_s"] for r in rows if r["requests"] == c) for c in (1, 8)}
    alone = next(r["answers"][0] for r in rows if r["requests"] == 1)
    return {"rows": rows, "median_tokens_per_s": {str(c): v for c, v in med.items()}, "x_one_request": med[8] / med[1],
            "first_answer_equal_alone": all(r["answers"][0] == alone for r in rows)}


def _conversation(client, image_url: str, i: int) -> dict:
    messages = [_user(image_url, QUESTIONS[i])]
    r = client.chat.completions.create(model="bench", messages=messages, max_tokens=TURN1_TOKENS, temperature=0,
                                       extra_body={"budget": BUDGET})
    messages += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": FOLLOW_UP}]
    t0 = time.perf_counter()
    # ignore_eos: a random-weight model may pick EOS first, and then no content chunk would ever come
    stream = client.chat.completions.create(model="bench", messages=messages, max_tokens=TURN2_TOKENS,
                                            temperature=0, stream=True,
                                            extra_body={"budget": BUDGET, "ignore_eos": True},
                                            stream_options={"include_usage": True})
    ttft, text, cached, end = None, "", None, None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            ttft = ttft if ttft is not None else time.perf_counter() - t0
            text += chunk.choices[0].delta.content
        if chunk.choices and chunk.choices[0].finish_reason and end is None:
            end = time.perf_counter() - t0
        if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens
    # no text at all (tokens that decode to nothing): the answer's end bounds its first token from above
    return {"turn1": r.choices[0].message.content, "turn2": text, "ttft_s": ttft if ttft is not None else end,
            "ttft_is_end": ttft is None, "cached_tokens": cached}


def ttft(client, image_url: str, conversations: int = 8) -> dict:
    with ThreadPoolExecutor(conversations) as ex:
        out = list(ex.map(lambda i: _conversation(client, image_url, i), range(conversations)))
    times = [o["ttft_s"] for o in out]
    print(f"[ttft] turn-2 TTFT median {statistics.median(times):.2f} s, cached {[o['cached_tokens'] for o in out]}",
          flush=True)
    return {"conversations": out, "median_ttft_s": statistics.median(times)}


def plot(path, data: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.8))
    tp = data["throughput"]["median_tokens_per_s"]
    a.bar(["1 request", "8 at once"], [tp["1"], tp["8"]], color=["C0", "C1"])
    a.set_ylabel("aggregate tokens / s (admission included)")
    a.set_title(f"{data['new_tokens']} new tokens each: {data['throughput']['x_one_request']:.2f}x", fontsize=9)
    t = [data["ttft"][k]["median_ttft_s"] for k in ("cache_off", "cache_on")]
    b.bar(["cache off", "cache on"], t, color=["C2", "C3"])
    b.set_ylabel("turn-2 time to first token, s (median of 8)")
    b.set_title(f"8 concurrent two-turn conversations: {t[0] / t[1]:.2f}x", fontsize=9)
    fig.suptitle(f"coverpruner-serve --max-batch 8, LLaVA-1.5-7B widths, 2 layers, fp32, budget {BUDGET}; "
                 f"load {data['load_average_1min'][0]:.1f} -> {data['load_average_1min'][1]:.1f}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
