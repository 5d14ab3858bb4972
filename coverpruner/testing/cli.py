"""coverpruner-make-checkpoint: write a random-weight checkpoint of a preset (testing/presets.py).

CLI: coverpruner-make-checkpoint --preset tiny|llava-1.5-7b|llava-next-tiny|llava-next-7b|qwen2.5-vl-tiny|
     qwen2.5-vl-7b --layers N [--vision-layers N] --output DIR --seed S
"""

from __future__ import annotations

import argparse
import sys

from coverpruner.testing.checkpoints import all_presets, write_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="coverpruner-make-checkpoint",
        description="Write a random-weight LLaVA-1.5 / LLaVA-NeXT / Qwen2.5-VL checkpoint (HF format, real local "
                    "tokenizer).",
    )
    parser.add_argument("--preset", choices=all_presets(), default="tiny",
                        help="tiny / llava-next-tiny / qwen2.5-vl-tiny: test models; llava-1.5-7b / llava-next-7b / "
                             "qwen2.5-vl-7b: real 7B widths for latency work")
    parser.add_argument("--layers", type=int, default=None,
                        help="number of decoder layers (default: tiny 2, 7b presets 32; use 2 for benchmarks)")
    parser.add_argument("--vision-layers", type=int, default=None,
                        help="number of CLIP layers, LLaVA-NeXT presets only (default: tiny 3, llava-next-7b 24)")
    parser.add_argument("--output", required=True, help="directory to write the checkpoint into")
    parser.add_argument("--seed", type=int, default=0, help="random seed for weights and tokenizer corpus")
    args = parser.parse_args(argv)
    try:
        out = write_checkpoint(args.output, preset=args.preset, layers=args.layers, seed=args.seed,
                               vision_layers=args.vision_layers)
    except ValueError as exc:
        parser.exit(2, f"coverpruner-make-checkpoint: error: {exc}\n")
    print(f"wrote {args.preset} checkpoint to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
