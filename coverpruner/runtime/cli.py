"""coverpruner-run: answer a question about an image with an exported engine dir.

    coverpruner-run DIR --image PATH --prompt TEXT [--budget N|full] [--method NAME]
                    [--provider NAME] [--max-new-tokens N] [--stream] [--json] [--save-selection PNG]
                    [family options, e.g. --newline-policy drop|keep]

Exit codes: 0 ok, 2 bad input (one line on stderr: missing dir/manifest, unknown version, hash
mismatch, unreadable image, prompt too long, unknown method/provider), 1 unexpected failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from coverpruner.engines.ort import PROVIDERS
from coverpruner.families import request_options
from coverpruner.runtime.errors import CoverPrunerError, OptionError
from coverpruner.runtime.pipeline import METHODS, parse_budget


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coverpruner-run", description=__doc__.split("\n\n")[0])
    p.add_argument("engine_dir", metavar="DIR", help="engine dir written by coverpruner-export")
    req = p.add_argument_group("request")
    req.add_argument("--image", required=True, help="image file (PNG, JPEG, ...)")
    req.add_argument("--prompt", required=True, help="question about the image")
    prune = p.add_argument_group("pruning")
    prune.add_argument("--budget", default=None,
                       help="visual tokens to keep (integer) or 'full' for no pruning (default: manifest)")
    prune.add_argument("--method", default=None,
                       help=f"selection method, one of {', '.join(METHODS)} (default: manifest)")
    prune.add_argument("--tau", type=float, default=None, help="demand temperature (default: manifest, 0.3)")
    prune.add_argument("--selector", choices=("auto", "onnx", "numpy"), default="auto",
                       help="run the coverpruner method with the dir's selector.onnx or in numpy "
                            "(default auto: selector.onnx when the dir has its standard-op form)")
    gen = p.add_argument_group("generation")
    gen.add_argument("--max-new-tokens", type=int, default=128, help="answer length limit (default 128)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0)")
    gen.add_argument("--seed", type=int, default=None, help="sampling / random-method seed")
    fam = p.add_argument_group("model family options (default: the engine dir's)")
    for name, (opt, families) in sorted(request_options().items()):
        choices = f" ({'|'.join(map(str, opt.choices))})" if opt.choices else ""
        fam.add_argument("--" + name.replace("_", "-"), dest=f"family_{name}", default=None,
                         metavar=opt.metavar or name.upper(), help=f"{opt.help}{choices} [{', '.join(families)}]")
    eng = p.add_argument_group("engine")
    eng.add_argument("--provider", default="cpu", help=f"execution provider: {', '.join(PROVIDERS)} (default cpu)")
    eng.add_argument("--threads", type=int, default=None, help="intra-op threads (default: ORT's choice)")
    out = p.add_argument_group("output")
    out.add_argument("--stream", action="store_true", help="print the answer as it is decoded")
    out.add_argument("--json", action="store_true", help="print the full result with timings as JSON")
    out.add_argument("--save-selection", metavar="PNG", default=None,
                     help="draw kept patches over the image (pruned ones dimmed) into this PNG")
    return p


def _format_timings(result) -> str:
    t = result.timings_ms
    return ("timings ms: " + " ".join(f"{k}={t[k]:.1f}" for k in
                                      ("preprocess", "vision", "embed", "probe", "select", "prefill", "decode", "total"))
            + f" | decode {result.decode_tokens_per_s:.1f} tok/s | kept {len(result.kept_indices)}"
              f"/{result.num_visual_tokens} visual tokens, prefill {result.prefill_tokens} tokens")


def engine_precision(manifest) -> dict:
    """What --json reports about the engine dir's numbers: activation precision, weight precision and the
    manifest's weight-only quantization record (None for float weights)."""
    quant = manifest.raw.get("quantization")
    return {"precision": manifest.precision, "weights": quant["dtype"] if quant else manifest.precision,
            "quantization": quant}


def check_png_path(path: str) -> None:
    """--save-selection: a .png file name in an existing, writable folder (checked before any work)."""
    p = Path(path)
    if p.is_dir():
        raise OptionError(f"--save-selection {path}: is a directory; give a file name ending in .png")
    if p.suffix.lower() != ".png":
        raise OptionError(f"--save-selection {path}: the file is written as PNG; its name must end in .png")
    parent = p.parent
    if not parent.is_dir():
        raise OptionError(f"--save-selection {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OptionError(f"--save-selection {path}: folder {parent} is not writable")


def run(args) -> int:
    from coverpruner.runtime.pipeline import Pipeline

    if args.provider not in PROVIDERS:
        raise OptionError(f"unknown provider {args.provider!r}; expected one of {list(PROVIDERS)}")
    if args.method is not None and args.method not in METHODS:
        raise OptionError(f"unknown method {args.method!r}; expected one of {list(METHODS)}")
    if args.save_selection:
        check_png_path(args.save_selection)
    pipe = Pipeline.load(args.engine_dir, provider=args.provider, threads=args.threads, selector=args.selector)
    defaults = pipe.manifest.defaults
    budget = parse_budget(args.budget if args.budget is not None else defaults.get("budget", 64))
    method = args.method or defaults.get("method", "coverpruner")
    options = {k[len("family_"):]: v for k, v in vars(args).items() if k.startswith("family_") and v is not None}
    stream = pipe.stream(args.image, args.prompt, budget=budget, method=method, tau=args.tau,
                         max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                         seed=args.seed, **options)
    for piece in stream:
        if args.stream and not args.json:
            print(piece, end="", flush=True)
    result = stream.result
    if args.save_selection:
        from coverpruner.runtime.visualize import save_selection

        save_selection(args.save_selection, args.image, result.kept_indices, result.panels)
    if args.json:
        print(json.dumps({**result.to_dict(), "engine": engine_precision(pipe.manifest)}, indent=2))
    else:
        print("" if args.stream else result.text)
        print(_format_timings(result), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except CoverPrunerError as exc:
        print(f"coverpruner-run: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
