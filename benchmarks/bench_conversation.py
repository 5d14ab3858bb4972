"""Turn-2 time to first token with the prefix cache vs without, on the shape-real LLaVA-1.5-7B preset.

The engine: ``coverpruner-make-checkpoint --preset llava-1.5-7b --layers 2`` exported fp32 (random weights, the
real widths: CLIP ViT-L/336 tower, 4096-wide decoder, 2 of its 32 layers), built under --workdir on first use and
reused (benchmarks/bench_pipeline.py's ``prepare``).

Two conversations, both pruned to --budget visual tokens per image with the default demand ("turn"):
  * follow-up: turn 1 [system, user(image A + question)]; turn 2 adds the assistant's answer and a text-only
    question about A;
  * new image: turn 2 adds the answer and user(image B + question).
For each, round-robin ``--repeats`` times on one Pipeline (after a warm-up): with the cache on (--cache-mb), turn
1 then turn 2 (the cache emptied before turn 1); with the cache off (0 MiB), the same two requests. The turn-2
request runs with max_new_tokens=1, so its wall time is its time to first token. Reported: medians of the turn-2
TTFT and of its stage timings, cached_tokens, and the speed-up off / on. Target (issue 19): >= 3x.

    python benchmarks/bench_conversation.py                 # ~2 GB checkpoint, ~4 GB engine dir, a few minutes
    python benchmarks/bench_conversation.py --repeats 1     # quick

Writes benchmarks/results/conversation_llava-1.5-7b-2l_<tag>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pipeline import prepare  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("preprocess", "vision", "embed", "probe", "select", "prefill")
SYSTEM = "You answer briefly."
Q1 = "What is in the picture?"
ANSWER = "A small scene with a few objects."
Q_FOLLOW = "What colour is the largest object?"
Q_NEW = "What changed in this picture?"


def conversations(image_a, image_b) -> dict:
    """name -> (turn-1 messages, turn-2 messages)."""
    turn1 = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": [{"type": "image", "image": image_a}, {"type": "text", "text": Q1}]}]
    history = turn1 + [{"role": "assistant", "content": ANSWER}]
    return {
        "follow-up": (turn1, history + [{"role": "user", "content": Q_FOLLOW}]),
        "new image": (turn1, history + [{"role": "user", "content": [{"type": "image", "image": image_b},
                                                                      {"type": "text", "text": Q_NEW}]}]),
    }


def turn2(pipe, turn1, turn2_messages, budget, cache_bytes):
    """Turn 1 then turn 2 on ``pipe`` with a cache of ``cache_bytes`` (0: off) -> (ttft seconds, result)."""
    from coverpruner.runtime.prefix_cache import PrefixCache

    pipe.prefix_cache = PrefixCache(cache_bytes)
    pipe.chat(turn1, budget=budget, max_new_tokens=8, ignore_eos=True)
    t = time.perf_counter()
    result = pipe.chat(turn2_messages, budget=budget, max_new_tokens=1)
    return time.perf_counter() - t, result


def plot(path: Path, rows: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels, bottoms = [], []
    bars = [(name, mode) for name in rows for mode in ("off", "on")]
    for k, (name, mode) in enumerate(bars):
        bottom = 0.0
        for s, stage in enumerate(STAGES):
            v = rows[name][mode]["timings"][stage]
            ax.bar(k, v, bottom=bottom, color=f"C{s}", label=stage if k == 0 else None)
            bottom += v
        ax.text(k, bottom, f"{rows[name][mode]['ttft']:.2f} s", ha="center", va="bottom", fontsize=8)
        labels.append(f"{name}\ncache {mode}")
        bottoms.append(bottom)
    for k, name in enumerate(rows):
        ax.text(2 * k + 0.5, max(bottoms) * 1.08, f"{rows[name]['speedup']:.1f}x", ha="center", fontweight="bold")
    ax.set_xticks(range(len(bars)), labels)
    ax.set_ylabel("turn-2 time to first token (s)")
    ax.set_ylim(0, max(bottoms) * 1.2)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "work", help="checkpoint/engine cache")
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the shape-real preset (default 2)")
    p.add_argument("--engine", type=Path, default=None, help="an existing engine dir (skips the build)")
    p.add_argument("--budget", type=int, default=64, help="visual tokens kept per image (default 64)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per conversation and mode (median)")
    p.add_argument("--cache-mb", type=float, default=256, help="prefix cache size of the 'on' runs (MiB)")
    p.add_argument("--threads", type=int, default=None, help="ORT intra-op threads (default: all cores)")
    p.add_argument("--tag", default="cpu", help="results file tag (default cpu)")
    args = p.parse_args(argv)

    from PIL import ImageOps

    from coverpruner.runtime import Pipeline

    engine = args.engine or prepare(args.workdir, args.layers, "fp32", "llava-1.5-7b")
    pipe = Pipeline.load(engine, threads=args.threads)
    from coverpruner.images import load_image

    image_a = load_image(ROOT / "coverpruner" / "assets" / "demo.png").convert("RGB")
    image_b = ImageOps.mirror(image_a)
    convs = conversations(image_a, image_b)
    cache_bytes = int(args.cache_mb * 2 ** 20)
    for name, (t1, t2) in convs.items():  # warm-up (sessions, allocations)
        turn2(pipe, t1, t2, args.budget, cache_bytes)
    runs = {name: {"off": [], "on": []} for name in convs}
    for _ in range(args.repeats):
        for name, (t1, t2) in convs.items():
            for mode, size in (("off", 0), ("on", cache_bytes)):
                ttft, res = turn2(pipe, t1, t2, args.budget, size)
                runs[name][mode].append((ttft, res))
                print(f"{name:9s} cache {mode:3s}: turn-2 TTFT {ttft:.3f} s, cached {res.cached_tokens}, "
                      f"prefill {res.prefill_tokens}, prompt {res.prompt_tokens}", flush=True)
    rows = {}
    for name, modes in runs.items():
        rows[name] = {}
        for mode, items in modes.items():
            rows[name][mode] = {
                "ttft": statistics.median(t for t, _ in items),
                "timings": {s: statistics.median(r.timings[s] for _, r in items) for s in STAGES},
                "cached_tokens": items[0][1].cached_tokens, "prefill_tokens": items[0][1].prefill_tokens,
                "prompt_tokens": items[0][1].prompt_tokens, "ttft_runs": [t for t, _ in items],
                "token_ids": items[0][1].token_ids,
            }
        rows[name]["speedup"] = rows[name]["off"]["ttft"] / rows[name]["on"]["ttft"]
        rows[name]["same_tokens"] = rows[name]["off"]["token_ids"] == rows[name]["on"]["token_ids"]
    out = {
        "benchmark": "conversation turn-2 time to first token, prefix cache on vs off",
        "command": "python benchmarks/bench_conversation.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "preset": "llava-1.5-7b", "layers": args.layers, "precision": "fp32", "budget": args.budget,
        "cache_mb": args.cache_mb, "repeats": args.repeats, "threads": args.threads,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "timing_unit": "s",
        "target_speedup": 3.0, "conversations": rows,
    }
    tag = f"llava-1.5-7b-{args.layers}l_{args.tag}"
    res_dir = ROOT / "benchmarks" / "results"
    (res_dir / f"conversation_{tag}.json").write_text(json.dumps(out, indent=2))
    plot(res_dir / f"conversation_{tag}.png", rows,
         f"LLaVA-1.5-7B width, {args.layers} layers, fp32 CPU ({os.cpu_count()} cores), budget {args.budget}/image")
    for name, row in rows.items():
        print(f"{name}: off {row['off']['ttft']:.3f} s, on {row['on']['ttft']:.3f} s -> {row['speedup']:.1f}x "
              f"(cached {row['on']['cached_tokens']} of {row['on']['prefill_tokens']} rows; same tokens: "
              f"{row['same_tokens']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
