"""coverpruner-demo: the whole path in one command, offline, in about half a minute on a laptop CPU.

1. write the tiny random-weight LLaVA-1.5 checkpoint (coverpruner-make-checkpoint --preset tiny),
2. export it to an engine dir (coverpruner-export),
3. answer a question about the bundled image with pruned visual tokens (coverpruner-run),
   once at the requested budget and once with all visual tokens, printing both answers and timings.

The weights are random, so the "answers" are arbitrary token strings: the demo shows the machinery
(export, preprocessing, probe, selection, KV-cache decoding, timings), not model quality. Needs the
export extra (torch, transformers); the runtime step itself does not use torch.
"""

from __future__ import annotations

import argparse
import sys
from importlib.resources import files
from pathlib import Path

from coverpruner.integers import cli_int

DEMO_IMAGE = files("coverpruner") / "assets" / "demo.png"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coverpruner-demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=Path("demo"),
                   help="where the checkpoint and engine dir go (default ./demo; reused if present)")
    p.add_argument("--prompt", default="What is shown in this image?", help="question about the bundled image")
    p.add_argument("--image", default=None, help="another image instead of the bundled one")
    p.add_argument("--budget", default="16", help="visual tokens to keep of the tiny model's 144 (or 'full')")
    p.add_argument("--method", default="coverpruner", help="selection method")
    p.add_argument("--max-new-tokens", type=cli_int, default=16, help="answer length")
    p.add_argument("--save-selection", default=None, metavar="PNG", help="also draw the kept patches")
    p.add_argument("--rebuild", action="store_true", help="rewrite checkpoint and engine dir even if present")
    return p


def prepare(workdir: Path, rebuild: bool = False) -> Path:
    """Tiny checkpoint + its fp32 engine dir under ``workdir``; returns the engine dir."""
    from coverpruner.export.exporter import ExportOptions, export_model
    from coverpruner.testing.checkpoints import write_checkpoint

    ckpt, engine = workdir / "tiny-checkpoint", workdir / "tiny-engine"
    if rebuild or not (ckpt / "config.json").is_file():
        print(f"[1/3] writing the tiny random-weight LLaVA-1.5 checkpoint to {ckpt}", flush=True)
        write_checkpoint(ckpt, preset="tiny", seed=0)
    else:
        print(f"[1/3] reusing checkpoint {ckpt}", flush=True)
    from coverpruner.engine_dir import read_if_present

    if rebuild or read_if_present(engine) is None:  # none yet, or one of an older format version
        print(f"[2/3] exporting ONNX graphs + manifest to {engine}", flush=True)
        export_model(ckpt, engine, "coverpruner tiny demo (random weights)", ExportOptions(progress=False))
    else:
        print(f"[2/3] reusing engine dir {engine}", flush=True)
    return engine


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from coverpruner.runtime import CoverPrunerError, Pipeline
    from coverpruner.runtime.cli import _format_timings

    try:
        engine = prepare(args.workdir, args.rebuild)
        image = args.image or str(DEMO_IMAGE)
        print(f"[3/3] answering with coverpruner-run logic: {image!s}", flush=True)
        pipe = Pipeline.load(engine)
        print("NOTE: the demo weights are random; the answer text is meaningless, the timings are real.\n")
        for budget in (args.budget, "full"):
            r = pipe.generate(image, args.prompt, budget=budget, method=args.method,
                              max_new_tokens=args.max_new_tokens)
            label = f"budget {budget} ({args.method})" if budget != "full" else "budget full (no pruning)"
            print(f"Q: {args.prompt}\nA [{label}]: {r.text!r}")
            print("   " + _format_timings(r) + "\n")
            if budget != "full" and args.save_selection:
                from coverpruner.runtime.visualize import save_selection

                save_selection(args.save_selection, image, r.kept_indices, r.panels)
                print(f"   kept patches drawn to {args.save_selection}\n")
        print(f"Next: coverpruner-run {engine} --image {image} --prompt '...' --budget 32 --json")
    except CoverPrunerError as exc:
        print(f"coverpruner-demo: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
