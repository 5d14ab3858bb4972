"""Export a checkpoint into an engine dir: one graph at a time, then support files and manifest.json.

RAM: the model is loaded once, straight into the target dtype (for an fp16 checkpoint exported in fp16 the
parameters stay memory-mapped views of the safetensors file), and each graph's initializers reference the
live parameters while it is written. Parts are deliberately NOT dropped between graphs: measured on the
shape-real 7B preset, setting the exported vision tower / token table to None made the next torch.export
materialise ~3 GiB of copies (peak 5.3 GiB vs 2.4 GiB, benchmarks/bench_export.py), while the mmapped
pages they hold are file-backed and reclaimable anyway.
"""

from __future__ import annotations

import gc
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from coverpruner.export.manifest import build_manifest, graph_entry, read_manifest, write_manifest
from coverpruner.export.onnx_io import ExportError, SavedGraph, export_graph, remove_graph_files, save_proto
from coverpruner.families import family_for_model_type

GRAPHS = ("vision", "embed", "probe", "selector", "decoder")
DTYPES = {"fp32": "float32", "fp16": "float16"}
# Graphs whose weights exceed this go to external data in "auto" mode (protobuf's hard limit is 2 GiB).
EXTERNAL_DATA_BYTES = 1 << 30


@dataclass
class ExportOptions:
    """What to export. graphs: subset of GRAPHS (in any order); external_data: auto|always|never."""

    dtype: str = "fp32"
    graphs: tuple[str, ...] = GRAPHS
    opset: int = 18
    selector_form: str = "loop"
    external_data: str = "auto"
    progress: bool = True


@dataclass
class ExportResult:
    output: Path
    manifest: dict
    seconds: dict = field(default_factory=dict)  # graph name -> export seconds


def _read_config(model_dir: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(model_dir))


def _param_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _use_external(mode: str, nbytes: int) -> bool:
    return mode == "always" or (mode == "auto" and nbytes > EXTERNAL_DATA_BYTES)


def _example_inputs(name: str, dims: dict, dtype):
    """(args, input_names, output_names, dynamic_shapes) for graph `name`. Example sizes are >= 2 on every
    dynamic axis so torch.export does not specialise them to 0/1."""
    import torch
    from torch.export import Dim

    d, n = dims["hidden_size"], dims["num_visual_tokens"]
    batch, seq = Dim("batch"), Dim("seq")
    if name == "vision":
        s = dims["image_size"]
        return ((torch.randn(2, 3, s, s, dtype=dtype),), ["pixel_values"], ["image_features"], ({0: batch},))
    if name == "embed":
        ids = torch.randint(0, dims["vocab_size"], (2, 7))
        return (ids,), ["input_ids"], ["inputs_embeds"], ({0: batch, 1: seq},)
    if name == "probe":
        length, t = n + 12, 5
        args = (torch.randn(1, length, d, dtype=dtype), torch.arange(length)[None], torch.arange(3, 3 + n),
                torch.arange(length - t - 2, length - 2))
        shapes = ({1: seq}, {1: seq}, {0: Dim("num_visual")}, {0: Dim("num_instruction")})
        return args, ["inputs_embeds", "position_ids", "visual_positions", "instruction_positions"], \
            ["relevance"], shapes
    if name == "decoder":
        layers, hkv, hd = dims["num_layers"], dims["num_kv_heads"], dims["head_dim"]
        b, s, p = 2, 3, 4
        past = tuple(torch.randn(b, hkv, p, hd, dtype=dtype) for _ in range(2 * layers))
        args = (torch.randn(b, s, d, dtype=dtype), torch.ones(b, p + s, dtype=torch.long),
                torch.arange(p, p + s)[None].expand(b, s).contiguous(), past)
        past_dim = Dim("past_sequence", min=0)
        shapes = ({0: batch, 1: seq}, {0: batch, 1: Dim("total_sequence")}, {0: batch, 1: seq},
                  tuple({0: batch, 2: past_dim} for _ in past))
        kv = [f"{kind}.{i}.{kv}" for kind in ("past_key_values",) for i in range(layers) for kv in ("key", "value")]
        out = ["logits"] + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
        return args, ["inputs_embeds", "attention_mask", "position_ids", *kv], out, shapes
    raise ValueError(name)


def _export_selector(out_dir: Path, opts: ExportOptions, float_dtype: str) -> SavedGraph:
    from coverpruner.export.selector_graph import build_selector_model

    try:
        model = build_selector_model(float_dtype=float_dtype, opset=opts.opset, form=opts.selector_form)
    except ValueError as exc:
        raise ExportError(f"selector.onnx (--selector {opts.selector_form}): {exc}") from exc
    return save_proto(model, out_dir / "selector.onnx", external_data=opts.external_data == "always")


def _copy_support_files(family, model_dir: Path, out_dir: Path) -> tuple[list[str], list[str]]:
    copied = []
    for name in family.support_files:
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, out_dir / name)
            copied.append(name)
    if "tokenizer.json" not in copied:
        raise ExportError(f"{model_dir}: tokenizer.json is missing; the runtime needs a fast tokenizer file")
    tok = [f for f in copied if f.startswith(("tokenizer", "special_tokens"))]
    return tok, [f for f in copied if f not in tok]


def export_model(model_dir: Path, output: Path, source_model: str, opts: ExportOptions) -> ExportResult:
    """Export `opts.graphs` of the checkpoint in `model_dir` into `output` and write manifest.json.

    On a partial re-export (--graphs subset) the previous manifest's other graphs are kept when their
    precision and source model match; stale files of re-exported graphs are deleted first.
    """
    import torch

    import transformers

    model_dir, output = Path(model_dir), Path(output)
    unknown = [g for g in opts.graphs if g not in GRAPHS]
    if unknown or not opts.graphs:
        raise ExportError(f"--graphs: unknown graph(s) {unknown}; expected a subset of {list(GRAPHS)}")
    if opts.dtype not in DTYPES:
        raise ExportError(f"--dtype: expected one of {list(DTYPES)}, got {opts.dtype!r}")
    output.mkdir(parents=True, exist_ok=True)
    for g in opts.graphs:
        remove_graph_files(output / f"{g}.onnx")

    config = _read_config(model_dir)
    family = family_for_model_type(config.model_type)
    torch_dtype = getattr(torch, DTYPES[opts.dtype])
    order = [g for g in GRAPHS if g in opts.graphs]
    stages = ["load"] + order + ["manifest"]
    bar = tqdm(total=len(stages), desc="export", unit="stage", disable=not opts.progress)
    seconds: dict[str, float] = {}
    entries: dict[str, dict] = {}

    def stage(label: str):
        bar.set_description(f"export: {label}")

    stage("load model")
    t0 = time.perf_counter()
    model = family.load_model(model_dir, DTYPES[opts.dtype]) if set(order) - {"selector"} else None
    seconds["load"] = time.perf_counter() - t0
    bar.update()
    dims = family.dims(config)
    for g in order:
        stage(g)
        t0 = time.perf_counter()
        if g == "selector":
            saved = _export_selector(output, opts, DTYPES[opts.dtype])
        else:
            module = _graph_module(g, family, model)
            args, names_in, names_out, shapes = _example_inputs(g, dims, torch_dtype)
            saved = export_graph(module, args, output / f"{g}.onnx", names_in, names_out, shapes, opts.opset,
                                 _use_external(opts.external_data, _param_bytes(module)))
            del module
            gc.collect()
        seconds[g] = time.perf_counter() - t0
        entries[g] = graph_entry(saved)
        bar.update()
    del model
    gc.collect()

    stage("manifest")
    tok_files, proc_files = _copy_support_files(family, model_dir, output)
    previous = read_manifest(output)
    if previous and previous.get("precision") == opts.dtype and previous.get("source_model") == source_model:
        for g, e in previous.get("graphs", {}).items():
            if g not in entries and (output / e["file"]).is_file():
                entries[g] = e
    graphs = {g: entries[g] for g in GRAPHS if g in entries}
    import onnx
    import onnxruntime

    manifest = build_manifest(
        family=family, config=config, model_dir=model_dir, source_model=source_model, precision=opts.dtype,
        graphs=graphs, tokenizer_files=tok_files, processor_files=proc_files,
        selector_form=opts.selector_form if "selector" in graphs else None,
        versions={"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__,
                  "onnxruntime": onnxruntime.__version__, "opset": opts.opset},
    )
    write_manifest(output, manifest)
    bar.update()
    bar.close()
    return ExportResult(output, manifest, seconds)


def _graph_module(name: str, family, model):
    from coverpruner.export.modules import DecoderGraph, EmbedGraph, ProbeGraph, VisionGraph

    if name == "vision":
        return VisionGraph(family, model).eval()
    if name == "embed":
        return EmbedGraph(family.embed_tokens(model)).eval()
    if name == "probe":
        return ProbeGraph(family.probe_parts(model)).eval()
    return DecoderGraph(family.language_model(model), family.lm_head(model)).eval()
