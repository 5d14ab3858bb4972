"""Jetson Orin memory of a real-depth model, projected from the engine dir of its shape-real preset (issue 27).

Input: an int4 engine dir of a shape-real preset (real widths, few decoder layers and vision blocks):

    coverpruner-make-checkpoint --preset qwen3-vl-8b --layers 2 --output /tmp/q8
    coverpruner-export --model /tmp/q8 --output /tmp/q8-int4 --quantize int4
    python benchmarks/orin_memory.py --engine /tmp/q8-int4 --preset qwen3-vl-8b --engine /tmp/q4-int4 --preset qwen3-vl-4b

Every graph's initializers are read from the engine dir (names, dtypes, element counts; no weights loaded) and
grouped: the decoder's per layer (`layers.<i>.`) and the rest (lm_head, final norm), the vision graph's per block
(`visual.blocks.<i>.`), per DeepStack merger (`visual.deepstack_merger_list.<k>.`) and the rest (patch and position
embeddings, the main merger); the probe, embed and selector graphs whole. The real model is the rest + its real
depth x the mean per-layer (per-block, per-merger) bytes, with the depths from the preset's config. Bytes as
deployed on Orin: packed int4 weights as stored, every float tensor (int4 scales, norms, vision, token table) at
fp16 (the `--dtype fp16 --quantize int4` form), KV cache fp16 at 4,096 tokens (a hybrid decoder's: its
full-attention layers only, plus its fixed-size Gated DeltaNet states, from the engine dir's graphs.decoder record).
RESERVE_GB and the modules are bench_quant's (the LLaVA-1.5-7B projection). Writes benchmarks/results/orin_memory.json
and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_quant import CONTEXT, DEVICES, RESERVE_GB, device_fits  # noqa: E402

#: names of the per-layer / per-block initializers: our ORT-form decoder's, Qwen's vision blocks and DeepStack mergers,
#: and transformers' encoder layers (SigLIP, CLIP) under the module scope torch.onnx.export records on each node
GROUPS = {"decoder": re.compile(r"^layers\.(\d+)\."),
          "vision_block": re.compile(r"(?:^visual\.blocks|vision_tower\.encoder\.layers)\.(\d+)\."),
          "deepstack_merger": re.compile(r"^visual\.deepstack_merger_list\.(\d+)\.")}


def initializer_bytes(path: Path) -> list[tuple[str, int, bool]]:
    """(name, bytes on Orin, quantized?) of every initializer of one graph: float tensors at 2 bytes per element,
    integer tensors (packed int4 blocks, shapes) as stored. An initializer torch.onnx.export named val_N (a transposed
    Linear weight) is named by the module scopes of the first node that reads it ("<scopes> val_N")."""
    import onnx
    from onnx import TensorProto

    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    graph = onnx.load(str(path), load_external_data=False).graph
    scope = {}
    for node in graph.node:
        scopes = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "")
        for name in node.input:  # the module path of the node, outermost first (its last entry is the op)
            scope.setdefault(name, " ".join(ast.literal_eval(scopes)) if scopes else "")
    out = []
    for t in graph.initializer:
        count = int(np.prod(t.dims)) if len(t.dims) else 1
        name = t.name if not re.match(r"^val_\d+$", t.name) else f"{scope.get(t.name, '')} {t.name}"
        if t.data_type in floats:
            out.append((name, 2 * count, False))
        else:
            stored = next((int(e.value) for e in t.external_data if e.key == "length"), None)
            out.append((name, stored if stored is not None else len(t.raw_data) or count * 8, True))
    return out


def grouped(rows: list[tuple[str, int, bool]], pattern) -> tuple[dict[int, int], int]:
    """({index: bytes} of the names `pattern` numbers, bytes of the others)."""
    per, rest = {}, 0
    for name, nbytes, _ in rows:
        m = pattern.search(name)
        if m:
            per[int(m.group(1))] = per.get(int(m.group(1)), 0) + nbytes
        else:
            rest += nbytes
    return per, rest


def project(engine: Path, preset: str) -> dict:
    """GB (1e9) of the real-depth `preset` on Orin from the shape-real int4 engine dir `engine`."""
    from coverpruner.testing.presets import PRESETS

    p = PRESETS[preset]
    manifest = json.loads((engine / "manifest.json").read_text())
    real = {"layers": p.text["num_hidden_layers"], "vision_blocks": p.vision.get("depth",
                                                                                p.vision.get("num_hidden_layers")),
            "deepstack_mergers": len(p.vision.get("deepstack_visual_indexes", ()))}
    parts = {}
    dec = initializer_bytes(engine / "decoder.onnx")
    if not any(q for _, _, q in dec):
        raise SystemExit(f"{engine}/decoder.onnx: expected an int4 decoder (coverpruner-export --quantize int4), "
                         "got float weights")
    per_layer, rest = grouped(dec, GROUPS["decoder"])
    parts["decoder"] = {"shape_real_layers": len(per_layer), "per_layer_gb": np.mean(list(per_layer.values())) / 1e9,
                        "lm_head_and_norm_gb": rest / 1e9}
    parts["decoder"]["gb"] = parts["decoder"]["lm_head_and_norm_gb"] + real["layers"] * parts["decoder"]["per_layer_gb"]
    vis = initializer_bytes(engine / "vision.onnx")
    blocks, rest = grouped(vis, GROUPS["vision_block"])
    mergers, _ = grouped(vis, GROUPS["deepstack_merger"])
    rest -= sum(mergers.values())
    per_merger = np.mean(list(mergers.values())) if mergers else 0.0
    parts["vision"] = {"shape_real_blocks": len(blocks), "per_block_gb": np.mean(list(blocks.values())) / 1e9,
                       "per_deepstack_merger_gb": per_merger / 1e9, "rest_gb": rest / 1e9}
    parts["vision"]["gb"] = (rest + real["vision_blocks"] * np.mean(list(blocks.values()))
                             + real["deepstack_mergers"] * per_merger) / 1e9
    for graph in ("embed", "probe", "selector", "selector_dart", "selector_cdpruner"):
        if (engine / f"{graph}.onnx").is_file():
            parts[graph] = {"gb": sum(b for _, b, _ in initializer_bytes(engine / f"{graph}.onnx")) / 1e9}
    t = p.text
    kv_layers, states = real_cache_layers(manifest["graphs"]["decoder"], len(per_layer), real["layers"])
    kv_per_token = 2 * kv_layers * t["num_key_value_heads"] * t["head_dim"] * 2  # K and V, fp16
    weights = sum(v["gb"] for v in parts.values()) * 1e9
    # a hybrid decoder's states (contract v5) are a fixed size per sequence, whatever its length: counted with the
    # weights when the context that fits is worked out
    fixed = weights + states
    total = fixed + kv_per_token * CONTEXT
    devices = device_fits(fixed, kv_per_token)
    out = {"preset": preset, "engine": str(engine), "engine_precision": manifest.get("quantization"),
           "real_depth": {**real, "kv_layers": kv_layers}, "parts": parts, "weights_gb": weights / 1e9,
           "states_gb": states / 1e9, "kv_per_token_mb": kv_per_token / 1e6,
           "kv_4k_gb": kv_per_token * CONTEXT / 1e9, "total_4k_gb": total / 1e9, "devices": devices}
    if "layer_pattern" in t:  # sliding-window layers: what a cache bounded by the window would hold at 4k
        pattern = t["layer_pattern"]
        sliding = sum(pattern[i % len(pattern)] == "sliding_attention" for i in range(real["layers"]))
        rows = sliding * min(t["sliding_window"], CONTEXT) + (real["layers"] - sliding) * CONTEXT
        out["kv_4k_window_bounded_gb"] = rows * 2 * t["num_key_value_heads"] * t["head_dim"] * 2 / 1e9
        out["sliding_layers"] = sliding
    return out


def real_cache_layers(record: dict, shape_layers: int, real_layers: int) -> tuple[int, float]:
    """(KV layers, state bytes of one sequence) of the real depth from the engine dir's graphs.decoder record: a
    decoder with states (contract v5) records its KV layers and its states per layer at the shape-real depth, whose
    layers are one whole group of the real stack's pattern (Qwen3.5: 3 Gated DeltaNet + 1 full), so each kind scales
    by real / shape-real layers. States as deployed: a float32 one (the recurrent state) at 4 bytes, the others at
    fp16."""
    if "kv_layers" not in record:
        return real_layers, 0.0
    scale = real_layers / shape_layers
    states = sum(round(len(s["layers"]) * scale) * float(np.prod(s["shape"])) * (4 if s["dtype"] == "float32" else 2)
                 for s in record.get("states", ()))
    return round(len(record["kv_layers"]) * scale), states


def markdown(rows: list[dict]) -> str:
    head = ("| model (int4 decoder, fp16 rest) | decoder | vision (+DeepStack) | embed + probe + selectors | KV 4k "
            "(+ states) | total | " + " | ".join(DEVICES) + " |")
    lines = [head, "|" + "---|" * (6 + len(DEVICES))]
    for r in rows:
        p = r["parts"]
        small = sum(p[g]["gb"] for g in p if g not in ("decoder", "vision"))
        fits = []
        for name in DEVICES:
            d = r["devices"][name]
            fits.append("yes" if d["fits_4k"] else ("no" if d["max_context"] == 0
                                                    else f"not at 4k (max context {d['max_context']})"))
        states = f" + {r['states_gb']:.3f} GB" if r.get("states_gb") else ""
        lines.append(f"| {r['preset']} | {p['decoder']['gb']:.2f} GB | {p['vision']['gb']:.2f} GB | {small:.2f} GB "
                     f"| {r['kv_4k_gb']:.2f} GB{states} | {r['total_4k_gb']:.2f} GB | " + " | ".join(fits) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", type=Path, action="append", required=True, help="int4 engine dir (repeatable)")
    ap.add_argument("--preset", action="append", required=True, help="its shape-real preset (one per --engine)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "orin_memory.json")
    args = ap.parse_args(argv)
    if len(args.engine) != len(args.preset):
        ap.error(f"--engine and --preset pair up: got {len(args.engine)} engine dirs and {len(args.preset)} presets")
    rows = [project(e, p) for e, p in zip(args.engine, args.preset)]
    result = {"benchmark": "orin_memory", "command": "python benchmarks/orin_memory.py " + " ".join(argv or sys.argv[1:]),
              "reserve_gb": RESERVE_GB, "context": CONTEXT, "rows": rows}
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=float))
    tmp.replace(args.out)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
