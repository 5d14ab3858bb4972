"""Whole-video coverage selection vs selection inside temporal windows: time, peak memory, where the tokens go.

A Qwen2.5-VL video of T temporal patches x 512 merged tokens (a 448 x 896 frame pair: 16 x 32 cells), d = 3,584:
n = 8,192 (T = 16, 32 frames) and 16,384 (T = 32, 64 frames); budgets m = 10 % and 25 % of n. Features are float32
and video-like: each scene (two windows) draws its tokens around its own centres, plus noise; relevance random.

- whole: coverage_select over all n tokens (numpy backend: one [n, n] utility buffer, float64 up to 2,048 then
  float32).
- windows W: select_in_windows with W equal windows (K = T / W temporal patches each), the numpy backend per
  window: W buffers of [n / W, n / W], one at a time.

Each (n, m, mode) runs in its own subprocess: "total_ms" is one whole selection (similarity + greedy + indices);
"added_peak_mib" the process's peak RSS (VmHWM) after it minus its RSS just before, the inputs already built.
"min_window_share" / "max_window_share": the fewest / most tokens any window kept, as a fraction of its fair
share m / W (windows: ~1 by construction). At n = 8,192 "objective_ratio" is the windows' picks' float64
whole-clip coverage objective over the whole selection's (tests/literal_selection.py): what the guarantee costs in
global coverage.

    flock /tmp/heavy.lock nice -n 10 python benchmarks/bench_windows.py            # every row
    python benchmarks/bench_windows.py --sizes 8192 --windows 8 --output /tmp/w.json
Writes benchmarks/results/selector_windows_cpu.json (rewritten after every row) and .png, prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

D = 3584
TOKENS_PER_PATCH = 512
SIZES = (8192, 16384)
WINDOWS = (8, 16)
OBJECTIVE_MAX_N = 8192  # the float64 [n, n] objective: 0.5 GB at 8,192, 2 GB at 16,384


def video_features(n: int, windows: int = 8, seed: int = 0) -> np.ndarray:
    """float32 [n, D]: scene s = (token's eighth of the clip) // 2 draws around its own n // 64 centres, + noise."""
    rng = np.random.default_rng(seed)
    v = np.empty((n, D), dtype=np.float32)
    span = n // windows
    for s in range(0, n, 2 * span):
        centres = rng.standard_normal((max(1, n // 64), D), dtype=np.float32)
        stop = min(n, s + 2 * span)
        v[s:stop] = centres[rng.integers(0, len(centres), stop - s)]
        v[s:stop] += 0.5 * rng.standard_normal((stop - s, D), dtype=np.float32)
    return v


def _status_bytes(key: str) -> int:
    """VmRSS / VmHWM of this process from /proc (VmHWM starts afresh at exec)."""
    with open("/proc/self/status") as f:
        return 1024 * next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def measure(n: int, m: int, windows: int) -> dict:
    """One row in this process: windows 0 = whole-video selection."""
    from coverpruner.selection import coverage_select, select_in_windows

    v = video_features(n)
    r = np.random.default_rng(1).random(n).astype(np.float32)
    ids = np.repeat(np.arange(max(windows, 1)), -(-n // max(windows, 1)))[:n]
    rss0 = _status_bytes("VmRSS")
    t0 = time.perf_counter()
    if windows:
        keep = select_in_windows(coverage_select, v, r, m, ids, tau=0.3, backend="numpy")
    else:
        keep = coverage_select(v, r, m, 0.3, backend="numpy")
    seconds = time.perf_counter() - t0
    peak = _status_bytes("VmHWM")
    report_ids = np.repeat(np.arange(8), n // 8)  # shares over 8 equal spans, for every mode alike
    counts = np.bincount(report_ids[keep], minlength=8)
    return {"n": n, "d": D, "budget": m, "mode": f"windows {windows}" if windows else "whole",
            "windows": windows, "temporal_patches_per_window": (n // TOKENS_PER_PATCH) // windows if windows else None,
            "total_ms": 1e3 * seconds, "added_peak_mib": (peak - rss0) / 2 ** 20,
            "min_window_share": float(counts.min() / (m / 8)), "max_window_share": float(counts.max() / (m / 8)),
            "keep": np.asarray(keep).tolist()}


def run_row(n: int, m: int, windows: int) -> dict:
    cmd = [sys.executable, __file__, "--row", str(n), str(m), str(windows)]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"n": n, "budget": m, "mode": f"windows {windows}" if windows else "whole", "error": tail}
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(rows: list[dict]) -> None:
    """objective_ratio of each windows row against the whole row of its (n, m), n <= OBJECTIVE_MAX_N."""
    sys.path.insert(0, str(ROOT / "tests"))
    from literal_selection import objective, utilities, weights

    for n in sorted({r["n"] for r in rows if r["n"] <= OBJECTIVE_MAX_N}):
        a = utilities(video_features(n))
        w = weights(np.random.default_rng(1).random(n).astype(np.float32), 0.3, n)
        for m in sorted({r["budget"] for r in rows if r["n"] == n}):
            group = [r for r in rows if r["n"] == n and r["budget"] == m and "keep" in r]
            whole = next((r for r in group if r["mode"] == "whole"), None)
            if whole is None:
                continue
            f_whole = objective(a, w, whole["keep"])
            for r in group:
                r["objective_ratio"] = objective(a, w, r["keep"]) / f_whole
        del a


def plot(rows, path: Path) -> None:
    """Time (left) and added peak memory (right) per mode, grouped by (n, m)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["n"], r["budget"]) for r in rows if "total_ms" in r})
    modes = sorted({r["mode"] for r in rows if "total_ms" in r}, key=lambda s: (s != "whole", len(s), s))
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(modes))
    for j, mode in enumerate(modes):
        for ax, key, scale in ((ax_t, "total_ms", 1e3), (ax_m, "added_peak_mib", 1024)):
            vals = [next((r[key] / scale for r in rows if (r["n"], r["budget"]) == g and r["mode"] == mode
                          and key in r), 0.0) for g in groups]
            ax.bar(np.arange(len(groups)) + j * width, vals, width, label=mode)
    for ax, label in ((ax_t, "selection time, s"), (ax_m, "added peak RSS, GiB")):
        ax.set_xticks(np.arange(len(groups)) + width * (len(modes) - 1) / 2)
        ax.set_xticklabels([f"n={n}\nm={m}" for n, m in groups])
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"whole-video vs windowed coverage selection, d = {D}, 2-core CPU (benchmarks/bench_windows.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), choices=SIZES, help="n values")
    p.add_argument("--windows", type=int, nargs="+", default=list(WINDOWS), help="window counts W to time")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.10, 0.25], help="budgets as fractions of n")
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "selector_windows_cpu.json",
                   help="JSON path (the PNG goes beside it)")
    p.add_argument("--row", nargs=3, type=int, metavar=("N", "M", "W"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.row:
        print(json.dumps(measure(*args.row)))
        return 0
    t0 = time.perf_counter()
    rows = []
    print(f"{'n':>6}{'m':>6} {'mode':<12}{'total ms':>10}{'added MiB':>11}{'min share':>11}")
    for n in args.sizes:
        for frac in args.fractions:
            m = int(round(frac * n))
            for windows in [0, *args.windows]:
                row = {**run_row(n, m, windows), "fraction": f"{frac:.0%}",
                       "load_average_1min": round(os.getloadavg()[0], 2)}  # other processes on the cores
                rows.append(row)
                if "error" in row:
                    print(f"{n:>6}{m:>6} {row['mode']:<12} ERROR {row['error']}", flush=True)
                else:
                    print(f"{n:>6}{m:>6} {row['mode']:<12}{row['total_ms']:>10.0f}{row['added_peak_mib']:>11.0f}"
                          f"{row['min_window_share']:>11.2f}", flush=True)
                _write(args, rows, t0)
    compare(rows)
    for r in rows:
        r.pop("keep", None)
    _write(args, rows, t0)
    plot(rows, args.output.with_suffix(".png"))
    print(f"wrote {args.output} and {args.output.with_suffix('.png').name}")
    return 0


def _write(args, rows, t0) -> None:
    """Rewrite the JSON (temp + rename) after every row, so a long run keeps what it measured."""
    meta = {"command": "python benchmarks/bench_windows.py " + " ".join(sys.argv[1:]),
            "machine": platform.machine(), "cpu_count": os.cpu_count(), "numpy": np.__version__,
            "wall_s": time.perf_counter() - t0, "date": time.strftime("%Y-%m-%d"),
            "memory": "added_peak_mib = VmHWM after the selection - VmRSS before it (inputs built)"}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": [{k: v for k, v in r.items() if k != "keep"} for r in rows]},
                              indent=1) + "\n")
    tmp.replace(args.output)


if __name__ == "__main__":
    raise SystemExit(main())
