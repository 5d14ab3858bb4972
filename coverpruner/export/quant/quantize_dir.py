"""Weight-only INT4/INT8 quantization of an exported engine dir (a pass after coverpruner-export).

Each chosen graph (default: decoder) is read, its MatMuls whose weight is a 2-D float initializer [K, N] are
quantized block-wise along K, and the graph is written back; the manifest's graph entry (sha256, opset,
data files) is rewritten through the export's manifest writer and a `quantization` record is added:

    "quantization": {"method": "rtn-blockwise", "bits": 4, "dtype": "int4", "block_size": 32, "format": "ort",
                     "symmetric": false, "accuracy_level": 4, "lm_head": true, "embeddings": false,
                     "graphs": {"decoder": {"quantized_matmuls": 15, "float_matmuls_left": 4}},
                     "tool": "onnxruntime.quantization.MatMulNBitsQuantizer 1.31.1"}

`precision` stays the float precision of activations (fp32 / fp16): the runtime's input and KV dtypes.
Nothing is written half-way: the new graph files are written into a staging dir beside the engine dir and
checked (onnx.checker), the other files are hard-linked in, the manifest is written, and only then does the
stage replace the dir (coverpruner.staged_dir); a failed or killed run leaves the dir as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx

from coverpruner.engine_dir import MANIFEST, read_raw, write_manifest
from coverpruner.errors import ManifestError
from coverpruner.export.manifest import graph_entry
from coverpruner.export.onnx_io import EXTERNAL_DATA_BYTES, MAX_IR_VERSION, SavedGraph, check, data_file_name
from coverpruner.staged_dir import StagedDir

WEIGHT_BITS = {"int4": 4, "int8": 8}  # --quantize -> bits per weight
FORMATS = ("ort", "qdq")
BLOCK_SIZES = (32, 64, 128)
#: Graphs with MatMul weights worth quantizing ("embed" = the token table, ORT form int4 only).
QUANT_GRAPHS = ("decoder", "vision", "probe", "embed")
#: Weight-only ops this pass writes; a graph holding any of them is already quantized.
QUANT_OPS = ("MatMulNBits", "DequantizeLinear", "GatherBlockQuantized")
TMP_DIR = ".quantize-tmp"  # where earlier versions staged graphs inside the dir; not carried over
DEFAULT_ACCURACY_LEVEL = 4  # MatMulNBits int8 compute: see QuantOptions
_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


class QuantizeError(ValueError):
    """Bad quantization request or engine dir; the message names the option, file or field at fault."""


@dataclass
class QuantOptions:
    """dtype: int4 | int8; form: ort (MatMulNBits) | qdq (DequantizeLinear + MatMul, for TensorRT);
    block_size: 32 | 64 | 128 weights per scale along K; graphs: subset of QUANT_GRAPHS; lm_head: quantize the
    decoder's output projection too; accuracy_level: MatMulNBits compute type (ORT form only; None = 4, int8
    compute: ORT's CPU kernel for 8-bit weights dequantizes the whole matrix on every call otherwise, measured
    ~460x slower than level 4 for one token on a 4096x4096 weight, for +50% rounding error; see
    docs/quantization.md)."""

    dtype: str = "int4"
    form: str = "ort"
    block_size: int = 32
    graphs: tuple[str, ...] = ("decoder",)
    lm_head: bool = True
    accuracy_level: int | None = None

    @property
    def bits(self) -> int:
        return WEIGHT_BITS[self.dtype]

    @property
    def matmulnbits_accuracy_level(self) -> int | None:
        """The accuracy_level written into MatMulNBits nodes (None for the qdq form)."""
        if self.form != "ort":
            return None
        return DEFAULT_ACCURACY_LEVEL if self.accuracy_level is None else self.accuracy_level

    def validate(self) -> None:
        if self.dtype not in WEIGHT_BITS:
            raise QuantizeError(f"--quantize: expected one of {list(WEIGHT_BITS)}, got {self.dtype!r}")
        if self.form not in FORMATS:
            raise QuantizeError(f"--quant-format: expected one of {list(FORMATS)}, got {self.form!r}")
        if self.block_size not in BLOCK_SIZES:
            raise QuantizeError(f"--block-size: expected one of {list(BLOCK_SIZES)}, got {self.block_size!r}")
        bad = [g for g in self.graphs if g not in QUANT_GRAPHS]
        if bad or not self.graphs:
            raise QuantizeError(f"--quantize-graphs: expected a subset of {list(QUANT_GRAPHS)}, got "
                                f"{list(self.graphs)}")
        if "embed" in self.graphs and (self.form != "ort" or self.bits != 4):
            raise QuantizeError("--quantize-graphs embed: the token table quantizes only as int4 in the ort form "
                                "(onnxruntime's GatherBlockQuantized); drop embed or use --quantize int4 "
                                "--quant-format ort")
        if self.accuracy_level not in (None, 0, 1, 2, 3, 4):
            raise QuantizeError(f"--accuracy-level: expected 0..4, got {self.accuracy_level!r}")
        if self.accuracy_level and self.form != "ort":
            raise QuantizeError("--accuracy-level applies to the ort form (MatMulNBits) only")


@dataclass
class QuantResult:
    record: dict
    removed_bytes: dict = field(default_factory=dict)  # graph -> bytes of graph files before
    written_bytes: dict = field(default_factory=dict)  # graph -> bytes after


def graph_bytes(directory: Path, entry: dict) -> int:
    """Bytes on disk of one manifest graph entry (.onnx plus its external data)."""
    files = [entry["file"], *entry.get("data_files", [])]
    return sum((Path(directory) / f).stat().st_size for f in files)


def quantized_ops(onnx_file: Path) -> list[str]:
    """Weight-only quantization ops present in a graph (reads the graph, not its external weights)."""
    model = onnx.load(str(onnx_file), load_external_data=False)
    return sorted({n.op_type for n in model.graph.node if n.op_type in QUANT_OPS})


def matmul_targets(model: onnx.ModelProto, vocab_size: int | None, lm_head: bool,
                   k_multiple: int = 1) -> tuple[set[str], int]:
    """(names of MatMuls whose weight input is a 2-D float initializer, count of such MatMuls left float).

    The decoder's lm_head is the MatMul with weight [hidden, vocab_size]; it is left float when lm_head is
    False. A weight whose K is not a multiple of `k_multiple` stays float (TensorRT's parser wants whole
    blocks along K for the QDQ form). MatMuls between activations (attention scores) are never targets.
    """
    inits = {t.name: t for t in model.graph.initializer}
    targets, left = set(), 0
    for node in model.graph.node:
        if node.op_type != "MatMul":
            continue
        w = inits.get(node.input[1])
        if w is None or len(w.dims) != 2 or w.data_type not in _FLOAT_TYPES:
            continue
        if (not lm_head and vocab_size is not None and w.dims[1] == vocab_size) or w.dims[0] % k_multiple:
            left += 1
            continue
        if not node.name:
            raise QuantizeError(f"MatMul with weight {w.name!r} has no node name; re-export the graph")
        targets.add(node.name)
    return targets, left


def _gather_table(model: onnx.ModelProto) -> str | None:
    inits = {t.name for t in model.graph.initializer}
    return next((n.name for n in model.graph.node if n.op_type == "Gather" and n.input[0] in inits), None)


def _quantize_model(model: onnx.ModelProto, graph: str, opts: QuantOptions,
                    vocab_size: int) -> tuple[onnx.ModelProto, dict]:
    """Quantized copy of `model` and its per-graph record."""
    if graph == "embed":
        table = _gather_table(model)
        if table is None:
            raise QuantizeError("embed.onnx has no Gather over a constant table to quantize")
        from onnxruntime.quantization import QuantFormat
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        from coverpruner.export.quant.ort_nbits import quiet_quantizer_log

        quiet_quantizer_log()
        q = MatMulNBitsQuantizer(model, bits=4, block_size=opts.block_size, is_symmetric=False,
                                 quant_format=QuantFormat.QOperator, op_types_to_quantize=("Gather",),
                                 quant_axes=(("Gather", 1),))
        q.process()
        return q.model.model, {"quantized_gathers": 1}
    targets, left = matmul_targets(model, vocab_size if graph == "decoder" else None, opts.lm_head,
                                   opts.block_size if opts.form == "qdq" else 1)
    if not targets:
        why = f" whose K is a multiple of --block-size {opts.block_size}" if opts.form == "qdq" else ""
        raise QuantizeError(f"{graph}.onnx has no MatMul with a constant 2-D float weight{why} to quantize")
    if opts.form == "ort":
        from coverpruner.export.quant.ort_nbits import quantize_graph_nbits

        model = quantize_graph_nbits(model, targets, opts.bits, opts.block_size, opts.matmulnbits_accuracy_level)
    else:
        from coverpruner.export.quant.qdq import quantize_graph_qdq

        quantize_graph_qdq(model, targets, opts.bits, opts.block_size)
    return model, {"quantized_matmuls": len(targets), "float_matmuls_left": left}


def _save(model: onnx.ModelProto, onnx_file: Path, external: bool) -> SavedGraph:
    model.ir_version = min(max(model.ir_version, 10 if any(  # int4 needs IR >= 10; ORT reads IR <= 10
        t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4) for t in model.graph.initializer) else 0),
        MAX_IR_VERSION)
    data = data_file_name(onnx_file)
    onnx.save(model, str(onnx_file), save_as_external_data=external, all_tensors_to_one_file=True,
              location=data, size_threshold=1024)
    check(onnx_file)
    return SavedGraph(onnx_file, [data] if (onnx_file.parent / data).exists() else [])


def _tool(opts: QuantOptions, graphs) -> str:
    import onnxruntime

    if opts.form == "ort" or "embed" in graphs:
        return f"onnxruntime.quantization.MatMulNBitsQuantizer {onnxruntime.__version__}"
    return "coverpruner.export.quant.qdq (symmetric round-to-nearest)"


def quantize_engine_dir(directory: str | Path, opts: QuantOptions, progress: bool = False) -> QuantResult:
    """Quantize `opts.graphs` of the engine dir in place and record it in manifest.json (see module doc).

    Three steps: check the directory, write every quantized graph and the new manifest into a staging dir beside
    it (the other files hard-linked in), and swap the stage in only when complete (coverpruner.staged_dir): a
    killed run leaves the directory as it was. Raises QuantizeError for a bad option, a directory without a
    manifest, a graph the manifest lacks, or a directory that is already quantized; the directory is unchanged then.
    """
    opts.validate()
    directory = Path(directory)
    manifest = _checked_manifest(directory, opts)
    old_files = {f for g in opts.graphs for f in [manifest["graphs"][g]["file"],
                                                   *manifest["graphs"][g].get("data_files", [])]}
    with StagedDir(directory) as stage:
        records, before, after = _write_quantized(directory, stage.path, manifest, opts, progress)
        stage.carry_rest(skip=old_files | {MANIFEST, TMP_DIR})
        record = _record(opts, records)
        manifest["quantization"] = record
        write_manifest(stage.path, manifest)
    return QuantResult(record, before, after)


def _checked_manifest(directory: Path, opts: QuantOptions) -> dict:
    """The raw manifest of a float engine dir holding every graph of `opts.graphs`; QuantizeError otherwise."""
    try:
        manifest = read_raw(directory)
    except ManifestError as exc:
        raise QuantizeError(str(exc)) from None
    if manifest.get("quantization"):
        q = manifest["quantization"]
        raise QuantizeError(f"{directory / MANIFEST}: already quantized ({q.get('dtype')}, {q.get('format')} form, "
                            f"graphs {sorted(q.get('graphs', {}))}); re-export the float graphs before quantizing")
    missing = [g for g in opts.graphs if g not in manifest["graphs"]]
    if missing:
        raise QuantizeError(f"{directory / MANIFEST}: --quantize-graphs {missing} not in graphs "
                            f"(have {sorted(manifest['graphs'])})")
    for g in opts.graphs:
        if not (directory / manifest["graphs"][g]["file"]).is_file():
            raise QuantizeError(f"{directory / manifest['graphs'][g]['file']}: listed in manifest graphs.{g} but "
                                "missing")
        found = quantized_ops(directory / manifest["graphs"][g]["file"])
        if found:
            raise QuantizeError(f"{directory / manifest['graphs'][g]['file']}: already quantized (has {found}); "
                                "re-export the float graph before quantizing")
    return manifest


def _write_quantized(directory: Path, stage: Path, manifest: dict, opts: QuantOptions, progress: bool):
    """Quantize each graph of `directory` into `stage` and point `manifest`'s graph entries at the new files (in
    memory; the caller writes the manifest into the stage). The entry's other facts (decoder form, rotary) stay as
    exported. Returns ({graph: its quantization record}, {graph: float bytes}, {graph: quantized bytes})."""
    from coverpruner.progress import stage_bar

    records, before, after = {}, {}, {}
    bar = stage_bar(len(opts.graphs), "quantize", unit="graph", enabled=progress)  # a line per graph in a log
    for g in opts.graphs:
        bar.set_description(f"quantize: {g}")
        entry = manifest["graphs"][g]
        try:
            model = onnx.load(str(directory / entry["file"]))  # with external data
        except (OSError, onnx.checker.ValidationError) as exc:
            raise QuantizeError(f"{directory / entry['file']}: cannot be read ({exc})") from exc
        before[g] = graph_bytes(directory, entry)
        model, records[g] = _quantize_model(model, g, opts, manifest["dims"]["vocab_size"])
        nbytes = sum(t.ByteSize() for t in model.graph.initializer)
        external = bool(entry.get("data_files")) or nbytes > EXTERNAL_DATA_BYTES
        try:
            saved = _save(model, stage / entry["file"], external)
        except onnx.checker.ValidationError as exc:
            raise QuantizeError(f"quantized graph failed onnx.checker: {exc}") from exc
        del model
        # graph_entry rewrites every file fact (file, data files, hashes, opset, inputs/outputs); the entry's other
        # facts (decoder form, rotary, contract v4's decoder extras) stay as exported
        manifest["graphs"][g] = {**entry, **graph_entry(saved)}
        after[g] = graph_bytes(stage, manifest["graphs"][g])
        bar.update()
    bar.close()
    return records, before, after


def _record(opts: QuantOptions, records: dict) -> dict:
    """The manifest's "quantization" record of this pass (docs/quantization.md)."""
    return {
        "method": "rtn-blockwise", "bits": opts.bits, "dtype": opts.dtype, "block_size": opts.block_size,
        "format": opts.form, "symmetric": opts.form == "qdq",
        "accuracy_level": opts.matmulnbits_accuracy_level,
        "lm_head": opts.lm_head and "decoder" in opts.graphs, "embeddings": "embed" in opts.graphs,
        "graphs": records, "tool": _tool(opts, opts.graphs),
    }


__all__ = ["BLOCK_SIZES", "WEIGHT_BITS", "FORMATS", "QUANT_GRAPHS", "QuantOptions", "QuantResult", "QuantizeError",
           "quantize_engine_dir", "quantized_ops", "matmul_targets", "graph_bytes"]
