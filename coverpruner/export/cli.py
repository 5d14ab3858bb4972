"""coverpruner-export: checkpoint (alias, HF id in the local cache, or directory) -> engine dir.

Exit codes: 0 done; 2 model not available locally or bad arguments; 1 export failed (message names the graph).
With --quantize the exported (or, without --model, the existing) dir is then quantized weight-only
(coverpruner/export/quant); a bad quantization option is refused before anything is written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from coverpruner.integers import cli_int
from coverpruner.export.exporter import DECODER_FORMS, FLOAT_DTYPES, GRAPHS, ExportOptions
from coverpruner.export.resolve import MissingModelError, resolve_model
from coverpruner.families import all_aliases


def _graphs(text: str) -> tuple[str, ...]:
    names = tuple(g.strip() for g in text.split(",") if g.strip())
    bad = [g for g in names if g not in GRAPHS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown graph(s) {bad or [text]}; choose from {','.join(GRAPHS)}")
    return names


def _option(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (e.g. newline_policy=keep), got {text!r}")
    return name.strip().replace("-", "_"), value.strip()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coverpruner-export",
                                description="Export a VLM checkpoint to ONNX graphs + manifest.json (offline).")
    src = p.add_argument_group("source and destination")
    src.add_argument("--model", default=None,
                     help=f"alias ({', '.join(all_aliases())}), Hugging Face repo id (must be in the local HF "
                          "cache) or a local checkpoint directory; required unless --quantize only quantizes DIR")
    src.add_argument("--output", required=True, type=Path, help="engine directory to write (created if needed)")
    g = p.add_argument_group("graphs")
    g.add_argument("--dtype", choices=sorted(FLOAT_DTYPES), default="fp32",
                   help="float precision of weights and float tensors (relevance/softmax stay float32); default fp32")
    g.add_argument("--graphs", type=_graphs, default=GRAPHS,
                   help=f"comma-separated subset to (re-)export; default all: {','.join(GRAPHS)}")
    g.add_argument("--opset", type=cli_int, default=18,
                   help="ONNX opset (>= 17; the exporter is native at 18, 17 only where every op converts)")
    g.add_argument("--selector", choices=("loop", "plugin"), default="loop",
                   help="selector graph form: standard ops with Loop (portable) or a TensorRT plugin node")
    g.add_argument("--decoder-form", choices=DECODER_FORMS, default="auto",
                   help="decoder graph: 'ort' = ONNX Runtime contrib ops with an in-place KV cache (fastest on the "
                        "ORT CPU runtime; not for coverpruner-build), 'standard' = standard ONNX ops (TensorRT, CUDA); "
                        "'auto' (default): ort for --dtype fp32, standard for fp16")
    g.add_argument("--probe", choices=("exact", "proxy"), default="exact",
                   help="what probe.onnx scores: 'exact' (default) the attention of the family's probe layer (a "
                        "hybrid decoder's first full-attention layer, after the layers before it); 'proxy' a cheaper "
                        "stand-in where the family has one (Qwen3.5: layer 0's Gated DeltaNet query and key as a "
                        "softmax; docs/qwen3_5.md)")
    g.add_argument("--external-data", choices=("auto", "always", "never"), default="auto",
                   help="store weights in <graph>.onnx.data: auto = graphs above 1 GiB")
    q = p.add_argument_group("weight-only quantization (after export; without --model: of the existing DIR)")
    q.add_argument("--quantize", metavar="int4|int8", default=None,
                   help="quantize MatMul weights block-wise to int4 or int8 (activations keep --dtype)")
    q.add_argument("--quant-format", metavar="ort|qdq", default="ort",
                   help="ort: onnxruntime MatMulNBits (default); qdq: DequantizeLinear + MatMul for TensorRT")
    q.add_argument("--block-size", type=cli_int, metavar="32|64|128", default=32, help="weights per scale (default 32)")
    q.add_argument("--quantize-graphs", default="decoder", metavar="decoder[,vision,probe,embed]",
                   help="graphs to quantize (default decoder)")
    q.add_argument("--accuracy-level", type=cli_int, default=None,
                   help="MatMulNBits compute type (ort form): 0 input type, 1 fp32, 2 fp16, 3 bf16, 4 int8 "
                        "(default 4: ORT's CPU has no fast 8-bit kernel otherwise)")
    q.add_argument("--keep-lm-head-float", action="store_true", help="leave the decoder's lm_head unquantized")
    fam = p.add_argument_group("model family")
    fam.add_argument("--option", type=_option, action="append", default=[], metavar="NAME=VALUE",
                     help="default of one of the family's request options, recorded in the manifest (e.g. "
                          "newline_policy=keep for LLaVA-NeXT); requests may still override it. Repeatable")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _quant_options(args):
    """QuantOptions from the CLI, validated (QuantizeError on bad values), or None without --quantize."""
    if args.quantize is None:
        return None
    from coverpruner.export.quant import QuantOptions

    graphs = tuple(g.strip() for g in args.quantize_graphs.split(",") if g.strip())
    opts = QuantOptions(dtype=args.quantize, form=args.quant_format, block_size=args.block_size, graphs=graphs,
                        lm_head=not args.keep_lm_head_float, accuracy_level=args.accuracy_level)
    opts.validate()
    return opts


def _check_quantized_kept(output: Path, exported: tuple[str, ...]) -> None:
    """A partial re-export must not keep quantized graphs of DIR while dropping their manifest record."""
    from coverpruner.export.manifest import read_manifest
    from coverpruner.export.quant import QuantizeError

    previous = read_manifest(output) or {}
    kept = sorted(set(previous.get("quantization", {}).get("graphs", {})) - set(exported))
    if kept:
        raise QuantizeError(f"{output}/manifest.json: graphs {kept} are quantized; re-export them too (--graphs) "
                            "or export into a fresh directory")


class UsageError(ValueError):
    """A bad command line found after argparse (one line, exit 2)."""


def _check_output(output: Path) -> None:
    """--output must be a folder or creatable as one, and its parent writable (the export is staged beside it
    and swapped in): checked before the model loads (a file in the path failed with NotADirectoryError after
    11 s, an unwritable one after 20 s with vision written)."""
    probe = Path(output).resolve()
    if probe.exists() and not probe.is_dir():
        raise UsageError(f"--output {output}: is a file, expected a folder")
    probe = probe.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"--output {output}: {probe} is a file, expected a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"--output {output}: {probe} is not writable (the new dir is written beside the old "
                         "one and swapped in)")


def _quantize(output: Path, opts, progress: bool) -> None:
    from coverpruner.export.quant import quantize_engine_dir

    res = quantize_engine_dir(output, opts, progress=progress)
    sizes = ", ".join(f"{g} {res.removed_bytes[g] / 2**20:.1f} -> {res.written_bytes[g] / 2**20:.1f} MiB"
                      for g in res.written_bytes)
    print(f"quantized {opts.dtype} ({opts.form} form, block {opts.block_size}) in {output}: {sizes}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.opset < 17:
        print(f"coverpruner-export: --opset must be >= 17, got {args.opset}", file=sys.stderr)
        return 2
    from coverpruner.export.quant import QuantizeError

    try:
        quant = _quant_options(args)
        if args.model is None:
            if quant is None:
                raise UsageError("--model is required (only --quantize works on an existing --output dir)")
            _quantize(args.output, quant, not args.no_progress)
            return 0
        _check_output(args.output)
        _check_quantized_kept(args.output, args.graphs)
        model_dir, source = resolve_model(args.model)
    except (MissingModelError, QuantizeError, UsageError) as exc:
        print(f"coverpruner-export: {exc}", file=sys.stderr)
        return 2
    from coverpruner.export.checkpoint_checks import CheckpointError
    from coverpruner.export.exporter import OptionValueError, TargetError, export_model
    from coverpruner.export.onnx_io import ExportError

    opts = ExportOptions(dtype=args.dtype, graphs=args.graphs, opset=args.opset, selector_form=args.selector,
                         external_data=args.external_data, decoder_form=args.decoder_form, progress=not args.no_progress,
                         family_options=dict(args.option), probe=args.probe)
    try:
        result = export_model(model_dir, args.output, source, opts)
    except (OptionValueError, TargetError, CheckpointError) as exc:  # bad input, nothing written
        print(f"coverpruner-export: {exc}", file=sys.stderr)
        return 2
    except (ExportError, KeyError, FileNotFoundError, ValueError) as exc:
        print(f"coverpruner-export: {exc}", file=sys.stderr)
        return 1
    for note in result.notes:
        print(f"coverpruner-export: note: {note}", file=sys.stderr)
    timing = ", ".join(f"{k} {v:.1f}s" for k, v in result.seconds.items())
    print(f"wrote {', '.join(result.manifest['graphs'])} to {result.output} ({timing})")
    if quant is not None:
        try:
            _quantize(args.output, quant, not args.no_progress)
        except QuantizeError as exc:
            print(f"coverpruner-export: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
