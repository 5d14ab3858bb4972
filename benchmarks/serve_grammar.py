"""Decode tokens/s of 8 streams under a json_schema against 8 without, through one batched server (issue 30).

One coverpruner-serve (--workers 1 --max-batch 8) on the ORT-form engine dir; each round sends 8 concurrent chat
completions with ``response_format`` json_schema (SCHEMA: an enum and an array of exactly ITEMS single-digit
integers, so every answer is long and about equally long) and 8 without (``ignore_eos``, stream i asked for as
many tokens as its constrained answer had), in alternating order over ``rounds`` rounds (a slow spell on a shared
machine hits both alike). Decode time = wall - every request's admission (timings total - decode, as
serve_streams.py); decode tokens/s = sum over streams of (completion tokens - 1) / decode time. Every constrained
answer is checked to parse and to hold ITEMS integers.
"""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

QUESTIONS = ("What is the color of the house next to the tree?", "Is there a stop sign in the picture?",
             "How many windows can you see?", "Describe the sky.", "What is on the left side of the road?",
             "Is it day or night?", "What material is the roof made of?", "Name three objects in the image.")
BUDGET = 64
STREAMS = 8
ITEMS = 24
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["kind", "values"],
          "properties": {"kind": {"enum": ["house", "tree", "road", "sky"]},
                         "values": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                                    "minItems": ITEMS, "maxItems": ITEMS}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "scene", "schema": SCHEMA, "strict": True}}


def level(client, image_url: str, lengths: list[int] | None) -> dict:
    """8 concurrent requests: constrained (lengths None) or plain with lengths[i] tokens -> decode tokens/s."""
    def one(i):
        msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                             {"type": "text", "text": QUESTIONS[i]}]}]
        if lengths is None:
            kw = dict(max_tokens=4 * ITEMS + 32, response_format=FORMAT, extra_body={"budget": BUDGET})
        else:
            kw = dict(max_tokens=lengths[i], extra_body={"budget": BUDGET, "ignore_eos": True})
        r = client.chat.completions.create(model="bench", messages=msgs, temperature=0, **kw)
        t = r.model_extra["coverpruner"]["timings_ms"]
        return (r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens,
                (t["total"] - t["decode"]) / 1e3)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(STREAMS) as ex:
        out = list(ex.map(one, range(STREAMS)))
    wall = time.perf_counter() - t0
    decode = wall - sum(x[3] for x in out)
    tokens = [x[2] for x in out]
    if lengths is None:
        for text, finish, _, _ in out:
            value = json.loads(text)
            assert finish == "stop" and len(value["values"]) == ITEMS, (finish, text)
    return {"wall_s": wall, "decode_s": decode, "completion_tokens": tokens,
            "decode_tokens_per_s": sum(n - 1 for n in tokens) / decode}


def run_server(make_server, make_client, image_url: str, rounds: int) -> dict:
    """Warm-up (one constrained level: the answers' lengths), then ``rounds`` rounds of both kinds alternating."""
    server = make_server()
    try:
        client = make_client(server.url)
        lengths = level(client, image_url, None)["completion_tokens"]
        rows = {"json_schema": [], "plain": []}
        for r in range(rounds):
            for kind in (("json_schema", "plain") if r % 2 == 0 else ("plain", "json_schema")):
                rows[kind].append(level(client, image_url, None if kind == "json_schema" else lengths))
    finally:
        server.stop()
    med = {k: statistics.median(x["decode_tokens_per_s"] for x in v) for k, v in rows.items()}
    return {"rows": rows, "completion_tokens": lengths, "median_decode_tokens_per_s": med,
            "json_over_plain": med["json_schema"] / med["plain"]}


def plot(path, data: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["server"]["rows"]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for i, kind in enumerate(("plain", "json_schema")):
        xs = [x["decode_tokens_per_s"] for x in rows[kind]]
        ax.scatter([i] * len(xs), xs, alpha=0.6)
        ax.bar(i, statistics.median(xs), alpha=0.35, label=f"{kind}: median {statistics.median(xs):.1f}")
    ax.set_xticks([0, 1], ["8 streams, no format", "8 streams, json_schema"])
    ax.set_ylabel("aggregate decode tokens/s")
    ax.set_title(f"constrained decoding: {data['server']['json_over_plain']:.2f}x (target >= 0.9x)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
