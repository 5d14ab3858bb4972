"""Export cost of the shape-real LLaVA-1.5-7B preset (real widths, `--layers` decoder layers): time and peak
RSS per graph, fp32 and fp16.

Each graph is exported in a fresh child process (load the checkpoint in the target dtype, export that one graph),
so its peak RSS (VmHWM) is that graph's alone; an "all" run exports every graph in one process, as
`coverpruner-export` does. The checkpoint is written once (fp16 safetensors, like llava-hf) under
benchmarks/work/. Heavy (~1B parameters): run it under the shared lock.

    python benchmarks/bench_export.py            # 2 layers, fp32 + fp16
    python benchmarks/bench_export.py --layers 1 --dtypes fp16 --graphs embed      # smaller smoke run
Writes benchmarks/results/export_llava-1.5-7b_<L>l.json and prints a table.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coverpruner.engine_dir import GRAPH_NAMES as GRAPHS  # noqa: E402


def _status_kib(field: str) -> int:
    """A VmRSS/VmHWM-style field of /proc/self/status in KiB (Linux); falls back to ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def child(args) -> None:
    """Export `args.graph` ("all" = every graph) and print one JSON line with time and memory."""
    from coverpruner.export.exporter import ExportOptions, export_model

    graphs = GRAPHS if args.graph == "all" else (args.graph,)
    rss0 = _status_kib("VmRSS")
    t0 = time.perf_counter()
    result = export_model(Path(args.checkpoint), Path(args.out), "coverpruner-make-checkpoint llava-1.5-7b",
                          ExportOptions(dtype=args.dtype, graphs=graphs, progress=False))
    wall = time.perf_counter() - t0
    files = {}
    for g in graphs:
        entry = result.manifest["graphs"][g]
        files[g] = sum((Path(args.out) / f).stat().st_size for f in [entry["file"], *entry["data_files"]])
    print(json.dumps({"graph": args.graph, "dtype": args.dtype, "wall_s": wall, "stage_s": result.seconds,
                      "rss_start_gib": rss0 / 2**20, "peak_rss_gib": _status_kib("VmHWM") / 2**20,
                      "file_bytes": files}))


def ensure_checkpoint(path: Path, layers: int) -> None:
    if (path / "config.json").is_file():
        return
    from coverpruner.testing.checkpoints import write_checkpoint

    t0 = time.perf_counter()
    write_checkpoint(path, preset="llava-1.5-7b", layers=layers, seed=0)
    print(f"wrote checkpoint {path} in {time.perf_counter() - t0:.1f}s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the shape-real preset")
    p.add_argument("--dtypes", default="fp32,fp16", help="comma-separated: fp32,fp16")
    p.add_argument("--graphs", default=",".join(GRAPHS) + ",all", help="graphs to time, 'all' = one full export")
    p.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "work", help="checkpoint + engine dirs")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--graph", help=argparse.SUPPRESS)
    p.add_argument("--dtype", help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    ckpt = args.work / f"llava-1.5-7b_{args.layers}l"
    ensure_checkpoint(ckpt, args.layers)
    ckpt_bytes = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
    rows = []
    for dtype in args.dtypes.split(","):
        for graph in args.graphs.split(","):
            out = args.work / f"engine_{args.layers}l_{dtype}" / graph
            cmd = [sys.executable, __file__, "--child", "--graph", graph, "--dtype", dtype,
                   "--checkpoint", str(ckpt), "--out", str(out)]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"export of {graph} ({dtype}) failed")
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append(row)
            export_s = sum(v for k, v in row["stage_s"].items() if k != "load") if graph == "all" \
                else row["stage_s"][graph]
            print(f"{dtype:5s} {graph:9s} wall {row['wall_s']:7.1f}s  export {export_s:7.1f}s  "
                  f"peak RSS {row['peak_rss_gib']:6.2f} GiB  files {sum(row['file_bytes'].values()) / 2**30:6.2f} GiB",
                  flush=True)
    result = {
        "benchmark": "export",
        "command": "python benchmarks/bench_export.py " + " ".join(sys.argv[1:]),
        "preset": "llava-1.5-7b", "layers": args.layers,
        "checkpoint_safetensors_gib": ckpt_bytes / 2**30,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "notes": "wall_s = load + export of that graph in a fresh process; peak_rss_gib = VmHWM of that process; "
                 "graph 'all' = every graph in one process (what coverpruner-export does).",
        "rows": rows,
    }
    import torch
    import transformers

    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    res = ROOT / "benchmarks" / "results" / f"export_llava-1.5-7b_{args.layers}l.json"
    res.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {res}")


if __name__ == "__main__":
    main()
