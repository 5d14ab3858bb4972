"""Coverage selector time and peak memory per backend, image to video sizes, on this machine's CPU.

Rows: n = 576 (LLaVA-1.5), 1,296 (Qwen2.5-VL 1008 px), 2,880 (LLaVA-NeXT), 8,192 and 16,384 (Qwen2.5-VL video),
budgets m = 10 % and 25 % of n, d = 4096 (LLaVA) or 3584 (Qwen). Features are float32, clustered like projector
outputs (n // 8 centres + noise), relevance random. Each (n, m, backend) runs in its own subprocess:

- time: median wall time of one whole selection (similarity + greedy + sorted indices), what a request pays
  (3 repeats up to n = 2,880, 1 above and for the literal reference);
  numpy-family rows also time the similarity alone (utility buffer), the paper's "Sim." column.
- memory: "added" = the process's peak RSS (VmHWM) after the selections minus its RSS just before the first
  one, with the inputs (V [n, d] float32, relevance) already built -- V itself (235 MB at 16,384 x 3,584) is the
  caller's and is not counted.
- same: indices equal to the "reference" row's (literal float64 greedy, n <= 2,880) or, above, to "numpy"'s
  (which equals the literal greedy, tests/selection); float32 rows may differ only at a float32 near-tie, so the
  float64 coverage objective ratio to the compared set is reported too.

Backends: reference (literal, O(m n^2), n <= 2,880), numpy (incremental on the symmetric similarity, float64 up to 2,048 then
float32), lazy (upper-bound greedy, same buffer), onnx (selector.onnx on ONNX Runtime's CPU provider, a
non-spinning session as the pipeline opens it), torch (float64 CPU, n <= 2,880).

    python benchmarks/bench_selector.py                  # every row, 3 repeats (1 above n = 2,880)
    python benchmarks/bench_selector.py --sizes 576 2880 --backends numpy onnx --repeats 1
    python benchmarks/bench_selector.py --sizes 16384 --fractions 10 --backends onnx numpy \
        --output benchmarks/results/selector_cpu_video.json --append     # one size's rows into an existing file
    python benchmarks/bench_selector.py --paper --sizes 576 2880 --backends reference numpy onnx \
        --output benchmarks/results/selector_cpu_paper.json   # tab:app_overhead's budgets
Writes --output (default benchmarks/results/selector_cpu_sizes.json; rewritten after every row) and its .png, prints
a table. The committed results are selector_cpu_{small,video,paper}.json; selector_cpu_sizes.png draws small + video
(docs/performance.md). (selector_cpu.json / selector_cpu_quick.json are the earlier two-shape version of this script.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = {576: ("llava-1.5", 4096), 1296: ("qwen2.5-vl-1008px", 3584), 2880: ("llava-next", 4096),
         8192: ("qwen2.5-vl-video", 3584), 16384: ("qwen2.5-vl-video", 3584)}
BACKENDS = ("reference", "numpy", "lazy", "onnx", "torch")
DENSE_MAX_N = 2880
#: the paper's overhead rows (tab:app_overhead, A6000, ms/example): n -> {budget: (similarity, coverage selection)}
PAPER = {576: {128: (0.052, 0.092), 64: (0.052, 0.060), 32: (0.052, 0.038)},
         2880: {640: (0.940, 0.742), 320: (0.940, 0.391), 160: (0.940, 0.233)}}
#: the paper's first-layer attention probe ("Attn.", shared by the budgets) on the A6000, ms/example
PAPER_PROBE = {576: 0.031, 2880: 0.190}  # reference and torch recompute or hold dense float64 [n, n] work: skipped above


def clustered_features(n: int, d: int, seed: int) -> np.ndarray:
    """[n, d] float32 around n // 8 centres, built in row chunks (no [n, d] float64 temporary)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(1, n // 8), d), dtype=np.float32)
    v = centres[rng.integers(0, len(centres), n)]
    for s in range(0, n, 1024):
        v[s:s + 1024] += 0.5 * rng.standard_normal((min(1024, n - s), d), dtype=np.float32)
    return v


def _status_bytes(key: str) -> int:
    """VmRSS / VmHWM of this process from /proc (VmHWM starts afresh at exec; ru_maxrss would carry the forking
    parent's peak)."""
    with open("/proc/self/status") as f:
        return 1024 * next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def _selector(backend: str):
    """backend -> (select(v, r, m) -> sorted int64 [m], similarity(v) or None)."""
    if backend == "onnx":
        import tempfile

        from coverpruner.engines.ort import make_session
        from coverpruner.export.exporter import ExportOptions
        from coverpruner.export.selector import build_selector_model
        import onnx

        path = Path(tempfile.mkdtemp()) / "selector.onnx"
        onnx.save(build_selector_model(opset=ExportOptions().opset), str(path))  # the graph an export writes
        sess = make_session(path, "cpu", spin=False)

        def select(v, r, m):
            feeds = {"image_features": v, "relevance": r, "budget": np.array(m, np.int64),
                     "tau": np.array(0.3, np.float32)}
            return sess.run(["keep"], feeds)[0]

        return select, None
    from coverpruner.selection import coverage_select

    if backend == "torch":
        import torch

        def select(v, r, m):
            return coverage_select(torch.from_numpy(v), torch.from_numpy(r), m, 0.3, backend="torch").numpy()

        return select, None
    from coverpruner.selection.blocked import similarity, utilities

    def select(v, r, m):
        return coverage_select(v, r, m, 0.3, backend=backend)

    # what each backend builds first: numpy the symmetric similarity M, lazy A^T
    return select, {"reference": None, "numpy": similarity}.get(backend, lambda v: utilities(v, transposed=True))


def measure(n: int, m: int, backend: str, repeats: int) -> dict:
    """One row, in this process (called by the subprocess): times, added peak memory, picks."""
    d = SIZES[n][1]
    v = clustered_features(n, d, seed=n)
    r = np.random.default_rng(1).random(n).astype(np.float32)
    select, similarity = _selector(backend)
    rss0 = _status_bytes("VmRSS")
    times, keep = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        keep = np.asarray(select(v, r, m), dtype=np.int64)
        times.append(time.perf_counter() - t0)
    sim_ms = None
    if similarity is not None:
        t0 = time.perf_counter()
        similarity(v)
        sim_ms = 1e3 * (time.perf_counter() - t0)
    peak = _status_bytes("VmHWM")
    return {"model": SIZES[n][0], "n": n, "d": d, "budget": m, "backend": backend, "repeats": repeats,
            "total_ms": 1e3 * statistics.median(times), "similarity_ms": sim_ms,
            "added_peak_mib": (peak - rss0) / 2**20, "keep": keep.tolist()}


def run_row(n: int, m: int, backend: str, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "--row", str(n), str(m), backend, "--repeats", str(repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"model": SIZES[n][0], "n": n, "budget": m, "backend": backend, "error": tail}
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(rows: list[dict]) -> None:
    """Fill same_indices / objective_ratio against the reference row (n <= 2,880) or the numpy row."""
    sys.path.insert(0, str(ROOT / "tests"))
    from literal_selection import objective, utilities, weights

    for n in sorted({r["n"] for r in rows}):
        for m in sorted({r["budget"] for r in rows if r["n"] == n}):
            group = {r["backend"]: r for r in rows if r["n"] == n and r["budget"] == m and "keep" in r}
            base = group.get("reference") or group.get("numpy")
            if base is None:
                continue
            a = w = None
            for r in group.values():
                r["compared_with"] = base["backend"]
                r["same_indices"] = r["keep"] == base["keep"]
                if not r["same_indices"] and n <= 8192:
                    if a is None:
                        v = clustered_features(n, SIZES[n][1], seed=n)
                        a = utilities(v)
                        w = weights(np.random.default_rng(1).random(n).astype(np.float32), 0.3, n)
                    r["objective_ratio"] = objective(a, w, r["keep"]) / objective(a, w, base["keep"])


def plot(rows, path: Path) -> None:
    """Time (left) and added peak memory (right) against n, one line per backend and budget fraction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
    for backend in BACKENDS:
        fractions = sorted({r["fraction"] for r in rows}, key=lambda f: float(f.rstrip("%")))
        for frac, style in zip(fractions, ["-", "--", ":", "-."] * 4):
            sub = sorted((r for r in rows if r["backend"] == backend and "total_ms" in r
                          and r["fraction"] == frac), key=lambda r: r["n"])
            if not sub:
                continue
            ns = [r["n"] for r in sub]
            ax_t.plot(ns, [r["total_ms"] / 1e3 for r in sub], style, marker="o", label=f"{backend} m={frac}")
            ax_m.plot(ns, [r["added_peak_mib"] / 1024 for r in sub], style, marker="o", label=f"{backend} m={frac}")
    for ax, label in ((ax_t, "selection time, s (similarity + greedy)"), (ax_m, "added peak RSS, GiB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("visual tokens n")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_m.axhline(1.3, color="red", lw=0.8, label="1.3 GiB (issue 20 at n = 16,384)")
    ax_m.legend(fontsize=7)
    fig.suptitle("coverage selector on a 2-core CPU (benchmarks/bench_selector.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_row(r) -> None:
    if "error" in r:
        print(f"{r['n']:>6}{r['budget']:>6} {r['backend']:<10} ERROR {r['error']}", flush=True)
        return
    sim = "" if r.get("similarity_ms") is None else f"{r['similarity_ms']:10.0f}"
    print(f"{r['n']:>6}{r['budget']:>6} {r['backend']:<10}{r['total_ms']:>11.0f}{sim:>10}"
          f"{r['added_peak_mib']:>11.0f}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), choices=list(SIZES), help="n values")
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS, help="backends to time")
    p.add_argument("--repeats", type=int, default=None, help="repeats per row (default 3; 1 above n = 2,880)")
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "selector_cpu_sizes.json",
                   help="JSON path (the PNG goes beside it)")
    p.add_argument("--paper", action="store_true",
                   help="the paper's budgets instead (n = 576: 128/64/32, n = 2,880: 640/320/160), its A6000 "
                        "milliseconds beside each row")
    p.add_argument("--fractions", type=int, nargs="+", default=[10, 25], help="budgets in %% of n (default 10 25)")
    p.add_argument("--append", action="store_true",
                   help="keep the rows already in --output (a row measured again replaces its old one)")
    p.add_argument("--row", nargs=3, metavar=("N", "M", "BACKEND"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.row:
        n, m, backend = int(args.row[0]), int(args.row[1]), args.row[2]
        print(json.dumps(measure(n, m, backend, args.repeats or 1)))
        return 0
    t0 = time.perf_counter()
    rows = []
    kept = json.loads(args.output.read_text())["rows"] if args.append and args.output.is_file() else []
    print(f"{'n':>6}{'m':>6} {'backend':<10}{'total ms':>11}{'sim ms':>10}{'added MiB':>11}")
    for n in args.sizes:
        budgets = [(f"{m / n:.0%}", m) for m in PAPER.get(n, {})] if args.paper else \
            [(f"{f}%", int(round(f / 100 * n))) for f in args.fractions]
        for frac, m in budgets:
            for backend in args.backends:
                if backend in ("reference", "torch") and n > DENSE_MAX_N:
                    continue
                # the literal reference is the yardstick, not a contender: one run (33-76 s at n = 2,880)
                repeats = args.repeats or (3 if n <= 2880 and backend != "reference" else 1)
                row = {**run_row(n, m, backend, repeats), "fraction": frac}
                if args.paper:
                    row["paper_a6000_similarity_ms"], row["paper_a6000_selection_ms"] = PAPER[n][m]
                    row["paper_a6000_probe_ms"] = PAPER_PROBE[n]
                    row["paper_note"] = "paper_a6000_*: the paper's tab:app_overhead (NVIDIA A6000), not measured here"
                rows.append(row)
                print_row(row)
                _write(args, _merged(kept, rows), t0)
    compare(rows)
    for r in rows:
        r.pop("keep", None)
    rows = _merged(kept, rows)
    _write(args, rows, t0)
    plot(rows, args.output.with_suffix(".png"))
    print(f"wrote {args.output} and {args.output.with_suffix('.png').name}")
    return 0


def _merged(old: list[dict], new: list[dict]) -> list[dict]:
    """old rows not measured again + the new ones, ordered by (n, budget)."""
    key = lambda r: (r["n"], r["budget"], r["backend"])  # noqa: E731
    fresh = {key(r) for r in new}
    return sorted([r for r in old if key(r) not in fresh] + new, key=lambda r: (r["n"], r["budget"]))


def _write(args, rows, t0) -> None:
    """Rewrite the JSON (temp + rename) after every row, so a long run keeps what it measured."""
    meta = {"command": "python benchmarks/bench_selector.py " + " ".join(sys.argv[1:]),
            "machine": platform.machine(), "cpu_count": os.cpu_count(), "numpy": np.__version__,
            "wall_s": time.perf_counter() - t0, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average_at_write": list(os.getloadavg()),
            "memory": "added_peak_mib = peak RSS (ru_maxrss in rows measured before 2026-11-23 21:20 UTC, VmHWM after) after the row's selections - RSS before the first (inputs built)"}
    if args.append and args.output.is_file():  # earlier runs' commands stay on record
        old = json.loads(args.output.read_text())["meta"]
        meta["earlier_commands"] = old.get("earlier_commands", []) + [old["command"]] * (old["command"] != meta["command"])
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    tmp.replace(args.output)


if __name__ == "__main__":
    raise SystemExit(main())
