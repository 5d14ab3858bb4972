"""Select-stage time of CoverPruner, DivPrune and the peers' DART and CDPruner, one run, round-robin.

The selector calls the pipeline's select stage makes (runtime/pipeline.py ``_select_one``): the numpy selectors of
coverpruner.selection on V float32 [n, d] and the layer-0 relevance [n], and the standard-op ONNX graphs on ONNX
Runtime's CPU EP (selector.onnx for coverpruner, export/peer_graphs.py for dart and cdpruner; divprune has none).
Three shapes, each at 11.1 % of the tokens (the paper's 64 of 576):

    llava-1.5      n =   576, d = 4,096, m =  64   (336 px, 24 x 24 patches)
    qwen2.5-vl     n = 1,296, d = 3,584, m = 144   (1008 x 1008: 36 x 36 merged tokens)
    llava-next     n = 2,880, d = 4,096, m = 320   (672 x 672: 4 tiles + base)

Features are synthetic and seeded (n / 8 cluster centres + N(0, 0.5^2) noise, like projector outputs in that
tokens come in groups of similar patches): selection time depends on n, d and m, and the coverage greedy's
(a little) on how fast coverage saturates. Each repeat times every (shape, method, backend) once in turn, so a slow
spell on a shared machine hits all alike; the JSON has every time, the medians and each one's ratio to
coverpruner's numpy time at that shape.

    python benchmarks/bench_peer_selectors.py            # 3 repeats
    python benchmarks/bench_peer_selectors.py --quick    # 1 repeat

Writes benchmarks/results/peer_selectors_cpu[_quick].json and .png.
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = (("llava-1.5", 576, 4096, 64), ("qwen2.5-vl", 1296, 3584, 144), ("llava-next", 2880, 4096, 320))
METHODS = ("coverpruner", "divprune", "dart", "cdpruner")


def features(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(2, n // 8), d)).astype(np.float32)
    v = centres[rng.integers(0, len(centres), n)] + 0.5 * rng.standard_normal((n, d)).astype(np.float32)
    return np.ascontiguousarray(v, np.float32), rng.random(n).astype(np.float32)


def sessions(threads: int) -> dict:
    import onnxruntime as ort

    from coverpruner.export.peer_graphs import build_peer_selector_model
    from coverpruner.export.selector import build_selector_model

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    models = {"coverpruner": build_selector_model(), "dart": build_peer_selector_model("dart"),
              "cdpruner": build_peer_selector_model("cdpruner")}
    return {name: ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            for name, m in models.items()}


def run_onnx(sess, method: str, v, r, m: int) -> np.ndarray:
    feed = {"image_features": v, "budget": np.array(m, np.int64)}
    if method == "coverpruner":
        feed.update(relevance=r, tau=np.array(0.3, np.float32))
    elif method == "dart":
        feed.update(pivots=np.array(8, np.int64))
    else:
        feed.update(relevance=r, relevance_weight=np.array(1.0, np.float32))
    return sess.run(["keep"], feed)[0]


def plot(path: Path, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summary), figsize=(4.6 * len(summary), 3.6), squeeze=False)
    for ax, (shape, rows) in zip(axes[0], summary.items()):
        labels = list(rows)
        ax.bar(range(len(labels)), [rows[k]["median_s"] * 1e3 for k in labels],
               color=["#1f77b4" if k.endswith("numpy") else "#ff7f0e" for k in labels])
        ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=35, ha="right")
        ax.set_ylabel("select stage, ms (median)")
        ax.set_title(shape, fontsize=9)
    fig.suptitle("Selector time per image: numpy (blue), ONNX Runtime CPU (orange)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="1 repeat")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="ORT intra-op threads")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    from tqdm import tqdm

    from coverpruner.selection import get_selector

    sess = sessions(args.threads)
    data = {name: features(n, d) for name, n, d, _ in SHAPES}
    jobs = [(name, m, method, backend) for name, _, _, m in SHAPES for method in METHODS
            for backend in ("numpy", "onnx") if backend == "numpy" or method in sess]
    times: dict = {f"{name} {method} {backend}": [] for name, _, method, backend in jobs}
    kept: dict = {}
    for _ in tqdm(range(repeats), desc="repeats"):
        for name, m, method, backend in jobs:  # round-robin: every job once per repeat
            v, r = data[name]
            t = time.perf_counter()
            keep = (get_selector(method)(v, r, m) if backend == "numpy" else run_onnx(sess[method], method, v, r, m))
            times[f"{name} {method} {backend}"].append(time.perf_counter() - t)
            kept[f"{name} {method} {backend}"] = np.asarray(keep).tolist()
    summary = {}
    for name, n, d, m in SHAPES:
        base = statistics.median(times[f"{name} coverpruner numpy"])
        rows = {}
        for _, _, method, backend in [j for j in jobs if j[0] == name]:
            key = f"{name} {method} {backend}"
            med = statistics.median(times[key])
            rows[f"{method} {backend}"] = {"median_s": med, "times_s": times[key], "vs_coverpruner_numpy": med / base}
            if backend == "onnx":
                rows[f"{method} {backend}"]["same_as_numpy"] = kept[key] == kept[f"{name} {method} numpy"]
        summary[f"{name}: n={n}, d={d}, m={m}"] = rows
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "peer_selectors_cpu" + ("_quick" if args.quick else "")
    record = {"command": "python benchmarks/bench_peer_selectors.py" + (" --quick" if args.quick else ""),
              "repeats": repeats, "threads": args.threads, "machine": platform.platform(),
              "cpu_count": os.cpu_count(), "results": summary}
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1))
    plot(out / f"{stem}.png", summary)
    for shape, rows in summary.items():
        print(shape)
        for k, row in rows.items():
            same = "" if "same_as_numpy" not in row else f"  same picks as numpy: {row['same_as_numpy']}"
            print(f"  {k:22s} {row['median_s'] * 1e3:9.1f} ms  x{row['vs_coverpruner_numpy']:.2f}{same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
