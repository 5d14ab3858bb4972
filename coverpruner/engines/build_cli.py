"""coverpruner-build: turn an exported directory into TensorRT engines.

    coverpruner-build DIR --backend tensorrt [--precision fp16|bf16|int8] [--plugin PATH] [--budgets 64,128]
                      [--max-context N] [--max-batch B] [--graphs vision decoder] [--shape seq=1:600:4096]

Writes DIR/<graph>.engine for each graph and a "tensorrt" section in DIR/manifest.json (TensorRT version,
compute capability, precision, profiles). See docs/tensorrt.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from coverpruner.integers import ascii_int, cli_int

from .tensorrt import (
    FLAVOURS,
    PRECISIONS,
    BuildOptions,
    TensorRTBuildError,
    build_engine_dir,
    load_tensorrt,
)


def _budgets(text: str) -> tuple[int, ...]:
    values = tuple(ascii_int(v) for v in text.split(",") if v.strip())
    if None in values:
        raise argparse.ArgumentTypeError(f"--budgets must be comma-separated ints, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--budgets needs ints >= 1, got {text!r}")
    return values


def _shape(text: str) -> tuple[str, tuple[int, int, int]]:
    axis, _, rng = text.partition("=")
    bounds = [ascii_int(v) for v in rng.split(":")]
    if not axis or len(bounds) != 3 or None in bounds:
        raise argparse.ArgumentTypeError(f"--shape must look like AXIS=MIN:OPT:MAX, got {text!r}")
    lo, opt, hi = bounds
    if not 0 <= lo <= opt <= hi:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: need 0 <= MIN <= OPT <= MAX")
    return axis, (lo, opt, hi)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coverpruner-build", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("engine_dir", type=Path, help="directory written by coverpruner-export (has manifest.json)")
    p.add_argument("--backend", choices=("tensorrt",), default="tensorrt",
                   help="engine backend (TensorRT or TensorRT-RTX, see --flavour)")
    g = p.add_argument_group("precision and plugin")
    g.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="engine precision (default: the export's dtype). int8 needs a Q/DQ graph; TensorRT-RTX "
                        "needs the graph exported in the same precision")
    g.add_argument("--plugin", type=Path, default=None,
                   help="libcoverpruner_trt_plugin.so; required when selector.onnx is the plugin form")
    g.add_argument("--flavour", choices=FLAVOURS, default=None,
                   help="python module to build with (default: tensorrt if usable, else tensorrt_rtx)")
    s = p.add_argument_group("optimization profiles")
    s.add_argument("--budgets", type=_budgets, default=(64,),
                   help="selector budgets the engines must accept, e.g. 64,128 (first = optimum; default 64)")
    s.add_argument("--max-context", type=cli_int, default=None,
                   help="longest token sequence for probe/decoder (default: the model's max positions)")
    s.add_argument("--max-batch", type=cli_int, default=1, help="largest batch for vision/embed/decoder (default 1)")
    s.add_argument("--shape", type=_shape, action="append", default=[], metavar="AXIS=MIN:OPT:MAX",
                   help="override the range of one symbolic axis (repeatable), e.g. seq=1:700:2048")
    o = p.add_argument_group("other")
    o.add_argument("--graphs", nargs="+", default=None, help="build only these graphs (default: all)")
    o.add_argument("--workspace-mib", type=cli_int, default=None, help="builder workspace limit in MiB")
    o.add_argument("--verbose", action="store_true", help="TensorRT's verbose log")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    options = BuildOptions(precision=args.precision, budgets=args.budgets, max_context=args.max_context,
                           max_batch=args.max_batch, plugin=args.plugin, shapes=dict(args.shape),
                           graphs=tuple(args.graphs) if args.graphs else None, workspace_mib=args.workspace_mib)
    try:
        options.validate()
        trt = load_tensorrt(args.flavour)
        print(f"coverpruner-build: {trt.flavour} {trt.version}", file=sys.stderr)
        section = build_engine_dir(args.engine_dir, options, trt, verbose=args.verbose,
                                   progress=lambda g: print(f"  building {g} ...", file=sys.stderr, flush=True))
    except (TensorRTBuildError, ValueError) as exc:
        parser.exit(2, f"coverpruner-build: error: {exc}\n")
    for graph, rec in section["engines"].items():
        print(f"{graph}: {args.engine_dir / rec['file']}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
