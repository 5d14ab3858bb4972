"""Export a checkpoint into an engine dir: one graph at a time, then support files and manifest.json.

RAM: the model is loaded once, straight into the target dtype (for an fp16 checkpoint exported in fp16 the
parameters stay memory-mapped views of the safetensors file), and each graph's initializers reference the
live parameters while it is written. Parts are deliberately NOT dropped between graphs: measured on the
shape-real 7B preset, setting the exported vision tower / token table to None made the next torch.export
materialise ~3 GiB of copies (peak 5.3 GiB vs 2.4 GiB, benchmarks/bench_export.py), while the mmapped
pages they hold are file-backed and reclaimable anyway.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path


from coverpruner.engine_dir import GRAPH_NAMES as GRAPHS
from coverpruner.engine_dir import (MANIFEST, METHOD_GRAPHS, attention_record, decoder_state_record, extras_record,
                                    read_if_present, write_manifest)
from coverpruner.export.checkpoint_checks import check_dims, resolve_decoder_form
from coverpruner.export.manifest import build_manifest, family_file_entries, graph_entry
from coverpruner.export.graph_specs import check_probe, graph_specs
from coverpruner.export.onnx_io import (EXTERNAL_DATA_BYTES, ExportError, SavedGraph, data_file_name, export_graph,
                                     save_proto)
from coverpruner.families import family_for_model_type
from coverpruner.progress import stage_bar, ticking
from coverpruner.staged_dir import StagedDir

FLOAT_DTYPES = {"fp32": "float32", "fp16": "float16"}  # --dtype -> torch / numpy float dtype name
#: the peers' selector graphs {graph: method} (export/peer_graphs.py); like selector.onnx they need no weights
PEER_GRAPHS = {g: m for m, g in METHOD_GRAPHS.items() if g != "selector"}
#: graphs written without loading the model
WEIGHTLESS_GRAPHS = frozenset(METHOD_GRAPHS.values())
#: --decoder-form: "ort" (ONNX Runtime contrib ops, in-place KV: the fast CPU form in fp32, and in fp16 the form
#: ORT's CUDA provider batches with: its GroupQueryAttention kernel is fp16/bf16 only), "standard" (standard ops:
#: TensorRT), "auto" = "ort" for fp32 and "standard" for fp16 (what TensorRT builds; ask for --decoder-form ort
#: with --dtype fp16 for continuous batching on a GPU). The ORT form's int4 comes from --quantize int4.
DECODER_FORMS = ("auto", "ort", "standard")


@dataclass
class ExportOptions:
    """What to export. graphs: subset of GRAPHS (in any order); external_data: auto|always|never."""

    dtype: str = "fp32"
    graphs: tuple[str, ...] = GRAPHS
    opset: int = 18
    selector_form: str = "loop"
    external_data: str = "auto"
    #: DECODER_FORMS; "auto" resolved for the checkpoint by export_model (checkpoint_checks.resolve_decoder_form)
    decoder_form: str = "auto"
    progress: bool = True
    #: defaults of the family's request options to record in the manifest (e.g. {"newline_policy": "keep"});
    #: options not given keep the family's own defaults
    family_options: dict = field(default_factory=dict)
    #: what probe.onnx scores (export/graph_specs.PROBE_KINDS): "exact" or the family's "proxy"
    probe: str = "exact"


@dataclass
class ExportResult:
    output: Path
    manifest: dict
    seconds: dict = field(default_factory=dict)  # graph name -> export seconds
    notes: list = field(default_factory=list)  # one line each: a choice made for this checkpoint (decoder form)


def _read_config(model_dir: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(model_dir))


def _param_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _use_external(mode: str, nbytes: int) -> bool:
    return mode == "always" or (mode == "auto" and nbytes > EXTERNAL_DATA_BYTES)


class OptionValueError(ExportError):
    """A --option names an option the family does not have, or a value it does not allow."""


class TargetError(ExportError):
    """--output cannot take this export (a partial re-export of another checkpoint's dir, a folder that is not
    an engine dir); nothing was written."""


def family_option_defaults(family, given: dict) -> dict:
    """Validated {option: value} for the manifest's `options`; OptionValueError (one line) otherwise."""
    known = {o.name: o for o in family.request_options}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise OptionValueError(f"--option: model family {family.name!r} has no option(s) {unknown}; it takes "
                               f"{sorted(known) or 'none'}")
    try:
        return {name: known[name].validate(value) for name, value in given.items()}
    except ValueError as exc:
        raise OptionValueError(f"--option: {str(exc).splitlines()[0]}") from None


def _export_selector(out_dir: Path, opts: ExportOptions, float_dtype: str) -> SavedGraph:
    from coverpruner.export.selector import build_selector_model

    try:
        model = build_selector_model(float_dtype=float_dtype, opset=opts.opset, form=opts.selector_form)
    except ValueError as exc:
        raise ExportError(f"selector.onnx (--selector {opts.selector_form}): {exc}") from exc
    return save_proto(model, out_dir / "selector.onnx", external_data=opts.external_data == "always")


def _export_peer_selector(out_dir: Path, graph: str, opts: ExportOptions, float_dtype: str) -> SavedGraph:
    """<graph>.onnx: the standard-op selector graph of the peer method PEER_GRAPHS[graph] (loop form only)."""
    from coverpruner.export.peer_graphs import build_peer_selector_model

    try:
        model = build_peer_selector_model(PEER_GRAPHS[graph], float_dtype=float_dtype, opset=opts.opset)
    except ValueError as exc:
        raise ExportError(f"{graph}.onnx: {exc}") from exc
    return save_proto(model, out_dir / f"{graph}.onnx", external_data=opts.external_data == "always")


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


def decoder_form_for(opts: ExportOptions) -> str:
    """The decoder form `opts` asks for ("auto", "ort" or "standard"; export_model resolves "auto" for the
    checkpoint: checkpoint_checks.resolve_decoder_form); ExportError (one line) for an unknown one."""
    if opts.decoder_form not in DECODER_FORMS:
        raise OptionValueError(f"--decoder-form: expected one of {list(DECODER_FORMS)}, got {opts.decoder_form!r}")
    return opts.decoder_form


def _export_ort_decoder(family, model, config, output: Path, dtype: str) -> tuple[SavedGraph, dict]:
    """decoder.onnx in ORT form from the family's decoder weights and extras -> (files, the entry's form and
    rotary)."""
    from coverpruner.export.ortform.decoder_graph import build_ort_decoder

    try:
        weights = family.decoder_weights(model)
        spec = family.decoder_spec(config)
        path = build_ort_decoder(weights, output / "decoder.onnx", dtype, extras=spec.extras,
                                 attention=spec.attention)
    except ValueError as exc:
        raise ExportError(f"--decoder-form ort: {exc}") from None
    data = path.with_name(data_file_name(path))
    return SavedGraph(path, [data.name] if data.is_file() else []), {"form": "ort", "rotary": weights.rotary}


def _check_options(opts: ExportOptions) -> None:
    decoder_form_for(opts)
    unknown = [g for g in opts.graphs if g not in GRAPHS]
    if unknown or not opts.graphs:
        raise ExportError(f"--graphs: unknown graph(s) {unknown}; expected a subset of {list(GRAPHS)}")
    if opts.dtype not in FLOAT_DTYPES:
        raise ExportError(f"--dtype: expected one of {list(FLOAT_DTYPES)}, got {opts.dtype!r}")


def _export_graphs(family, model, config, output: Path, order: list[str], opts: ExportOptions, bar,
                   seconds: dict) -> dict[str, dict]:
    """Write each graph of `order` (vision, embed, probe, the selector graphs, decoder) into `output`; {graph:
    manifest entry}.

    Each spec is dropped after its graph is written (the parameters it references stay with the model)."""
    import torch

    torch_dtype = getattr(torch, FLOAT_DTYPES[opts.dtype])
    # every graph's module, example inputs, names and dynamic axes (the family's parts and its vision spec)
    specs = graph_specs(family, model, config, torch_dtype, opts.probe) if model is not None else {}
    entries = {}
    for g in order:
        bar.set_description(f"export: {g}")
        t0 = time.perf_counter()
        extra = {}
        with ticking(bar):  # one long call per graph (the decoder's and the vision tower's take minutes)
            if g == "selector":
                saved = _export_selector(output, opts, FLOAT_DTYPES[opts.dtype])
            elif g in PEER_GRAPHS:
                saved = _export_peer_selector(output, g, opts, FLOAT_DTYPES[opts.dtype])
            elif g == "decoder" and decoder_form_for(opts) == "ort":
                saved, extra = _export_ort_decoder(family, model, config, output, opts.dtype)
            else:
                spec = specs.pop(g)
                saved = export_graph(spec.module, spec.args, output / f"{g}.onnx", spec.input_names,
                                     spec.output_names, spec.dynamic_shapes, opts.opset,
                                     _use_external(opts.external_data, _param_bytes(spec.module)))
                if g == "probe":  # contract v5: the decoder layer the probe reads and what it scores
                    extra.update(layer=spec.module.layer, kind=spec.module.kind)
                del spec
                gc.collect()
        if g == "decoder":
            declared = family.decoder_spec(config)
            if declared.extras:  # contract v4: the runtime feeds the extras from this record, without family code
                extra["extras"] = extras_record(declared.extras)
            if not declared.attention.plain:  # v5: windows / blocks, read by the engines
                extra["attention"] = attention_record(declared.attention)
            # contract v5: the KV layers and the states that are not KV, which engines and runtime carry
            extra.update(decoder_state_record(declared, family.dims(config)["num_layers"], FLOAT_DTYPES[opts.dtype]))
        seconds[g] = time.perf_counter() - t0
        entries[g] = {**graph_entry(saved), **extra}
        bar.update()
    return entries


def _same_model(previous: dict | None, opts: ExportOptions, source_model: str) -> bool:
    return bool(previous) and previous.get("precision") == opts.dtype and previous.get("source_model") == source_model


def check_target(output: Path, opts: ExportOptions, source_model: str) -> None:
    """TargetError (one line) when `output` cannot take this export, before anything loads or is written:
    a folder with files but no manifest.json (the swap would delete them), or a partial re-export (--graphs
    subset) of a dir whose manifest is unreadable or came from another checkpoint or precision (its other
    graphs would be dropped and the dir would no longer load)."""
    output = Path(output)
    if not output.is_dir():
        return
    if not (output / MANIFEST).is_file():
        if any(output.iterdir()):
            raise TargetError(f"--output {output}: the folder has files but no {MANIFEST}; export into a new or "
                              "empty folder, or an engine dir")
        return
    if set(opts.graphs) == set(GRAPHS):
        return
    previous = read_if_present(output)
    if not _same_model(previous, opts, source_model):
        was = (f"was exported from {previous.get('source_model')!r} in {previous.get('precision')}"
               if previous else "has an unreadable manifest.json")
        raise TargetError(f"--graphs {','.join(opts.graphs)}: {output} {was}, not {source_model!r} in {opts.dtype}; "
                          "its other graphs cannot be kept: re-export all graphs (omit --graphs) or choose another "
                          "--output")


def _graph_files(entry: dict) -> list[str]:
    return [entry["file"], *entry.get("data_files", [])]


def _referenced(manifest: dict | None) -> set[str]:
    """Every file a manifest names: graphs and their data, family files, tokenizer/processor files, TensorRT
    engines and plugin."""
    if not manifest:
        return set()
    names = {f for e in manifest.get("graphs", {}).values() for f in _graph_files(e)}
    names |= {e["file"] for e in manifest.get("files", {}).values() if isinstance(e, dict) and "file" in e}
    for key in ("tokenizer_files", "processor_files"):
        names |= {f for f in manifest.get(key, []) if isinstance(f, str)}
    trt = manifest.get("tensorrt") or {}
    names |= {e["file"] for e in (trt.get("engines") or {}).values() if isinstance(e, dict) and "file" in e}
    if isinstance(trt.get("plugin"), dict):
        names.add(trt["plugin"].get("file"))
    return names


def _kept_from_previous(output: Path, previous: dict | None, opts: ExportOptions, source_model: str,
                        entries: dict) -> tuple[dict, dict]:
    """(graph entries, family files) of the previous manifest still valid for a partial re-export: same
    precision and source model, graph files present, graph not re-exported now."""
    if not _same_model(previous, opts, source_model):
        return {}, {}
    kept = {g: e for g, e in previous.get("graphs", {}).items()
            if g not in entries and all((output / f).is_file() for f in _graph_files(e))}
    return kept, previous.get("files", {})


def _versions(opset: int) -> dict:
    import onnx
    import onnxruntime
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "opset": opset}


def export_model(model_dir: Path, output: Path, source_model: str, opts: ExportOptions) -> ExportResult:
    """Export `opts.graphs` of the checkpoint in `model_dir` into `output` and write manifest.json.

    Steps: check the options and the target -> read the config and find the family -> load the model once ->
    export each graph -> family files, support files -> manifest. Everything is written into a staging dir
    beside `output` that replaces it only once complete (coverpruner.staged_dir): a failed or killed export
    leaves the previous dir as it was. On a partial re-export (--graphs subset) the previous manifest's other
    graphs are kept (hard links) when their precision and source model match, and refused otherwise
    (check_target); files the previous manifest does not name (e.g. notes) are carried over, the files of
    the graphs re-exported and its TensorRT engines (built from the old graphs) are not.
    """
    model_dir, output = Path(model_dir), Path(output)
    _check_options(opts)
    config = _read_config(model_dir)
    family = family_for_model_type(config.model_type)
    option_defaults = family_option_defaults(family, opts.family_options)  # checked before anything is written
    # the config facts the graphs and the runtime assume (CheckpointError before anything is written), and the
    # decoder form that can run this checkpoint (export/checkpoint_checks.py)
    dims, text_config = family.dims(config), getattr(config, "text_config", None) or config
    check_dims(dims, text_config)
    form, note = resolve_decoder_form(decoder_form_for(opts), opts.dtype, dims, text_config)
    opts = dataclasses.replace(opts, decoder_form=form)
    try:
        check_probe(family, opts.probe)
    except ValueError as exc:
        raise OptionValueError(str(exc)) from None
    check_target(output, opts, source_model)
    previous = read_if_present(output)
    with StagedDir(output) as stage:
        manifest, seconds = _export_into(stage, family, config, model_dir, previous, source_model, opts)
        manifest["options"] = {**manifest.get("options", {}), **option_defaults}
        write_manifest(stage.path, manifest)
    return ExportResult(output, manifest, seconds, [note] if note and "decoder" in opts.graphs else [])


@contextlib.contextmanager
def _hf_progress_bars(enabled: bool):
    """transformers' "Loading weights" bar on or off for the body (off: it would redraw into a log), restored
    after."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if was and not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was and not enabled:
            hf_logging.enable_progress_bar()


def _export_into(stage: StagedDir, family, config, model_dir: Path, previous: dict | None, source_model: str,
                 opts: ExportOptions) -> tuple[dict, dict]:
    """Write the graphs, family and support files into ``stage.path`` and carry over what is kept from the
    previous dir -> (manifest dict without option defaults, seconds per step)."""
    output = stage.path
    order = [g for g in GRAPHS if g in opts.graphs]
    bar = stage_bar(len(order) + 2, "export", enabled=opts.progress)  # a line per stage in a log
    seconds: dict[str, float] = {}

    bar.set_description("export: load model")
    t0 = time.perf_counter()
    with ticking(bar), _hf_progress_bars(not bar.disable):  # transformers' own bar only where ours is a bar
        model = family.load_model(model_dir, FLOAT_DTYPES[opts.dtype]) if set(order) - WEIGHTLESS_GRAPHS else None
    seconds["load"] = time.perf_counter() - t0
    bar.update()
    entries = _export_graphs(family, model, config, output, order, opts, bar, seconds)

    bar.set_description("export: manifest")
    kept, files = _kept_from_previous(stage.target, previous, opts, source_model, entries)
    if model is not None:  # family arrays (e.g. an image_newline vector) come from the weights
        files = family_file_entries(output, family.write_files(model, output))
    del model
    gc.collect()
    tok_files, proc_files = _copy_support_files(family, model_dir, output)
    for name in sorted(({f for e in kept.values() for f in _graph_files(e)} | {e["file"] for e in files.values()})
                       - {p.name for p in output.iterdir()}):
        stage.carry(name)  # kept graphs (and, for a selector-only re-export, the family files)
    # never a graph's stale file, even where the previous manifest was unreadable
    graph_names = {n for g in GRAPHS for n in (f"{g}.onnx", data_file_name(Path(f"{g}.onnx")))}
    stage.carry_rest(skip=_referenced(previous) | graph_names | {MANIFEST, MANIFEST + ".tmp"})
    graphs = {g: {**kept, **entries}[g] for g in GRAPHS if g in entries or g in kept}
    selector_form = opts.selector_form if "selector" in entries else (previous or {}).get("selector_form")
    manifest = build_manifest(
        family=family, config=config, model_dir=model_dir, source_model=source_model, precision=opts.dtype,
        graphs=graphs, files=files, tokenizer_files=tok_files, processor_files=proc_files,
        selector_form=selector_form if "selector" in graphs else None, versions=_versions(opts.opset),
    )
    bar.update()
    bar.close()
    return manifest, seconds
