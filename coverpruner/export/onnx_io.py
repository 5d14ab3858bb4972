"""Turn one torch module into one checked .onnx file (optionally with external data); describe graphs.

Exporter choice: torch.onnx.export(dynamo=True) for every graph. It traces with torch.export, so data-
dependent Python branches in HF code (cache length checks, mask padding) become guards instead of being
silently baked in as the legacy TorchScript tracer does, and initializers stay references to the live
torch parameters until written, so a 7B export holds roughly one copy of the weights. It emits opset 18
natively; other opsets go through the ONNX version converter, and a request it cannot honour is an error.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import onnx

# onnxruntime >= 1.18 loads IR version 10; newer onnx packages stamp newer IR versions by default.
MAX_IR_VERSION = 10
# Graphs whose weights exceed this keep them in <graph>.onnx.data in "auto" mode (export and quantization);
# protobuf's hard limit is 2 GiB.
EXTERNAL_DATA_BYTES = 1 << 30
_ONNX_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
                onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32", onnx.TensorProto.BOOL: "bool"}


class ExportError(RuntimeError):
    """An export step failed; the message names the graph and what went wrong."""


@dataclass
class SavedGraph:
    """Files of one exported graph: `onnx_file` plus its external data files (names relative to its dir)."""

    onnx_file: Path
    data_files: list[str]


def data_file_name(onnx_file: Path) -> str:
    return onnx_file.name + ".data"


def remove_graph_files(onnx_file: Path) -> None:
    """Delete a graph and its external data so a re-export never leaves a stale .data behind."""
    for f in (onnx_file, onnx_file.with_name(data_file_name(onnx_file))):
        f.unlink(missing_ok=True)


def export_graph(module, args: tuple, onnx_file: Path, input_names: list[str], output_names: list[str],
                 dynamic_shapes, opset: int, external_data: bool) -> SavedGraph:
    """Export `module(*args)` to `onnx_file`, pin opset / IR version, save, and run the ONNX checker.

    `dynamic_shapes` follows torch.export (Dim objects per input axis); Dim names become the ONNX
    symbolic dimension names. External data goes to "<file>.data" next to the graph.
    """
    import torch

    remove_graph_files(onnx_file)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        try:
            program = torch.onnx.export(
                module, args, input_names=input_names, output_names=output_names, dynamic_shapes=dynamic_shapes,
                opset_version=opset, dynamo=True, optimize=True, verbose=False, report=False,
            )
        except Exception as exc:  # torch.export errors are long; keep the first line and the graph name
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ExportError(f"{onnx_file.name}: torch.onnx.export failed: {first}") from exc
    got = program.model.opset_imports.get("", None)
    if got != opset:
        raise ExportError(f"{onnx_file.name}: opset {opset} was requested but the exporter produced opset {got} "
                          "(the version converter could not lower every op); use --opset 18")
    program.model.ir_version = min(program.model.ir_version, MAX_IR_VERSION)
    program.save(str(onnx_file), external_data=external_data)
    data = data_file_name(onnx_file)
    data_files = [data] if (onnx_file.parent / data).exists() else []
    check(onnx_file)
    return SavedGraph(onnx_file, data_files)


def save_proto(model: onnx.ModelProto, onnx_file: Path, external_data: bool) -> SavedGraph:
    """Save an already-built ModelProto (e.g. the selector graph) and check it."""
    remove_graph_files(onnx_file)
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    data = data_file_name(onnx_file)
    onnx.save(model, str(onnx_file), save_as_external_data=external_data, all_tensors_to_one_file=True,
              location=data, size_threshold=0)
    check(onnx_file)
    return SavedGraph(onnx_file, [data] if (onnx_file.parent / data).exists() else [])


def check(onnx_file: Path) -> None:
    """onnx.checker on the path (so external data is resolved and >2 GiB graphs work)."""
    try:
        onnx.checker.check_model(str(onnx_file))
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"{onnx_file.name}: onnx.checker failed: {exc}") from exc


def describe_io(onnx_file: Path) -> tuple[int, list[dict], list[dict]]:
    """(opset, inputs, outputs) of a saved graph; each io = {"name", "dtype", "shape"} with ints for
    static axes and strings for symbolic ones. Reads the graph only, never the external weights."""
    model = onnx.load(str(onnx_file), load_external_data=False)

    def one(v):
        t = v.type.tensor_type
        shape = [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else "?")
                 for d in t.shape.dim]
        return {"name": v.name, "dtype": _ONNX_DTYPES.get(t.elem_type, str(t.elem_type)), "shape": shape}

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return opset, [one(v) for v in model.graph.input], [one(v) for v in model.graph.output]
