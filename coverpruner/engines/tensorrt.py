"""TensorRT engines for an exported directory: one serialized engine per graph, with optimization profiles
derived from the manifest's graph input specs.

Works with TensorRT (>= 10, `import tensorrt`) or TensorRT-RTX (`import tensorrt_rtx`, which also builds on a
machine without a GPU). The manifest gains a "tensorrt" section:

    "tensorrt": {"flavour": "tensorrt", "version": "10.3.0", "compute_capability": "8.7",
                 "precision": "fp16", "budgets": [64, 128], "max_context": 4096, "max_batch": 1,
                 "plugin": {"file": "libcoverpruner_trt_plugin.so", "sha256": "..."} | null,
                 "engines": {"vision": {"file": "vision.engine", "sha256": "...",
                                        "profile": {"pixel_values": {"min": [...], "opt": [...], "max": [...]}},
                                        "shape_inputs": {"budget": {"min": [64], "opt": [64], "max": [128]}}}}}

Symbolic axes of the manifest map to ranges (`axis_ranges`): batch 1..max_batch; seq 1..max_context;
num_visual / n up to visual.max_visual_tokens; num_instruction 1..max_context; past_sequence 0..max_context-1;
total_sequence 1..max_context; d = hidden_size; then the family's own axes from the manifest's `axes`
(e.g. a vision tile axis); `shapes` overrides any of them (and names new ones).
The runtime (trt_session.py) refuses an engine built by another TensorRT version or for another GPU.
"""

from __future__ import annotations

import hashlib
import importlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coverpruner.engine_dir import PLUGIN_NAMESPACE, PLUGIN_OP, PLUGIN_VERSION, read_raw, write_manifest
from coverpruner.errors import ManifestError
from coverpruner.filehash import sha256_file
from coverpruner.staged_dir import StagedDir
from coverpruner.engines.cudart import compute_capability, device_problem
from coverpruner.engines.native_build import preload_cublas

PRECISIONS = ("fp32", "fp16", "bf16", "int8")
FLAVOURS = ("tensorrt", "tensorrt_rtx")
ENGINE_SUFFIX = ".engine"


class TensorRTBuildError(RuntimeError):
    """An engine could not be built; the message names the graph, input or option at fault."""


class EngineMismatchError(RuntimeError):
    """A serialized engine does not fit this machine (TensorRT version, flavour or GPU)."""


@dataclass
class TrtModule:
    """The imported TensorRT python module and what it is."""

    module: Any
    flavour: str  # "tensorrt" | "tensorrt_rtx"
    version: str


def load_tensorrt(flavour: str | None = None) -> TrtModule:
    """Import TensorRT ("tensorrt") or TensorRT-RTX ("tensorrt_rtx"); None tries TensorRT first.

    The `tensorrt` pip package installs without a GPU but may be a placeholder without bindings; that counts
    as absent.
    """
    if flavour is not None and flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")
    errors = []
    for name in ([flavour] if flavour else list(FLAVOURS)):
        try:
            mod = importlib.import_module(name)
        except Exception as exc:  # ImportError, or a broken install raising at import
            errors.append(f"{name}: {exc}")
            continue
        if not hasattr(mod, "Builder"):
            errors.append(f"{name}: installed without python bindings (placeholder package)")
            continue
        return TrtModule(mod, name, str(getattr(mod, "__version__", "unknown")))
    raise TensorRTBuildError(
        "no usable TensorRT python module (" + "; ".join(errors) + "). Install TensorRT >= 10 (JetPack ships "
        "it; x86: `pip install tensorrt`) or TensorRT-RTX (`pip install tensorrt-rtx-cu13 "
        "tensorrt-rtx-cu13-libs tensorrt-rtx-cu13-bindings`)")


def detect_compute_capability() -> str | None:
    """"major.minor" of CUDA device 0 via the CUDA runtime (ctypes, no torch); None without a usable GPU."""
    return compute_capability()


def require_device(trt: TrtModule, what: str) -> None:
    """TensorRT (not TensorRT-RTX, which builds without a GPU) creates no Builder or Runtime without a usable CUDA
    device: its python factory then fails with "TypeError: ... factory function returned nullptr". Checked first,
    so the user reads one line saying why instead."""
    if trt.flavour != "tensorrt":
        return
    problem = device_problem()
    if problem is not None:
        raise TensorRTBuildError(f"TensorRT {trt.version} needs a usable CUDA GPU to {what}: {problem}")


def make(trt: TrtModule, factory: str, logger, what: str):
    """trt.module.<factory>(logger) (Builder or Runtime) after require_device; a nullptr the device check did not
    foresee (e.g. out of GPU memory) is the same one line, not pybind11's TypeError."""
    require_device(trt, what)
    try:
        obj = getattr(trt.module, factory)(logger)
    except TypeError as exc:  # pybind11: "factory function returned nullptr"
        obj, why = None, str(exc)
    else:
        why = "it returned None"
    if obj is None:
        raise TensorRTBuildError(f"{trt.flavour} {trt.version} could not create its {factory} to {what} ({why}): "
                                 "CUDA is not usable here (see the TensorRT log above; `coverpruner-doctor` "
                                 "reports the driver and device)")
    return obj


@dataclass
class BuildOptions:
    """What `coverpruner-build --backend tensorrt` asks for.

    precision: fp32 | fp16 | bf16 | int8 (None: the manifest's precision). budgets: the selector budgets the
    loop-form engine must accept (its `budget` input is a shape tensor; min/first/max become the profile).
    max_context: longest sequence (prompt + visual + generated) the probe/decoder engines accept (None:
    dims.max_position_embeddings). max_batch: largest batch for vision/embed/decoder. plugin: path of
    libcoverpruner_trt_plugin.so (needed for a plugin-form selector). shapes: {axis: (min, opt, max)}
    overrides. graphs: subset of graphs to build (None: every graph in the manifest). workspace_mib: builder
    workspace limit (None: TensorRT's default).
    """

    precision: str | None = None
    budgets: tuple[int, ...] = (64,)
    max_context: int | None = None
    max_batch: int = 1
    plugin: Path | None = None
    shapes: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    graphs: tuple[str, ...] | None = None
    workspace_mib: int | None = None

    def validate(self) -> None:
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not self.budgets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.budgets):
            raise ValueError(f"budgets must be a non-empty list of ints >= 1, got {self.budgets!r}")
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {self.max_context}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        for axis, rng in self.shapes.items():
            if len(rng) != 3 or not (0 <= rng[0] <= rng[1] <= rng[2]):
                raise ValueError(f"shape range for {axis!r} must be min <= opt <= max (>= 0), got {rng}")


def axis_ranges(manifest: dict, options: BuildOptions) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) for every symbolic axis name the exporter uses (see module docstring): the generic
    axes, then the family's (manifest `axes`), then `options.shapes`."""
    dims = manifest["dims"]
    n = int(manifest["visual"]["max_visual_tokens"])
    hidden = int(dims["hidden_size"])
    ctx = int(options.max_context or dims["max_position_embeddings"])
    # opt: a pruned prefill (budget visual tokens + a short prompt) and a prompt with all n visual tokens
    opt_budget = min(options.budgets[0], n)
    prefill = min(ctx - 1, opt_budget + 64)  # a past length: at most ctx - 1, or the profile is invalid (opt > max)
    ranges = {
        "batch": (1, 1, options.max_batch),
        "seq": (1, min(ctx, n + 64), ctx),
        "num_visual": (1, n, n),
        "n": (1, n, n),
        "d": (hidden, hidden, hidden),
        "num_instruction": (1, min(32, ctx), ctx),
        "past_sequence": (0, prefill, ctx - 1),
        "total_sequence": (1, min(ctx, prefill + 1), ctx),
    }
    ranges.update({k: tuple(int(x) for x in v) for k, v in manifest.get("axes", {}).items()})
    ranges.update({k: tuple(int(x) for x in v) for k, v in options.shapes.items()})
    return ranges


def input_profile(graph: str, spec: dict, ranges: dict[str, tuple[int, int, int]]) -> dict[str, list[int]]:
    """min/opt/max shape of one manifest input spec ({"name", "dtype", "shape"})."""
    out: dict[str, list[int]] = {"min": [], "opt": [], "max": []}
    for axis in spec["shape"]:
        if isinstance(axis, int):
            lo = op = hi = axis
        elif axis in ranges:
            lo, op, hi = ranges[axis]
        else:
            raise TensorRTBuildError(
                f"graph {graph!r}, input {spec['name']!r}: no range for symbolic axis {axis!r}; pass "
                f"--shape {axis}=MIN:OPT:MAX")
        out["min"].append(lo)
        out["opt"].append(op)
        out["max"].append(hi)
    return out


def budget_profile(options: BuildOptions) -> dict[str, list[int]]:
    """Values the selector's `budget` shape tensor may take: min, first (opt) and max of the budgets."""
    return {"min": [min(options.budgets)], "opt": [options.budgets[0]], "max": [max(options.budgets)]}


def _logger(trt: TrtModule, verbose: bool):
    mod = trt.module
    return mod.Logger(mod.Logger.VERBOSE if verbose else mod.Logger.WARNING)


#: plugin creator (flavour, name, version, namespace) -> (path, sha256) of the library this process registered
_LOADED_PLUGINS: dict[tuple[str, str, str, str], tuple[str, str]] = {}


def load_plugin_library(trt: TrtModule, path: Path, logger=None) -> None:
    """Registers libcoverpruner_trt_plugin.so's CoverageSelector creator with TensorRT's plugin registry, once per
    process: TensorRT's loadLibrary fails (returns nullptr) when one of a library's creators is already registered
    (NvInferRuntimeCommon.h, 10.0 to 11.1), and a build loads the build dir's copy while the sessions then open the
    engine dir's. So the registry is asked first: a creator already there (loaded by this function, by ONNX
    Runtime's TensorRT provider, or by the user) is used as it is. One file per creator: a second, different
    library for the same creator is refused (the registry would keep running the first)."""
    path = Path(path)
    if not path.is_file():
        raise TensorRTBuildError(f"plugin library {path} does not exist")
    key = (trt.flavour, PLUGIN_OP, PLUGIN_VERSION, PLUGIN_NAMESPACE)
    digest = sha256_file(path)
    if key in _LOADED_PLUGINS:
        first, first_digest = _LOADED_PLUGINS[key]
        if first_digest != digest:
            raise TensorRTBuildError(f"plugin {PLUGIN_OP} version {PLUGIN_VERSION} is already registered in this "
                                     f"process from {first}; {path} is a different library (sha256 differs) and "
                                     "TensorRT keeps one creator per name: run it in a new process")
        return
    registry = trt.module.get_plugin_registry()
    if registry.get_creator(PLUGIN_OP, PLUGIN_VERSION, PLUGIN_NAMESPACE) is None:
        if logger is not None:
            make(trt, "Builder", logger, "load the plugin")  # a live logger first: the registry logs load errors
        preload_cublas()
        if registry.load_library(str(path.resolve())) is None:
            raise TensorRTBuildError(f"{trt.flavour} {trt.version} could not load the plugin library {path} (see the "
                                     "TensorRT log above: it must export getCreators and setLoggerFinder, and "
                                     "libcublas must resolve)")
        if registry.get_creator(PLUGIN_OP, PLUGIN_VERSION, PLUGIN_NAMESPACE) is None:
            raise TensorRTBuildError(f"{path} loaded but registered no {PLUGIN_OP} version {PLUGIN_VERSION} creator "
                                     f"(namespace {PLUGIN_NAMESPACE!r}): not a CoverPruner plugin of this version")
    _LOADED_PLUGINS[key] = (str(path), digest)


def _has_qdq(onnx_path: Path) -> bool:
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def strongly_typed(trt: TrtModule) -> bool:
    """True where the network's own dtypes are the precision: TensorRT-RTX, and TensorRT >= 11, whose BuilderFlag
    has no FP16 / BF16 / INT8 (NetworkDefinitionCreationFlag.STRONGLY_TYPED is deprecated there and always on).
    TensorRT 10 builds weakly typed networks and takes the flags."""
    return trt.flavour == "tensorrt_rtx" or not hasattr(trt.module.BuilderFlag, "FP16")


def _configure_precision(trt: TrtModule, config, graph: str, onnx_path: Path, precision: str,
                         graph_precision: str) -> None:
    mod = trt.module
    if precision == "int8" and not _has_qdq(onnx_path):
        raise TensorRTBuildError(
            f"graph {graph!r}: --precision int8 needs a Q/DQ-quantized graph (QuantizeLinear/DequantizeLinear "
            "nodes); implicit INT8 calibration is not supported")
    if strongly_typed(trt):
        if precision in ("fp16", "bf16") and graph_precision != precision:
            raise TensorRTBuildError(
                f"graph {graph!r}: {trt.flavour} {trt.version} builds strongly typed networks (the graph's own "
                f"dtypes are the precision), so --precision {precision} needs a graph exported as {precision} (this "
                f"directory is {graph_precision}); re-export with --dtype {precision}")
        return
    flag = {"fp16": "FP16", "bf16": "BF16", "int8": "INT8"}.get(precision)
    if flag is not None:
        config.set_flag(getattr(mod.BuilderFlag, flag))


def build_engine(trt: TrtModule, onnx_path: Path, graph: str, graph_spec: dict, ranges: dict,
                 options: BuildOptions, precision: str, graph_precision: str,
                 verbose: bool = False) -> tuple[bytes, dict]:
    """Parses one ONNX graph and builds its engine. Returns (serialized engine, profile record)."""
    mod = trt.module
    logger = _logger(trt, verbose)
    builder = make(trt, "Builder", logger, f"build the {graph!r} engine")
    network = builder.create_network(0)
    parser = mod.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise TensorRTBuildError(f"graph {graph!r}: TensorRT's ONNX parser rejected {onnx_path.name}: {errors}")

    specs = {s["name"]: s for s in graph_spec["inputs"]}
    net_inputs = [network.get_input(i) for i in range(network.num_inputs)]
    if sorted(t.name for t in net_inputs) != sorted(specs):
        raise TensorRTBuildError(f"graph {graph!r}: {onnx_path.name} has inputs {sorted(t.name for t in net_inputs)}"
                                 f" but manifest.json lists {sorted(specs)}")
    config = builder.create_builder_config()
    if options.workspace_mib is not None:
        config.set_memory_pool_limit(mod.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    _configure_precision(trt, config, graph, onnx_path, precision, graph_precision)

    profile = builder.create_optimization_profile()
    record: dict[str, dict] = {"profile": {}, "shape_inputs": {}}
    for tensor in net_inputs:
        spec = specs[tensor.name]
        if tensor.is_shape_tensor:
            if tensor.name != "budget":
                raise TensorRTBuildError(f"graph {graph!r}: unexpected shape-tensor input {tensor.name!r}")
            values = budget_profile(options)
            profile.set_shape_input(tensor.name, values["min"], values["opt"], values["max"])
            record["shape_inputs"][tensor.name] = values
            continue
        if len(tensor.shape) != len(spec["shape"]):
            raise TensorRTBuildError(f"graph {graph!r}, input {tensor.name!r}: rank {len(tensor.shape)} in the "
                                     f"ONNX file, {len(spec['shape'])} in manifest.json")
        if all(d >= 0 for d in tensor.shape):
            continue  # static: nothing to profile
        shapes = input_profile(graph, spec, ranges)
        profile.set_shape(tensor.name, shapes["min"], shapes["opt"], shapes["max"])
        record["profile"][tensor.name] = shapes
    config.add_optimization_profile(profile)

    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TensorRTBuildError(f"graph {graph!r}: TensorRT could not build an engine (see the TensorRT log "
                                 "above for the layer at fault)")
    return bytes(serialized), record


def _read_manifest(engine_dir: Path) -> dict:
    try:
        manifest = read_raw(engine_dir)
    except ManifestError as exc:
        raise TensorRTBuildError(str(exc)) from None
    for key in ("dims", "visual", "graphs", "precision"):
        if key not in manifest:
            raise TensorRTBuildError(f"{engine_dir / 'manifest.json'}: field {key!r} is missing")
    return manifest


def build_engine_dir(engine_dir: str | Path, options: BuildOptions, trt: TrtModule | None = None,
                     verbose: bool = False, progress=None) -> dict:
    """Builds DIR/<graph>.engine for every graph and records the "tensorrt" section in DIR/manifest.json.

    progress: optional callable(graph_name) called before each build. Returns the section written. The new
    engines and manifest replace DIR all at once (a staging dir swapped in); engines of the previous section
    that are not rebuilt are dropped with it.
    """
    options.validate()
    engine_dir = Path(engine_dir)
    manifest = _read_manifest(engine_dir)
    trt = trt or load_tensorrt()
    graph_precision = manifest["precision"]
    precision = options.precision or graph_precision
    graphs = options.graphs or tuple(manifest["graphs"])
    unknown = [g for g in graphs if g not in manifest["graphs"]]
    if unknown:
        raise TensorRTBuildError(f"graphs {unknown} are not in {engine_dir / 'manifest.json'} "
                                 f"(it has {sorted(manifest['graphs'])})")
    if "decoder" in graphs and manifest["graphs"]["decoder"].get("form", "standard") != "standard":
        raise TensorRTBuildError(f"{engine_dir / 'manifest.json'}: graphs.decoder.form is "
                                 f"{manifest['graphs']['decoder']['form']!r} (ONNX Runtime contrib ops, which TensorRT "
                                 "cannot parse); re-export with --decoder-form standard for TensorRT")
    quant = manifest.get("quantization") or {}
    if quant.get("format") == "ort" and set(quant.get("graphs", {})) & set(graphs):
        raise TensorRTBuildError(f"{engine_dir / 'manifest.json'}: graphs {sorted(quant['graphs'])} are quantized "
                                 "in the ONNX Runtime form (com.microsoft MatMulNBits), which TensorRT cannot parse; "
                                 "quantize with --quant-format qdq for TensorRT")
    plugin_form = manifest.get("selector_form") == "plugin" and "selector" in graphs
    if plugin_form and options.plugin is None:
        raise TensorRTBuildError("selector.onnx is the plugin form (manifest selector_form = 'plugin'): pass "
                                 "--plugin PATH to libcoverpruner_trt_plugin.so")
    if plugin_form and trt.flavour == "tensorrt_rtx" and detect_compute_capability() is None:
        # Observed with TensorRT-RTX 1.7: its ONNX parser creates the plugin, then aborts the whole process
        # (std::terminate) when no GPU is present. Refuse instead of crashing.
        raise TensorRTBuildError("the plugin-form selector cannot be built with TensorRT-RTX on a machine "
                                 "without a GPU (its parser aborts the process); build it on the target GPU, "
                                 "or export --selector loop")
    require_device(trt, "build engines")  # after the manifest's own refusals, before any Builder or staging
    # engines, plugin and manifest go into a staging dir beside DIR, the graphs and other files are hard-linked
    # in, and the stage replaces DIR only when complete (coverpruner.staged_dir): a failed or killed build
    # leaves DIR and its previous engines as they were
    old = manifest.get("tensorrt") or {}
    old_files = {e.get("file") for e in (old.get("engines") or {}).values() if isinstance(e, dict)}
    old_files |= {old["plugin"].get("file")} if isinstance(old.get("plugin"), dict) else set()
    with StagedDir(engine_dir) as stage:
        section = _build_into(stage.path, engine_dir, manifest, graphs, options, trt, precision, graph_precision,
                              verbose, progress)
        stage.carry_rest(skip=old_files | {"manifest.json"})
        manifest["tensorrt"] = section
        write_manifest(stage.path, manifest)
    return section


def _build_into(out_dir: Path, engine_dir: Path, manifest: dict, graphs, options: BuildOptions, trt: TrtModule,
                precision: str, graph_precision: str, verbose: bool, progress) -> dict:
    """Build each graph of ``engine_dir`` into ``out_dir``/<graph>.engine (and copy the plugin there) -> the
    manifest's "tensorrt" section."""
    logger = _logger(trt, verbose)
    plugin_record = None
    if options.plugin is not None:
        load_plugin_library(trt, Path(options.plugin), logger)
        dest = out_dir / Path(options.plugin).name
        shutil.copy2(options.plugin, dest)  # the directory stays self-contained for the runtime
        plugin_record = {"file": dest.name, "sha256": sha256_file(dest)}

    ranges = axis_ranges(manifest, options)
    engines = {}
    for graph in graphs:
        spec = manifest["graphs"][graph]
        onnx_path = engine_dir / spec["file"]
        if not onnx_path.is_file():
            raise TensorRTBuildError(f"graph {graph!r}: {onnx_path} does not exist")
        if progress is not None:
            progress(graph)
        blob, record = build_engine(trt, onnx_path, graph, spec, ranges, options, precision, graph_precision,
                                    verbose=verbose)
        out = out_dir / f"{graph}{ENGINE_SUFFIX}"
        out.write_bytes(blob)
        engines[graph] = {"file": out.name, "sha256": hashlib.sha256(blob).hexdigest(), **record}

    return {
        "flavour": trt.flavour,
        "version": trt.version,
        # TensorRT engines are specific to the GPU they were built on; TensorRT-RTX engines are compiled for
        # the GPU at load time, so they carry no fixed compute capability.
        "compute_capability": detect_compute_capability() if trt.flavour == "tensorrt" else None,
        "precision": precision,
        "budgets": list(options.budgets),
        "max_context": ranges["seq"][2],
        "max_batch": options.max_batch,
        "plugin": plugin_record,
        "engines": engines,
    }


def check_engine_compat(section: dict, flavour: str, version: str, compute_capability: str | None) -> None:
    """Raises EngineMismatchError when engines described by a manifest "tensorrt" section cannot run here."""
    if not isinstance(section, dict) or "engines" not in section:
        raise EngineMismatchError("manifest.json has no TensorRT engines: run `coverpruner-build DIR --backend "
                                  "tensorrt` first")
    if section.get("flavour") != flavour:
        raise EngineMismatchError(f"engines were built with {section.get('flavour')} but this machine runs "
                                  f"{flavour}; rebuild them with `coverpruner-build`")
    if section.get("version") != version:
        raise EngineMismatchError(f"engines were built with {flavour} {section.get('version')} but {version} is "
                                  "installed; TensorRT engines only load in the version that built them: rebuild "
                                  "with `coverpruner-build`")
    built_cc = section.get("compute_capability")
    if built_cc is not None and built_cc != compute_capability:
        raise EngineMismatchError(f"engines were built for compute capability {built_cc} but this GPU is "
                                  f"{compute_capability or 'absent'}; rebuild them on this device")
