"""Where a decode step's time goes in our ORT-form decoder and onnxruntime-genai's, node by node (issue 18, 5a).

The Qwen2.5-VL-7B-width graphs of bench_decoder.py (bench_decoder.prepare: same checkpoint, same builds), one
precision. Each engine runs bench_decoder's Runner.generate (1,320-token prefill, 15 decode steps) in a fresh
session with ORT's profiler on; the engines alternate --repeats times, one session alive at a time. Per run: the
decode wall time per token (host work included), ORT's model_run per decode step, and the summed kernel time
per decode step per node kind (digits in node names folded, so "layers.#.gate_proj" sums both layers).

    python benchmarks/profile_decoder_ops.py --workdir /tmp/bench_decoder --precision int4
Writes benchmarks/results/profile_decoder_ops_<precision>_cpu.json.

--checkpoint / --ours / --genai profile given graphs instead (any family bench_decoder.Runner drives, e.g. the
Qwen3.5 graphs bench_pipeline.py --preset qwen3.5-4b --genai builds under its workdir), with --grid the prompt's
square image grid between the default text rows (Qwen3.5 at 1024x1024: 32, 1,048 tokens):

    python benchmarks/profile_decoder_ops.py --precision fp32 --grid 32 --checkpoint W/qwen3.5-4b-4l \
        --ours W/qwen3.5-4b-4l-fp32/decoder.onnx --genai W/qwen3.5-4b-4l-genai-fp32/model.onnx
Writes benchmarks/results/profile_decoder_ops_<checkpoint dir name>_<precision>_cpu.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def profiled_run(bench, engine: str, path: Path, cfg: dict, embed, prompt, positions, capacity: int,
                 threads: int, tmp: str) -> dict:
    """One generate with ORT's profiler: decode ms/token (wall), model_run ms per decode step, and kernel ms per
    decode step by (op type, node name with digits folded)."""
    runner = bench.Runner(engine, path, cfg, capacity, threads, profile_prefix=os.path.join(tmp, engine))
    result = runner.generate(embed, prompt, positions)
    profile = Path(runner.sess.end_profiling())
    events = json.loads(profile.read_text())
    profile.unlink()
    runs = [e for e in events if e.get("name") == "model_run"][1:]  # the decode steps (the first is prefill)
    start = runs[0]["ts"]
    nodes = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            name = re.sub(r"\d+", "#", e["name"][:-len("_kernel_time")])
            nodes[f"{e['args'].get('op_name')} {name}"] += e["dur"]
    steps = len(runs)
    return {"decode_ms_per_token": result["decode_ms"],
            "model_run_ms": sum(e["dur"] for e in runs) / steps / 1e3,
            "nodes_ms": {k: v / steps / 1e3 for k, v in nodes.most_common()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "bench_decoder",
                   help="bench_decoder's checkpoint/graph cache")
    p.add_argument("--precision", choices=("fp32", "int4"), default="int4")
    p.add_argument("--repeats", type=int, default=3, help="alternations of the two engines (default 3)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--checkpoint", type=Path, help="with --ours and --genai: profile these graphs of this checkpoint")
    p.add_argument("--ours", type=Path, help="our ORT-form decoder.onnx (with --checkpoint)")
    p.add_argument("--genai", type=Path, help="onnxruntime-genai's model.onnx (with --checkpoint)")
    p.add_argument("--grid", type=int, default=None, help="side of the prompt's square image grid (default 36)")
    args = p.parse_args(argv)
    import bench_decoder as bench

    given = (args.checkpoint, args.ours, args.genai)
    if any(given) and not all(given):
        raise SystemExit("--checkpoint, --ours and --genai go together")
    if all(given):
        paths = {"checkpoint": args.checkpoint, f"ours-{args.precision}": args.ours,
                 f"genai-{args.precision}": args.genai}
    else:
        paths = bench.prepare(args.workdir, ["ours", "genai"])
    cfg = bench.text_config(paths["checkpoint"])
    embed = bench.Embedder(paths["checkpoint"])
    positions = (bench.native_positions() if args.grid is None
                 else bench.native_positions(bench.PROMPT[0], args.grid, bench.PROMPT[2]))
    prompt = embed(np.random.default_rng(0).integers(0, 1000, positions.shape[1]))
    capacity = positions.shape[1] + bench.NEW_TOKENS
    runs = {"ours": [], "genai": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for engine in (("ours", "genai") if r % 2 == 0 else ("genai", "ours")):
                runs[engine].append(profiled_run(bench, engine, paths[f"{engine}-{args.precision}"], cfg, embed,
                                                 prompt, positions, capacity, args.threads, tmp))
                print(f"{engine}: decode {runs[engine][-1]['decode_ms_per_token']:.2f} ms/token", flush=True)
    summary = {}
    for engine, rs in runs.items():
        keys = rs[0]["nodes_ms"].keys()
        summary[engine] = {
            "decode_ms_per_token": statistics.median(r["decode_ms_per_token"] for r in rs),
            "model_run_ms": statistics.median(r["model_run_ms"] for r in rs),
            "nodes_ms": {k: statistics.median(r["nodes_ms"].get(k, 0.0) for r in rs) for k in keys}}
        print(engine, {k: round(v, 3) for k, v in list(summary[engine]["nodes_ms"].items())[:10]})
    result = {"benchmark": "profile_decoder_ops", "precision": args.precision, "repeats": args.repeats,
              "command": "python benchmarks/profile_decoder_ops.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "summary": summary, "runs": runs,
              "decode_ratio_ours_over_genai": summary["ours"]["decode_ms_per_token"] / summary["genai"]["decode_ms_per_token"],
              "load_average": list(os.getloadavg()), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tag = f"{args.checkpoint.name}_" if args.checkpoint else ""
    out = ROOT / "benchmarks" / "results" / f"profile_decoder_ops_{tag}{args.precision}_cpu.json"
    tmp_out = out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(result, indent=1))
    tmp_out.replace(out)
    print(f"ours / genai decode: {result['decode_ratio_ours_over_genai']:.3f}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
