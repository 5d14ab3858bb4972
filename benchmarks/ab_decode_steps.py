"""Decode steps of two decoder graphs round-robin in one process (a quick A/B of a decoder change, or ours against
onnxruntime-genai's graph), in both session-creation orders.

Each graph gets a bench_decoder.Runner (batch 1, KV and states bound in place) on the checkpoint's dims; a step
feeds one token at --past cached rows (zero cache: a decode step's cost does not depend on the cached values). A
round runs, per graph, one dropped step (the first after the other session's) then --block timed steps; the
graphs alternate which goes first each round. The whole is done twice, the sessions created A then B, then B then
A: in one process the session created second decoded ~2-3 % faster on this 2-core VM (where its weights land in
memory), so a single order biases the ratio. Per order: the median of the per-round ratios B / A; the two orders'
medians multiply to the ratio squared and divide to the bias squared, so ratio = sqrt(first * second) is free of it.

    python benchmarks/ab_decode_steps.py --checkpoint W/qwen3.5-4b-4l \\
        A=W/qwen3.5-4b-4l-fp32/decoder.onnx B=W/qwen3.5-4b-4l-fp32/decoder.onnx   # an A/A: the bias alone
    python benchmarks/ab_decode_steps.py --checkpoint W/qwen3.5-4b-4l --kind-b genai \\
        A=W/qwen3.5-4b-4l-fp32/decoder.onnx B=W/qwen3.5-4b-4l-genai-fp32/model.onnx
Writes benchmarks/results/ab_decode_steps_<checkpoint dir name>.json with --out-tag.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def one_order(bench, graphs: list, kinds: dict, cfg: dict, embed, args) -> dict:
    """Sessions created in the order of ``graphs`` [(label, path)]; per-round mean ms of each and B / A ratios."""
    runners = {label: bench.Runner(kinds[label], path, cfg, args.past + 8, args.threads) for label, path in graphs}
    x, pos = embed([42]), np.full((3, 1), args.past + 5, np.int64)
    times = {label: [] for label in runners}
    for r in range(args.rounds + 1):  # round 0 warms both up and is dropped
        for label in (list(runners) if r % 2 == 0 else list(runners)[::-1]):
            runners[label].step(x, pos, args.past)  # the first step after the other session's: dropped
            t = []
            for _ in range(args.block):
                t0 = time.perf_counter()
                runners[label].step(x, pos, args.past)
                t.append(time.perf_counter() - t0)
            if r:
                times[label].append(float(np.mean(t)) * 1e3)
    del runners
    ratios = [b / a for a, b in zip(times["A"], times["B"])]
    return {"created": [label for label, _ in graphs], "ms": times, "median_ms": {k: statistics.median(v) for k, v in
                                                                                 times.items()},
            "ratio_b_over_a_rounds": ratios, "ratio_b_over_a_median": statistics.median(ratios)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("graphs", nargs=2, help="A=path B=path")
    p.add_argument("--checkpoint", type=Path, required=True, help="the HF checkpoint dir both graphs come from")
    p.add_argument("--kind-a", default="ours", choices=("ours", "genai"), help="A's inputs (default ours)")
    p.add_argument("--kind-b", default="ours", choices=("ours", "genai"), help="B's inputs (default ours)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--block", type=int, default=4, help="timed steps per graph per round")
    p.add_argument("--past", type=int, default=1059, help="cached rows at the decode step")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out-tag", default=None, help="write benchmarks/results/ab_decode_steps_<tag>.json")
    args = p.parse_args(argv)
    graphs = dict(g.split("=", 1) for g in args.graphs)
    if set(graphs) != {"A", "B"}:
        raise SystemExit(f"graphs: expected A=path B=path, got {args.graphs}")
    import bench_decoder as bench

    cfg, embed = bench.text_config(args.checkpoint), bench.Embedder(args.checkpoint)
    kinds = {"A": args.kind_a, "B": args.kind_b}
    pairs = [("A", Path(graphs["A"])), ("B", Path(graphs["B"]))]
    orders = [one_order(bench, pairs, kinds, cfg, embed, args), one_order(bench, pairs[::-1], kinds, cfg, embed, args)]
    first, second = orders[0]["ratio_b_over_a_median"], orders[1]["ratio_b_over_a_median"]
    result = {"benchmark": "ab_decode_steps", "graphs": graphs, "kinds": kinds, "orders": orders,
              "ratio_b_over_a": (first * second) ** 0.5, "second_created_factor": (first / second) ** 0.5,
              "command": "python benchmarks/ab_decode_steps.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "load_average": list(os.getloadavg()), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(f"B / A per-round medians: created A first {first:.4f}, B first {second:.4f} -> B / A "
          f"{result['ratio_b_over_a']:.4f}, second-created factor {result['second_created_factor']:.4f}")
    if args.out_tag:
        out = ROOT / "benchmarks" / "results" / f"ab_decode_steps_{args.out_tag}.json"
        out.write_text(json.dumps(result, indent=1))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
