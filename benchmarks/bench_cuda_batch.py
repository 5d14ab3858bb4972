"""Continuous batching on ONNX Runtime's CUDA provider: the fp16 ORT-form decoder, KV cache in device memory.

LLaVA-1.5-7B widths (hidden 4096, 32 heads, head_dim 128, ffn 11008, vocab 32000), 2 decoder layers, random
weights written straight into the ORT form (export/ortform/decoder_graph.build_ort_decoder, fp16; no checkpoint,
no transformers). engines.ort_form_decoder.BatchDecoder with B requests prefilled at --past tokens each, then
--steps batched steps per batch size, the sizes alternating step by step in one process (round-robin), medians.
Two KV placements on the same session: "device" (engines/kv_buffers.CudaKV, what Pipeline uses on provider cuda)
and "host" (numpy buffers bound as CPU OrtValues: ORT copies the whole cache to the GPU and back every step: what
a float32 GroupQueryAttention falling back to the CPU, or a loop without device buffers, pays). Reports ms per
step, aggregate tokens/s, and ratios (batch B vs batch 1; device vs host).

    python benchmarks/bench_cuda_batch.py [--past 600] [--steps 24] [--out benchmarks/results/cuda_batch_<gpu>.json]
    python benchmarks/bench_cuda_batch.py --provider cpu --tiny   # the same code path on the CPU, tiny widths
Writes the JSON and a PNG beside it.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BATCHES = (1, 2, 4, 8)
WIDTHS = {"llava-1.5-7b-2l": dict(hidden=4096, heads=32, kv_heads=32, head_dim=128, ffn=11008, vocab=32000, layers=2),
          "tiny": dict(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=256, layers=2)}


def random_weights(w: dict, seed: int = 0):
    """contract.DecoderWeights of the given widths, N(0, 0.02) linears, unit norms (float32)."""
    from coverpruner.families.contract import DecoderLayerWeights, DecoderWeights

    rng = np.random.default_rng(seed)
    d, hd, ffn = w["hidden"], w["head_dim"], w["ffn"]

    def lin(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp), dtype=np.float32) * 0.02)

    layers = [DecoderLayerWeights(np.ones(d, np.float32), np.ones(d, np.float32), lin(w["heads"] * hd, d),
                                  lin(w["kv_heads"] * hd, d), lin(w["kv_heads"] * hd, d), None, None, None,
                                  lin(d, w["heads"] * hd), lin(ffn, d), lin(ffn, d), lin(d, ffn))
              for _ in range(w["layers"])]
    return DecoderWeights(layers, np.ones(d, np.float32), lin(w["vocab"], d), 1e-5, w["heads"], w["kv_heads"], hd,
                          {"theta": 10000.0, "mrope_section": None})


def device_name(provider: str) -> str:
    if provider == "cpu":
        return "cpu"
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:  # torch without CUDA: name it by the provider
        return "cuda"


def run(graph: Path, w: dict, provider: str, past: int, steps: int, placements: tuple) -> dict:
    import onnxruntime as ort

    from coverpruner.engines.ort_form_decoder import BatchDecoder

    eps = ["CUDAExecutionProvider", "CPUExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    sess = ort.InferenceSession(str(graph), providers=eps)
    rng = np.random.default_rng(1)
    d = w["hidden"]
    decs = {}
    for place in placements:
        for b in BATCHES:
            dec = BatchDecoder(sess, b, past + steps + 2, w["layers"], w["kv_heads"], w["head_dim"],
                               {"theta": 10000.0}, "cuda" if place == "device" else "cpu")
            for _ in range(b):
                dec.join((rng.standard_normal((1, past, d)) * 0.5).astype(np.float16), np.arange(past)[None])
            decs[place, b] = {"dec": dec, "ms": []}
    keys = list(decs)
    for k in range(steps):
        for key in (keys if k % 2 == 0 else keys[::-1]):
            dec = decs[key]["dec"]
            feeds = {h: ((rng.standard_normal(d) * 0.5).astype(np.float16), np.array([past + k]))
                     for h in dec.active}
            t0 = time.perf_counter()
            dec.step(feeds)
            decs[key]["ms"].append((time.perf_counter() - t0) * 1e3)
    rows = []
    for (place, b), r in decs.items():
        ms = statistics.median(r["ms"][2:])  # the first steps of each size warm up its shapes
        rows.append({"kv": place, "batch": b, "ms_per_step": round(ms, 3), "tokens_per_s": round(b * 1e3 / ms, 1)})
    for r in rows:
        one = next(x for x in rows if x["kv"] == r["kv"] and x["batch"] == 1)
        r["tokens_per_s_vs_batch1"] = round(r["tokens_per_s"] / one["tokens_per_s"], 2)
        host = next((x for x in rows if x["kv"] == "host" and x["batch"] == r["batch"]), None)
        if host is not None and r["kv"] == "device":
            r["device_vs_host_speedup"] = round(host["ms_per_step"] / r["ms_per_step"], 2)
    return {"rows": rows}


def plot(path: Path, result: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for place in sorted({r["kv"] for r in result["rows"]}):
        rows = sorted((r for r in result["rows"] if r["kv"] == place), key=lambda r: r["batch"])
        ax.plot([r["batch"] for r in rows], [r["tokens_per_s"] for r in rows], marker="o", label=f"KV on {place}")
    ax.set_xlabel("requests in the batch")
    ax.set_ylabel("decode tokens/s (all requests)")
    ax.set_xticks(BATCHES)
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--provider", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny widths instead of LLaVA-1.5-7B's (a smoke run)")
    p.add_argument("--past", type=int, default=600, help="tokens cached per request before the timed steps")
    p.add_argument("--steps", type=int, default=24, help="timed batched steps per batch size and KV placement")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/cuda_batch_<dev>.json)")
    args = p.parse_args(argv)
    import onnxruntime as ort

    if args.provider == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        print(f"bench_cuda_batch: CUDAExecutionProvider not available (needs onnxruntime-gpu; have "
              f"{ort.get_available_providers()})", file=sys.stderr)
        return 2
    from coverpruner.export.ortform.decoder_graph import build_ort_decoder

    preset = "tiny" if args.tiny else "llava-1.5-7b-2l"
    w = WIDTHS[preset]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        graph = build_ort_decoder(random_weights(w), Path(tmp) / "decoder.onnx", "fp16")
        build_s = time.perf_counter() - t0
        # host KV on the CUDA provider is the PCIe-copy baseline; on the CPU provider it is the only placement
        placements = ("device", "host") if args.provider == "cuda" else ("cpu",)
        result = run(graph, w, args.provider, args.past, args.steps, placements)
    dev = device_name(args.provider)
    result.update({"device": dev, "provider": args.provider, "widths": preset, **w, "precision": "fp16",
                   "past": args.past, "steps": args.steps, "graph_build_s": round(build_s, 1),
                   "onnxruntime": ort.__version__,
                   "command": "python benchmarks/bench_cuda_batch.py " + " ".join(argv or sys.argv[1:])})
    tag = re.sub(r"[^A-Za-z0-9]+", "-", dev).strip("-").lower()
    out = args.out or ROOT / "benchmarks" / "results" / f"cuda_batch_{tag}{'_tiny' if args.tiny else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(out.with_suffix(".png"), result, f"fp16 ORT-form decoder, {preset}, {dev}, past {args.past}")
    print(f"{'kv':>7} {'batch':>5} {'ms/step':>9} {'tok/s':>9} {'x batch1':>8} {'dev/host':>8}")
    for r in result["rows"]:
        print(f"{r['kv']:>7} {r['batch']:>5} {r['ms_per_step']:>9.3f} {r['tokens_per_s']:>9.1f} "
              f"{r['tokens_per_s_vs_batch1']:>8.2f} {r.get('device_vs_host_speedup', ''):>8}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
