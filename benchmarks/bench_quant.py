"""Weight-only quantization on the shape-real LLaVA-1.5-7B preset (real widths, `--layers` decoder layers, random
weights): what int8 / int4 cost and buy against fp32 and fp16, in one run, and what that means on Jetson Orin.

Per precision (fp32, fp16 = the float exports; int8, int4 = the fp32 export quantized with coverpruner-export's
defaults: ORT form, block 32, lm_head included), each in a fresh process: decoder file size, ONNX Runtime CPU
session load time and peak RSS (VmHWM, after one full prefill). Then all four sessions in one process, timed
round-robin (min of repeats, so load from other processes falls on every precision alike): prefill at the full
prompt (576 visual + T text tokens) and at budget 64 (64 + T), and per-token decode after the full prefill.
Accuracy: teacher-forced logits of every precision against fp32 (cosine, relative error, top-1 agreement) over
fixed sequences, and the effect of quantizing the probe on the kept set (budget 64). Projection: the 32-layer 7B
(weights of every graph + the fp16/fp32 KV cache at 4k context) per precision beside Orin Nano 8 GB, Orin NX
16 GB and AGX Orin 32/64 GB.

    python benchmarks/bench_quant.py --work /tmp/qbench
Writes benchmarks/results/quant_llava-1.5-7b_<L>l.json and .png. Peak RAM ~6 GiB (the fp32 export).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRECISIONS = ("fp32", "fp16", "int8", "int4")
TEXT_TOKENS = 28  # prompt tokens around the image in a short LLaVA question (as in bench_pipeline)
BUDGET = 64
REAL_LAYERS = 32
CONTEXT = 4096
#: Jetson Orin modules (unified memory, GB = 1e9 bytes). RESERVE_GB: JetPack (Ubuntu desktop off, CUDA context,
#: TensorRT/ORT runtime) measured on such boards at roughly 1-1.5 GB; 1.5 GB is assumed here.
DEVICES = {"Orin Nano 8GB": 8, "Orin NX 16GB": 16, "AGX Orin 32GB": 32, "AGX Orin 64GB": 64}
RESERVE_GB = 1.5


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


#: the parent's measurement flags, forwarded to every child (set in main)
CHILD_FLAGS: list[str] = []


def _run_child(*argv: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, *CHILD_FLAGS, "--child", *argv], capture_output=True, text=True,
                          cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise SystemExit(f"child {argv} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- children (one fresh process each)

def _feeds(d: dict, dtype, length: int, start: int, past: dict, rng) -> dict:
    return {"inputs_embeds": (rng.standard_normal((1, length, d["hidden_size"])) * 0.02).astype(dtype),
            "attention_mask": np.ones((1, start + length), np.int64),
            "position_ids": np.arange(start, start + length, dtype=np.int64)[None], **past}


def _empty_past(d: dict, dtype) -> dict:
    from coverpruner.engine_dir import past_names

    return {name: np.zeros((1, d["num_kv_heads"], 0, d["head_dim"]), dtype) for name in past_names(d["num_layers"])}


def _session(engine: Path, threads: int):
    import onnxruntime as ort

    m = json.loads((engine / "manifest.json").read_text())
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(engine / "decoder.onnx"), so, providers=["CPUExecutionProvider"])
    dims = {**m["dims"], "max_visual_tokens": m["visual"]["max_visual_tokens"]}
    return sess, time.perf_counter() - t0, dims, np.float16 if m["precision"] == "fp16" else np.float32


def child_memory(engine: Path, threads: int) -> dict:
    """Session load time, RSS once loaded, and peak RSS (VmHWM) after one full-length prefill."""
    rss0 = _status_kib("VmRSS")
    sess, load_s, d, dtype = _session(engine, threads)
    rss_loaded = _status_kib("VmRSS")
    sess.run(None, _feeds(d, dtype, d["max_visual_tokens"] + TEXT_TOKENS, 0, _empty_past(d, dtype),
                          np.random.default_rng(0)))
    return {"load_s": load_s, "rss_before_gib": rss0 / 2**20, "rss_loaded_gib": rss_loaded / 2**20,
            "peak_rss_gib": _status_kib("VmHWM") / 2**20}


def child_latency(engines: list[Path], threads: int, repeats: int, decode_steps: int) -> list[dict]:
    """Prefill (full, budget) and decode latency of every engine's decoder, all sessions in one process and
    timed round-robin, so load from other processes on the machine falls on every precision alike."""
    sessions = [_session(e, threads) for e in engines]
    names = [[o.name for o in s[0].get_outputs()] for s in sessions]
    rng = np.random.default_rng(0)
    d = sessions[0][2]
    full, pruned = d["max_visual_tokens"] + TEXT_TOKENS, BUDGET + TEXT_TOKENS
    times = [{"full": [], "budget": [], "decode": []} for _ in engines]

    def timed(i, feeds):
        t = time.perf_counter()
        outs = dict(zip(names[i], sessions[i][0].run(None, feeds)))
        return time.perf_counter() - t, {k.replace("present", "past_key_values"): v for k, v in outs.items()
                                         if k.startswith("present")}

    for i, (_, _, _, dtype) in enumerate(sessions):  # warm-up
        timed(i, _feeds(d, dtype, pruned, 0, _empty_past(d, dtype), rng))
    for _ in range(repeats):
        for i, (_, _, _, dtype) in enumerate(sessions):
            times[i]["full"].append(timed(i, _feeds(d, dtype, full, 0, _empty_past(d, dtype), rng))[0])
            times[i]["budget"].append(timed(i, _feeds(d, dtype, pruned, 0, _empty_past(d, dtype), rng))[0])
    pasts = [timed(i, _feeds(d, s[3], full, 0, _empty_past(d, s[3]), rng))[1] for i, s in enumerate(sessions)]
    for step in range(decode_steps):
        for i, (_, _, _, dtype) in enumerate(sessions):
            dt, pasts[i] = timed(i, _feeds(d, dtype, 1, full + step, pasts[i], rng))
            times[i]["decode"].append(dt)
    return [{"prefill_full_ms": min(t["full"]) * 1e3, "prefill_full_median_ms": statistics.median(t["full"]) * 1e3,
             "prefill_budget_ms": min(t["budget"]) * 1e3,
             "prefill_budget_median_ms": statistics.median(t["budget"]) * 1e3,
             "decode_ms_per_token": statistics.median(t["decode"]) * 1e3, "prefill_tokens": [full, pruned]}
            for t in times]


def child_logits(engine: Path, out: Path, sequences: int, length: int) -> dict:
    """Teacher-forced logits over fixed random sequences (embedding-like rows, std = the init range 0.02)."""
    from coverpruner.export.quant.compare import teacher_forced_logits

    m = json.loads((engine / "manifest.json").read_text())
    d = m["dims"]
    dtype = np.float16 if m["precision"] == "fp16" else np.float32
    embeds = (np.random.default_rng(1).standard_normal((sequences, length, d["hidden_size"])) * 0.02).astype(dtype)
    logits = teacher_forced_logits(engine / "decoder.onnx", embeds, d["num_layers"], d["num_kv_heads"],
                                   d["head_dim"], prefill=8, threads=2)
    np.save(out, logits)
    return {"shape": list(logits.shape)}


def child_quantize(src: Path, dst: Path, dtype: str, graphs: str, accuracy_level: str = "none") -> dict:
    from coverpruner.export.quant import QuantOptions, quantize_engine_dir

    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for f in src.iterdir():  # a copy: onnx refuses external data with several hard links
        shutil.copy2(f, dst / f.name)
    t0 = time.perf_counter()
    opts = QuantOptions(dtype=dtype, graphs=tuple(graphs.split(",")))
    if accuracy_level != "none":
        opts.accuracy_level = int(accuracy_level)
    res = quantize_engine_dir(dst, opts)
    return {"quantize_s": time.perf_counter() - t0, "peak_rss_gib": _status_kib("VmHWM") / 2**20,
            "record": res.record, "bytes_before": res.removed_bytes, "bytes_after": res.written_bytes}


def child_probe(engines: list[Path], cases: int, out: Path) -> dict:
    """Kept sets (budget 64) from each engine's probe.onnx on the same random requests."""
    import onnxruntime as ort

    from coverpruner.selection.coverage import coverage_select_numpy

    m = json.loads((engines[0] / "manifest.json").read_text())
    n, hid = m["visual"]["max_visual_tokens"], m["dims"]["hidden_size"]
    rng = np.random.default_rng(2)
    prefix, length = 5, 5 + n + TEXT_TOKENS
    requests = []
    for _ in range(cases):
        # visual rows: correlated features (a few shared directions + noise), like projector outputs
        basis = rng.standard_normal((8, hid))
        v = (rng.standard_normal((n, 8)) @ basis + 0.5 * rng.standard_normal((n, hid))).astype(np.float32)
        emb = (rng.standard_normal((1, length, hid)) * 0.02).astype(np.float32)
        emb[0, prefix:prefix + n] = v * 0.02 / v.std()
        requests.append((emb, v))
    kept, relevance = [], []
    for e in engines:
        sess = ort.InferenceSession(str(e / "probe.onnx"), providers=["CPUExecutionProvider"])
        ks, rs = [], []
        for emb, v in requests:
            r = sess.run(None, {"inputs_embeds": emb, "position_ids": np.arange(length, dtype=np.int64)[None],
                                "visual_positions": np.arange(prefix, prefix + n, dtype=np.int64),
                                "instruction_positions": np.arange(prefix + n + 2, length - 4, dtype=np.int64)})[0]
            ks.append(coverage_select_numpy(v, r, budget=BUDGET).tolist())
            rs.append(r.tolist())
        kept.append(ks)
        relevance.append(rs)
    out.write_text(json.dumps({"kept": kept, "relevance": relevance}))
    return {"cases": cases}


# ---------------------------------------------------------------- projection to the 32-layer 7B

def param_counts(layers: int = REAL_LAYERS) -> dict:
    """Parameters of the real llava-1.5-7b config per part (meta device: no memory)."""
    import torch
    from transformers import LlavaForConditionalGeneration

    from coverpruner.testing.llava_checkpoints import build_config

    cfg = build_config("llava-1.5-7b", 32000, 32001, 32002, layers)
    with torch.device("meta"):
        model = LlavaForConditionalGeneration(cfg)
    lm = model.model.language_model
    count = lambda mod: sum(p.numel() for p in mod.parameters())  # noqa: E731
    linear = sum(p.numel() for layer in lm.layers for name, p in layer.named_parameters() if p.dim() == 2)
    return {"decoder_linear": linear, "decoder_other": count(lm) - linear - count(lm.embed_tokens),
            "lm_head": count(model.lm_head), "embed": count(lm.embed_tokens),
            "vision": count(model.model.vision_tower) + count(model.model.multi_modal_projector),
            "kv_elements_per_token": 2 * cfg.text_config.num_hidden_layers * cfg.text_config.num_key_value_heads
            * (cfg.text_config.hidden_size // cfg.text_config.num_attention_heads)}


def bits_per_weight(precision: str, block: int = 32, scale_bits: int = 16) -> float:
    """Stored bits per quantized weight in the ORT form: packed bits + one scale and one zero point per block."""
    if precision in ("fp32", "fp16"):
        return {"fp32": 32, "fp16": 16}[precision]
    bits = {"int8": 8, "int4": 4}[precision]
    return bits + (scale_bits + bits) / block


def projection(counts: dict) -> list[dict]:
    """GB (1e9) per precision of the 32-layer 7B on a device: decoder + lm_head at the weight precision, token
    table and vision tower at the activation precision (fp16 for int8/int4: the Orin deployment), KV cache at
    the activation precision for CONTEXT tokens."""
    rows = []
    for p in PRECISIONS:
        act_bytes = 4 if p == "fp32" else 2
        wbits = bits_per_weight(p)
        decoder = (counts["decoder_linear"] + counts["lm_head"]) * wbits / 8 + counts["decoder_other"] * act_bytes
        other = (counts["embed"] + counts["vision"]) * act_bytes
        kv_per_token = counts["kv_elements_per_token"] * act_bytes
        kv = kv_per_token * CONTEXT
        total = decoder + other + kv
        rows.append({"precision": p, "weight_bits_per_param": wbits, "decoder_gb": decoder / 1e9,
                     "vision_embed_gb": other / 1e9, "kv_4k_gb": kv / 1e9, "total_gb": total / 1e9,
                     "devices": device_fits(decoder + other, kv_per_token)})
    return rows


def device_fits(weights_bytes: float, kv_per_token: float) -> dict:
    """{module: {"fits_4k", "max_context"}}: does the model fit each Orin module with RESERVE_GB taken, a KV cache
    of CONTEXT tokens included, and the longest KV cache (<= CONTEXT tokens) that still fits."""
    fits = {}
    for name, gb in DEVICES.items():
        usable = (gb - RESERVE_GB) * 1e9
        max_ctx = int((usable - weights_bytes) // kv_per_token)
        fits[name] = {"fits_4k": weights_bytes + kv_per_token * CONTEXT <= usable,
                      "max_context": max(0, min(max_ctx, CONTEXT))}
    return fits


def predicted_file_bytes(counts2: dict, precision: str) -> float:
    """Decoder file bytes of the --layers export predicted by the same bit layout (fp32 scales for the quantized
    fp32 export), to check the projection's model against the measured files."""
    act_bytes = 2 if precision == "fp16" else 4
    wbits = bits_per_weight(precision, scale_bits=32 if precision in ("int8", "int4") else 16)
    return (counts2["decoder_linear"] + counts2["lm_head"]) * wbits / 8 + counts2["decoder_other"] * act_bytes


# ---------------------------------------------------------------- main

def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {r["precision"]: r for r in result["rows"]}
    ps = list(rows)
    fig, ax = plt.subplots(1, 4, figsize=(17, 4.2))
    ax[0].bar(ps, [rows[p]["file_bytes"] / 2**30 for p in ps], color="#4c72b0")
    ax[0].set_title(f"decoder file ({result['layers']} layers), GiB")
    x = np.arange(len(ps))
    ax[1].bar(x - 0.2, [rows[p]["prefill_full_ms"] for p in ps], 0.4, label=f"full ({576 + TEXT_TOKENS} tok)")
    ax[1].bar(x + 0.2, [rows[p]["prefill_budget_ms"] for p in ps], 0.4, label=f"budget 64 ({64 + TEXT_TOKENS} tok)")
    ax[1].set_xticks(x, ps)
    ax[1].set_title("prefill ms (CPU, 2 threads, log)")
    ax[1].set_yscale("log")
    ax[1].legend(fontsize=8)
    ax[2].bar(ps, [rows[p]["decode_ms_per_token"] for p in ps], color="#55a868")
    ax[2].set_title("decode ms / token (log)")
    ax[2].set_yscale("log")
    proj = {r["precision"]: r for r in result["projection"]}
    ps = list(PRECISIONS)
    bottom = np.zeros(len(ps))
    for key, label, color in (("decoder_gb", "decoder weights", "#4c72b0"), ("vision_embed_gb", "vision + embed",
                                                                               "#8172b2"),
                              ("kv_4k_gb", "KV cache 4k", "#dd8452")):
        vals = np.array([proj[p][key] for p in ps])
        ax[3].bar(ps, vals, bottom=bottom, label=label, color=color)
        bottom += vals
    for name, gb in DEVICES.items():
        ax[3].axhline(gb - RESERVE_GB, ls="--", lw=0.8, color="gray")
        ax[3].text(len(ps) - 0.5, gb - RESERVE_GB, f"{name} usable", fontsize=7, va="bottom", ha="right")
    ax[3].set_ylim(0, 66)
    ax[3].set_title("32-layer 7B on Orin: GB needed")
    ax[3].legend(fontsize=7, loc="center right")
    fig.suptitle("Weight-only quantization, LLaVA-1.5-7B shape-real preset, ONNX Runtime CPU")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def markdown(result: dict) -> str:
    """The docs/performance.md tables of one result JSON."""
    acc = result["accuracy_vs_fp32"]
    lines = ["| decoder weights | file | load | RSS loaded / peak | prefill full | prefill budget 64 | decode / token "
             "| logits vs fp32: cosine (min), rel. error, top-1 |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        a = acc.get(r["precision"])
        cmp = "reference" if a is None else (f"{a['cosine_mean']:.5f} ({a['cosine_min']:.5f}), "
                                            f"{a['rel_err_mean']:.3f}, {a['top1']:.2f}")
        lines.append(f"| {r['precision']} | {r['file_bytes'] / 2**30:.2f} GiB | {r['load_s']:.1f} s | "
                     f"{r['rss_loaded_gib']:.2f} / {r['peak_rss_gib']:.2f} GiB | {r['prefill_full_ms'] / 1e3:.2f} s | "
                     f"{r['prefill_budget_ms'] / 1e3:.2f} s | {r['decode_ms_per_token']:.0f} ms | {cmp} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "work")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="prefill repeats per precision (min reported)")
    p.add_argument("--decode-steps", type=int, default=12)
    p.add_argument("--sequences", type=int, default=3, help="teacher-forced sequences")
    p.add_argument("--length", type=int, default=24, help="tokens per teacher-forced sequence")
    p.add_argument("--probe-cases", type=int, default=6)
    p.add_argument("--variants", default=",".join(PRECISIONS),
                   help="fp32, fp16, int8, int4 (library defaults) and int8-aN / int4-aN (MatMulNBits "
                        "accuracy_level N)")
    p.add_argument("--table", type=Path, default=None, help="print the markdown table of a result JSON and exit")
    p.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.table is not None:
        print(markdown(json.loads(args.table.read_text())))
        return
    if args.child is not None:
        kind, *rest = args.child
        fn = {"memory": lambda e: child_memory(Path(e), args.threads),
              "latency": lambda *es: child_latency([Path(e) for e in es], args.threads, args.repeats,
                                                   args.decode_steps),
              "logits": lambda e, o: child_logits(Path(e), Path(o), args.sequences, args.length),
              "quantize": lambda s, d, t, g, a="none": child_quantize(Path(s), Path(d), t, g, a),
              "probe": lambda o, *es: child_probe([Path(e) for e in es], args.probe_cases, Path(o))}[kind]
        print(json.dumps(fn(*rest)))
        return

    CHILD_FLAGS[:] = ["--threads", str(args.threads), "--repeats", str(args.repeats), "--decode-steps",
                      str(args.decode_steps), "--sequences", str(args.sequences), "--length", str(args.length),
                      "--probe-cases", str(args.probe_cases)]
    work = args.work
    ckpt = work / "ckpt"
    if not (ckpt / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "coverpruner.testing.cli", "--preset", "llava-1.5-7b",
                        "--layers", str(args.layers), "--output", str(ckpt)], check=True, cwd=ROOT)
    from coverpruner.engine_dir import read_if_present

    engines = {}
    for dt, graphs in (("fp32", "probe,decoder"), ("fp16", "decoder")):
        engines[dt] = work / dt
        if read_if_present(engines[dt]) is None:  # absent, or an older format version: export (again)
            subprocess.run([sys.executable, "-m", "coverpruner.export.cli", "--model", str(ckpt), "--output",
                            str(engines[dt]), "--dtype", dt, "--graphs", graphs, "--no-progress"], check=True,
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    variants = args.variants.split(",")
    if variants[0] != "fp32":
        raise SystemExit("--variants must start with fp32 (the reference)")
    quant = {}
    for v in variants:
        if v.startswith("int"):
            dt, _, acc = v.partition("-a")
            engines[v] = work / v
            quant[v] = _run_child("quantize", str(engines["fp32"]), str(engines[v]), dt, "decoder", acc or "none")
            print(f"quantized {v}: {quant[v]['quantize_s']:.1f}s, peak RSS {quant[v]['peak_rss_gib']:.2f} GiB",
                  flush=True)
    rows = []
    for prec in variants:
        e = engines[prec]
        entry = json.loads((e / "manifest.json").read_text())["graphs"]["decoder"]
        row = {"precision": prec, "file_bytes": sum((e / f).stat().st_size
                                                    for f in [entry["file"], *entry["data_files"]])}
        row.update(_run_child("memory", str(e)))
        rows.append(row)
        print(f"{prec}: file {row['file_bytes'] / 2**30:.2f} GiB load {row['load_s']:.2f}s peak "
              f"{row['peak_rss_gib']:.2f} GiB", flush=True)
    for row, lat in zip(rows, _run_child("latency", *(str(engines[p]) for p in variants))):
        row.update(lat)
        print(f"{row['precision']}: prefill full {row['prefill_full_ms']:.0f} ms / 64 {row['prefill_budget_ms']:.0f} ms,"
              f" decode {row['decode_ms_per_token']:.1f} ms/token", flush=True)

    from coverpruner.export.quant.compare import logit_agreement

    logits = {}
    for prec in variants:
        f = work / f"logits_{prec}.npy"
        _run_child("logits", str(engines[prec]), str(f))
        logits[prec] = np.load(f)
    accuracy = {}
    for prec in variants[1:]:
        a = logit_agreement(logits["fp32"], logits[prec])
        a["disagree_margins"] = a["disagree_margins"][:10]
        accuracy[prec] = a
        print(f"{prec} vs fp32: cosine {a['cosine_mean']:.5f} (min {a['cosine_min']:.5f}) rel err "
              f"{a['rel_err_mean']:.4f} top-1 {a['top1']:.3f}", flush=True)

    probe_dirs = [engines["fp32"]]
    for dt in ("int8", "int4"):
        d = work / f"probe_{dt}"
        _run_child("quantize", str(engines["fp32"]), str(d), dt, "probe")
        probe_dirs.append(d)
    _run_child("probe", str(work / "probe.json"), *map(str, probe_dirs))
    pr = json.loads((work / "probe.json").read_text())
    probe = {}
    for i, dt in enumerate(("int8", "int4"), start=1):
        overlap = [len(set(a) & set(b)) / BUDGET for a, b in zip(pr["kept"][0], pr["kept"][i])]
        rel = [float(np.abs(np.subtract(b, a)).max() / np.abs(a).max()) for a, b in zip(pr["relevance"][0],
                                                                                         pr["relevance"][i])]
        probe[dt] = {"kept_overlap_mean": float(np.mean(overlap)), "kept_overlap_min": float(np.min(overlap)),
                     "identical": int(sum(o == 1.0 for o in overlap)), "cases": len(overlap),
                     "relevance_rel_err_max": float(np.max(rel))}
        print(f"probe {dt}: kept-set overlap mean {probe[dt]['kept_overlap_mean']:.3f}, identical "
              f"{probe[dt]['identical']}/{len(overlap)}", flush=True)

    counts = param_counts()
    counts2 = param_counts(args.layers)
    for r in rows:
        r["predicted_file_bytes"] = predicted_file_bytes(counts2, r["precision"].split("-")[0])
    import onnxruntime

    result = {
        "benchmark": "quant",
        "command": "python benchmarks/bench_quant.py " + " ".join(sys.argv[1:]),
        "preset": "llava-1.5-7b", "layers": args.layers, "text_tokens": TEXT_TOKENS, "budget": BUDGET,
        "threads": args.threads, "quantization": {dt: q["record"] for dt, q in quant.items()},
        "quantize_cost": {dt: {k: q[k] for k in ("quantize_s", "peak_rss_gib")} for dt, q in quant.items()},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "onnxruntime": onnxruntime.__version__},
        "notes": "int8/int4 = the fp32 export quantized (ORT form MatMulNBits, block 32, asymmetric, lm_head "
                 "included, fp32 activations and scales); random weights, so accuracy figures measure rounding, "
                 "not task quality. Projection: decoder + lm_head at the weight precision with fp16 scales, token "
                 f"table and vision tower at fp16 (fp32 for fp32), KV at {CONTEXT} tokens, {RESERVE_GB} GB reserved "
                 "for the OS and runtimes.",
        "rows": rows, "accuracy_vs_fp32": accuracy, "probe_quantized_kept_set": probe,
        "teacher_forced": {"sequences": args.sequences, "length": args.length, "prefill": 8},
        "param_counts_32l": counts, "projection": projection(counts),
    }
    tag = "" if args.variants == ",".join(PRECISIONS) else "_" + args.variants.replace(",", "_")
    out = ROOT / "benchmarks" / "results" / f"quant_llava-1.5-7b_{args.layers}l{tag}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    print(markdown(result))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
