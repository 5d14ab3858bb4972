"""What Gemma 3's bidirectional image blocks cost the ORT-form decoder: our graph (GroupQueryAttention with causal=0
and a host-built additive mask per window) against the same weights in the causal form onnxruntime-genai's Gemma 3
graph has (GroupQueryAttention causal, local_window_size on sliding layers: it cannot express the blocks), round-robin.

Shape-real Gemma-3-4B widths, 2 decoder layers (1 sliding + 1 full), random weights (bench_pipeline.py's checkpoint:
coverpruner-make-checkpoint --preset gemma-3-4b --layers 2). Per round and form: a prefill of --prompt rows (ours with
two 256-row image blocks in it, the causal form without), then --new-tokens greedy decode steps, and the same at a
context past the window (--long rows). fp32, CPU, one OrtFormDecoderSession per form (the engine's own loop, host
rotary rows and masks included). Writes benchmarks/results/gemma3_masks_cpu.{json,png}.

    python benchmarks/bench_gemma3_masks.py --checkpoint W/gemma-3-4b-2l --engine W/gemma-3-4b-2l-fp32 --rounds 5
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


def build(checkpoint: Path, workdir: Path, engine: Path | None) -> tuple[dict[str, Path], dict]:
    """({"blocks": ours, "causal": the genai-like form} decoder.onnx files of the checkpoint, their rotary record)
    (built once, reused: the record is kept beside them). engine: an fp32 ORT-form engine dir of the checkpoint
    (bench_pipeline.py's) whose decoder is ours: only the causal form is built then."""
    from transformers import AutoConfig

    from coverpruner.export.ortform.decoder_graph import build_ort_decoder
    from coverpruner.families import family_for_model_type
    from coverpruner.families.contract import AttentionSpec

    paths = {form: workdir / f"gemma3-masks-{form}" / "decoder.onnx" for form in ("blocks", "causal")}
    if engine is not None:
        paths["blocks"] = engine / "decoder.onnx"
    record = workdir / "rotary.json"
    if all(p.exists() for p in paths.values()) and record.exists():
        return paths, json.loads(record.read_text())
    config = AutoConfig.from_pretrained(str(checkpoint))
    family = family_for_model_type(config.model_type)
    weights = family.decoder_weights(family.load_model(checkpoint, "float32"))
    attention = family.decoder_spec(config).attention
    for form, spec in (("blocks", attention), ("causal", AttentionSpec(windows=attention.windows))):
        if not paths[form].exists():
            build_ort_decoder(weights, paths[form], "fp32", attention=spec)
    record.write_text(json.dumps(weights.rotary))
    return paths, weights.rotary


def session(path: Path, threads: int, rotary: dict, dims: dict):
    import onnxruntime as ort

    from coverpruner.engines.ort_form_decoder import OrtFormDecoderSession

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return OrtFormDecoderSession(sess, dims["layers"], dims["kv_heads"], dims["head_dim"], dims["vocab"], rotary)


def run(dec, embeds: np.ndarray, blocks: np.ndarray | None, table: np.ndarray, new: int) -> dict:
    """Prefill embeds [1, L, d] (blocks int64 [L] or None) + `new` greedy steps -> ms and tokens."""
    L = embeds.shape[1]
    dec.reset(L + new + 1)
    extras = None if blocks is None else {"attention_blocks": blocks[None]}
    t0 = time.perf_counter()
    logits = dec.forward(embeds, np.arange(L, dtype=np.int64)[None], extras)
    prefill = time.perf_counter() - t0
    tokens, steps = [int(np.argmax(logits))], []
    for k in range(new - 1):
        t0 = time.perf_counter()
        logits = dec.forward(table[tokens[-1]][None, None], np.array([[L + k]], np.int64))
        steps.append(time.perf_counter() - t0)
        tokens.append(int(np.argmax(logits)))
    return {"prefill_ms": prefill * 1e3, "decode_ms": statistics.median(steps) * 1e3, "tokens": tokens}


def plot(path: Path, result: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    cases = list(result["cases"])
    for ax, key, title in ((axes[0], "prefill_ms", "prefill, ms"), (axes[1], "decode_ms", "decode, ms / token")):
        for j, (form, col) in enumerate((("blocks", "#3366cc"), ("causal", "#999999"))):
            vals = [result["cases"][c][form][key] for c in cases]
            xs = [i + (j - 0.5) * 0.38 for i in range(len(cases))]
            ax.bar(xs, vals, 0.38, color=col, label={"blocks": "ours: causal=0 + host mask",
                                                     "causal": "causal GQA (+ local window)"}[form])
            for x, v in zip(xs, vals):
                ax.text(x, v, f"{v:.0f}" if key == "prefill_ms" else f"{v:.1f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(cases)), [f"{c} rows" for c in cases])
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"Gemma-3-4B widths, 2 layers (1 sliding + 1 full), fp32, {os.cpu_count()} CPUs: the block mask's "
                 "cost", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, required=True, help="the gemma-3-4b 2-layer checkpoint")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench_gemma3_masks"), help="decoder cache")
    p.add_argument("--engine", type=Path, default=None,
                   help="bench_pipeline.py's fp32 engine dir of the checkpoint: its decoder is ours (built otherwise)")
    p.add_argument("--prompt", type=int, default=560, help="prefill rows (two 256-row image blocks among them)")
    p.add_argument("--long", type=int, default=2048, help="a prompt past the 1,024-row window (text only)")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    from safetensors import safe_open

    paths, rotary = build(args.checkpoint, args.workdir, args.engine)
    cfg = json.loads((args.checkpoint / "config.json").read_text())["text_config"]
    with safe_open(str(args.checkpoint / "model.safetensors"), "np") as f:
        key = next(k for k in f.keys() if k.endswith("embed_tokens.weight"))
        table = (f.get_tensor(key).astype(np.float32) * np.float32(cfg["hidden_size"] ** 0.5))
    dims = {"layers": cfg["num_hidden_layers"], "kv_heads": cfg["num_key_value_heads"], "head_dim": cfg["head_dim"],
            "vocab": cfg["vocab_size"]}
    threads = args.threads or os.cpu_count()
    decs = {form: session(path, threads, rotary, dims) for form, path in paths.items()}
    rng = np.random.default_rng(0)
    result = {"benchmark": "gemma3_masks", "command": "python benchmarks/bench_gemma3_masks.py "
              + " ".join(argv or sys.argv[1:]), "cases": {},
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count()}}
    for length in (args.prompt, args.long):
        ids = rng.integers(10, 1000, length)
        embeds = table[ids][None]
        blocks = np.full(length, -1, np.int64)
        if length == args.prompt:  # two image blocks of 256 rows (the prompt's soft tokens)
            blocks[20:276], blocks[290:546] = 0, 1
        rows = {form: [] for form in decs}
        for r in range(args.rounds + 1):  # round 0 warms up and is dropped
            for form in (list(decs) if r % 2 == 0 else list(decs)[::-1]):
                res = run(decs[form], embeds, blocks if form == "blocks" else None, table, args.new_tokens)
                if r:
                    rows[form].append(res)
                print(f"{length} rows round {r} {form}: prefill {res['prefill_ms']:.0f} ms, decode "
                      f"{res['decode_ms']:.1f} ms/token", flush=True)
        case = {form: {"prefill_ms": statistics.median(x["prefill_ms"] for x in rs),
                       "decode_ms": statistics.median(x["decode_ms"] for x in rs), "tokens": rs[0]["tokens"]}
                for form, rs in rows.items()}
        case["blocks_over_causal"] = {k: case["blocks"][k] / case["causal"][k] for k in ("prefill_ms", "decode_ms")}
        case["tokens_equal_without_blocks"] = None if length == args.prompt else \
            case["blocks"]["tokens"] == case["causal"]["tokens"]
        result["cases"][str(length)] = case
        print(f"{length} rows: ours / causal prefill {case['blocks_over_causal']['prefill_ms']:.3f}x, decode "
              f"{case['blocks_over_causal']['decode_ms']:.3f}x", flush=True)
    out = ROOT / "benchmarks" / "results" / "gemma3_masks_cpu.json"
    out.write_text(json.dumps(result, indent=2))
    plot(out.with_suffix(".png"), result)
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
