"""CUDA coverage selector (libcoverpruner_selector.so) vs the torch backend on the same GPU (needs a CUDA GPU).

Shapes of the paper: LLaVA-1.5 (n = 576, m = 192/128/64) and LLaVA-NeXT (n = 2880, m = 640/320/160),
d = 4096, float32 and float16 features, batch 1 and 8. Each timing is the median of CUDA-event timed runs
after warm-up, end to end (normalize + GEMM + centre/clip + greedy + sorted output); the indices of both
implementations are compared in the same run.

    cmake -S coverpruner/engines/csrc -B build/csrc -DCMAKE_CUDA_ARCHITECTURES=native && cmake --build build/csrc
    python benchmarks/bench_cuda_selector.py [--lib build/csrc/libcoverpruner_selector.so] [--quick]
Writes benchmarks/results/cuda_selector_<gpu>.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [("llava-1.5", 576, (192, 128, 64)), ("llava-next", 2880, (640, 320, 160))]
DIM = 4096


def clustered(torch, batch: int, n: int, d: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    centres = torch.randn(batch, max(1, n // 8), d, device="cuda", generator=g)
    idx = torch.randint(0, centres.shape[1], (batch, n), device="cuda", generator=g)
    return torch.gather(centres, 1, idx[..., None].expand(batch, n, d)) + 0.5 * torch.randn(
        batch, n, d, device="cuda", generator=g)


def cuda_time(torch, fn, repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of fn() between CUDA events (the stream is synchronised around each run)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def objective_gap(torch, v, r, keep_a, keep_b) -> float:
    """max over the batch of |f(A) - f(B)| / f(B), f = float64 coverage objective sum_i w_i max_{j in S} A_ij."""
    x = v.double()
    unit = x / x.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    cos = unit @ unit.transpose(1, 2)
    a = (cos - cos.mean(dim=-1, keepdim=True)).clamp(min=0)
    rr = r.double()
    lo, hi = rr.min(dim=1, keepdim=True).values, rr.max(dim=1, keepdim=True).values
    w = torch.exp(0.3 * (rr - lo) / (hi - lo).clamp(min=1e-300))
    gaps = []
    for b in range(a.shape[0]):
        f_a = float((w[b] * a[b][:, keep_a[b]].max(dim=1).values).sum())
        f_b = float((w[b] * a[b][:, keep_b[b]].max(dim=1).values).sum())
        gaps.append(abs(f_a - f_b) / f_b)
    return max(gaps)


def run(lib: str | None, repeats: int, batches=(1, 8), dtypes=("float32", "float16")) -> dict:
    import torch

    from coverpruner.engines.cuda_selector import CudaCoverageSelector
    from coverpruner.selection.torch_backend import coverage_select_torch

    if not torch.cuda.is_available():
        raise SystemExit("bench_cuda_selector: no CUDA GPU (torch.cuda.is_available() is False)")
    kernel = CudaCoverageSelector(lib)
    rows = []
    for label, n, budgets in SHAPES:
        for batch in batches:
            for dtype in dtypes:
                v = clustered(torch, batch, n, DIM, seed=n + batch).to(getattr(torch, dtype))
                r = torch.rand(batch, n, device="cuda")
                for m in budgets:
                    ms_kernel = cuda_time(torch, lambda: kernel(v, r, budget=m), repeats)
                    # torch backend: float32 math on CUDA (its default); fp16 inputs are upcast by it
                    ms_torch = cuda_time(torch, lambda: coverage_select_torch(v.float(), r, budget=m), repeats)
                    keep_kernel, keep_torch = kernel(v, r, budget=m), coverage_select_torch(v.float(), r, budget=m)
                    same = bool(torch.equal(keep_kernel, keep_torch))
                    # both run in float32 (the kernel's gains in double): genuine float32 near-ties may differ;
                    # then the sets' float64 coverage objectives must agree to ~1e-7 (relative)
                    gap = 0.0 if same else objective_gap(torch, v, r, keep_kernel, keep_torch)
                    rows.append({"model": label, "n": n, "d": DIM, "m": m, "batch": batch, "dtype": dtype,
                                 "kernel_ms": round(ms_kernel, 4), "torch_ms": round(ms_torch, 4),
                                 "speedup": round(ms_torch / ms_kernel, 2), "same_indices": same,
                                 "objective_rel_gap": gap})
                    print(f"{label:10s} n={n:5d} m={m:4d} B={batch} {dtype:8s} kernel {ms_kernel:8.3f} ms  "
                          f"torch {ms_torch:8.3f} ms  x{ms_torch / ms_kernel:5.1f}  same={same}", flush=True)
    props = torch.cuda.get_device_properties(0)
    return {"benchmark": "cuda_selector", "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
            "gpu": props.name, "compute_capability": f"{props.major}.{props.minor}", "torch": torch.__version__,
            "cuda": torch.version.cuda, "repeats": repeats, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", default=None, help="libcoverpruner_selector.so (default: $COVERPRUNER_SELECTOR_LIB, "
                                               "build/csrc/)")
    p.add_argument("--quick", action="store_true", help="3 repeats, batch 1, float32 only")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/...)")
    args = p.parse_args(argv)
    if args.quick:
        result = run(args.lib, repeats=3, batches=(1,), dtypes=("float32",))
    else:
        result = run(args.lib, repeats=20)
    tag = re.sub(r"[^a-z0-9]+", "-", result["gpu"].lower()).strip("-")
    out = args.out or Path(__file__).resolve().parent / "results" / f"cuda_selector_{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
