"""The engine dir's format, owned here and nowhere else (docs/engine-dir.md, format version 2).

Export writes it, the engine builder extends it (the "tensorrt" section), the runtime and the TensorRT
sessions read it; all of them go through this module: format constants, graph names, the tensor names
every family shares (embed, probe, selector, decoder and its KV cache), reading, validating, verifying
hashes and writing. The vision graph's inputs and outputs are family-defined and recorded under
``graphs.vision``. Torch-free and onnxruntime-free (the runtime and the engines import it).

Version 1 directories (written before the family contract) are refused with one line saying to re-export:
they lack the per-family fields (visual-token bound, position rank, family option defaults, axes) that
every reader now relies on, and guessing them would be a silent wrong answer for any family but LLaVA-1.5.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coverpruner.errors import ManifestError
from coverpruner.filehash import sha256_and_xxh3, xxh3_file

FORMAT = "coverpruner-engine-dir"
FORMAT_VERSION = 2
SUPPORTED_VERSIONS = (2,)
MANIFEST = "manifest.json"
VERIFY_CACHE = ".coverpruner-verified.json"

#: The plugin-form selector node (export/selector_plugin.py) and the TensorRT plugin creator that runs it
#: (engines/tensorrt.py looks it up in TensorRT's registry). Must equal kPluginName / kPluginVersion /
#: kPluginNamespace in csrc/plugin/selector_plugin_core.h (tests/engines/test_selector_plugin_model.py compares).
PLUGIN_OP = "CoverageSelector"
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = ""
#: The selector graph of each method that has one: selector.onnx (coverpruner, export/selector_graph.py) and the
#: peers' selector_dart.onnx / selector_cdpruner.onnx (export/peer_graphs.py). Each is optional: a method whose
#: graph is absent runs its numpy selector (coverpruner.selection).
METHOD_GRAPHS = {"coverpruner": "selector", "dart": "selector_dart", "cdpruner": "selector_cdpruner"}
#: Every graph an engine dir may hold, in export order.
GRAPH_NAMES = ("vision", "embed", "probe", *METHOD_GRAPHS.values(), "decoder")
#: Graphs the pipeline cannot run without (the selector graphs are optional: the numpy selectors always work).
REQUIRED_GRAPHS = ("vision", "embed", "probe", "decoder")

# Tensor names shared by every family (the vision graph's are the family's own).
EMBED_INPUTS = ("input_ids",)
EMBED_OUTPUTS = ("inputs_embeds",)
PROBE_INPUTS = ("inputs_embeds", "position_ids", "visual_positions", "instruction_positions")
PROBE_OUTPUTS = ("relevance",)
SELECTOR_INPUTS = ("image_features", "relevance", "budget", "tau")
SELECTOR_OUTPUTS = ("keep",)
DECODER_INPUTS = ("inputs_embeds", "attention_mask", "position_ids")
#: The decoder's inputs in the ORT form (contrib ops; KV [B, H_kv, capacity, hd] shared in place by past and
#: present; rotary rows computed on the host from the graph entry's "rotary" record): docs/engine-dir.md.
ORT_DECODER_INPUTS = ("inputs_embeds", "seqlens_k", "total_sequence_length", "rotary_cos", "rotary_sin",
                      "rotary_row")
#: contract v5 (graphs.decoder.attention "blocks"): the standard-form decoder's last input, int64 [B, S], the block
#: of each new row (-1: text); rows of one block attend to each other both ways in prefill
ATTENTION_BLOCKS = "attention_blocks"
#: contract v5, ORT form with blocks: per distinct window the additive mask of its layers, float [B, 1, S, T]
#: (0: attend, the float type's lowest: masked); "attention_bias" for full layers, "attention_bias.<W>" for window W
ATTENTION_BIAS = "attention_bias"


def attention_bias_name(window: int | None) -> str:
    """The ORT-form decoder input holding the mask of the layers with sliding window ``window`` (None: full)."""
    return ATTENTION_BIAS if window is None else f"{ATTENTION_BIAS}.{int(window)}"


def rotary_names(table: int) -> tuple[str, str]:
    """The ORT-form decoder's (cos, sin) inputs of rotary table ``table`` (0: rotary_cos / rotary_sin; k > 0: a
    second base, e.g. Gemma 3's local layers: rotary_cos.k / rotary_sin.k; graphs.decoder.rotary "tables")."""
    return ("rotary_cos", "rotary_sin") if table == 0 else (f"rotary_cos.{table}", f"rotary_sin.{table}")
LOGITS = "logits"
#: graphs.decoder.form: "standard" (standard ONNX ops, growing KV; TensorRT and every ORT provider) or "ort"
#: (ONNX Runtime contrib ops: GroupQueryAttention, SkipSimplifiedLayerNormalization; in-place KV; ORT CPU).
#: A decoder entry without "form" is "standard" (every directory written before the ORT form).
DECODER_FORMS = ("standard", "ort")

PRECISIONS = {"fp32": "float32", "fp16": "float16"}
#: images per request when the request names no limit: the manifest's defaults.max_images, which export writes;
#: engine dirs written before that field existed read as this
DEFAULT_MAX_IMAGES = 8
POSITION_RANKS = (1, 3)
POSITION_MODES = ("compact", "native")

_REQUIRED_TOP = ("format", "format_version", "family", "precision", "dims", "visual", "token_ids",
                 "chat_template", "processor", "defaults", "graphs")
_REQUIRED_DIMS = ("hidden_size", "num_layers", "num_kv_heads", "head_dim", "vocab_size", "max_position_embeddings")
_REQUIRED_VISUAL = ("max_visual_tokens", "position_rank", "position_mode")
_REQUIRED_TOKEN_IDS = ("image_token_id", "eos_token_id")
_REQUIRED_GRAPH = ("file", "sha256", "inputs", "outputs")


def _layers(layers) -> list[int]:
    return list(range(layers)) if isinstance(layers, int) else [int(i) for i in layers]


def past_names(layers) -> list[str]:
    """Decoder cache inputs, flat: past_key_values.0.key, past_key_values.0.value, past_key_values.1.key, ...
    layers: the layer count (every layer has a KV cache) or the KV layers' indices (contract v5: a hybrid decoder's
    full-attention layers)."""
    return [f"past_key_values.{i}.{kv}" for i in _layers(layers) for kv in ("key", "value")]


def present_names(layers) -> list[str]:
    """Decoder cache outputs, flat: present.0.key, present.0.value, ... (layers as past_names)."""
    return [f"present.{i}.{kv}" for i in _layers(layers) for kv in ("key", "value")]


@dataclass(frozen=True)
class StateSpec:
    """One decoder state that is not KV (contract v5; graphs.decoder.states): a [B, *shape] tensor of ``dtype``
    (numpy name) per layer of ``layers``, input past_key_values.{layer}.{name}, output present.{layer}.{name}."""

    name: str
    layers: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str

    def names(self) -> list[tuple[int, str, str]]:
        """(layer, input name, output name) per layer."""
        return [(i, f"past_key_values.{i}.{self.name}", f"present.{i}.{self.name}") for i in self.layers]


def state_names(states) -> list[str]:
    """The decoder's state inputs, in graph order (per state, per layer): past_key_values.{layer}.{name} (states:
    StateSpec or contract.DecoderState items)."""
    return [f"past_key_values.{i}.{s.name}" for s in states for i in s.layers]


def state_output_names(states) -> list[str]:
    """The decoder's state outputs, in graph order: present.{layer}.{name}."""
    return [f"present.{i}.{s.name}" for s in states for i in s.layers]


def decoder_state_record(spec, num_layers: int, float_dtype: str) -> dict:
    """graphs.decoder's kv_layers and states for a contract.DecoderSpec of a decoder of ``num_layers`` layers
    ({} for a decoder whose every layer has a KV cache and no other state): {"kv_layers": [...], "states":
    [{"name", "layers", "shape", "dtype"}]}, a state of dtype "model" resolved to ``float_dtype``."""
    kv = list(spec.kv_layer_list(num_layers))
    if kv == list(range(num_layers)) and not spec.states:
        return {}
    return {"kv_layers": kv, "states": [{"name": s.name, "layers": [int(i) for i in s.layers],
                                         "shape": [int(v) for v in s.shape],
                                         "dtype": float_dtype if s.dtype == "model" else s.dtype}
                                        for s in spec.states]}


def extras_record(extras) -> list[dict]:
    """graphs.decoder.extras for contract.DecoderExtra items: [{"name", "after_layer"}]."""
    return [{"name": e.name, "after_layer": int(e.after_layer)} for e in extras]


def attention_record(attention) -> dict:
    """graphs.decoder.attention for a contract.AttentionSpec: {"windows": [W or None per layer], "blocks": bool}."""
    return {"windows": [None if w is None else int(w) for w in attention.windows], "blocks": bool(attention.blocks)}


@dataclass(frozen=True)
class Attention:
    """graphs.decoder.attention (contract v5): per layer its sliding window or None (() = every layer full), and
    whether prefill blocks attend both ways. Attention() is plain causal attention (a dir without the record)."""

    windows: tuple = ()
    blocks: bool = False

    @property
    def plain(self) -> bool:
        return not self.blocks and all(w is None for w in self.windows)

    @property
    def distinct_windows(self) -> tuple:
        """The different windows of the layers (None for full layers), in first-layer order."""
        return tuple(dict.fromkeys(self.windows or (None,)))


def _attention(root: Path, gname: str, raw) -> Attention:
    """graphs.<gname>.attention validated -> Attention."""
    if raw is None:
        return Attention()
    where = f"graphs.{gname}.attention"
    if not isinstance(raw, dict):
        raise _fail(root, f"field {where} must be an object, got {type(raw).__name__}")
    windows, blocks = raw.get("windows", []), raw.get("blocks", False)
    if not isinstance(windows, list) or any(w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1)
                                            for w in windows):
        raise _fail(root, f"field {where}.windows is {windows!r}, expected a list of positive integers or null")
    if not isinstance(blocks, bool):
        raise _fail(root, f"field {where}.blocks is {blocks!r}, expected true or false")
    return Attention(tuple(windows), blocks)


def _extras(root: Path, gname: str, raw, inputs: tuple) -> tuple[tuple[str, int], ...]:
    """graphs.<gname>.extras validated against the graph's inputs -> ((name, after_layer), ...)."""
    if raw is None:
        return ()
    where = f"graphs.{gname}.extras"
    if not isinstance(raw, list):
        raise _fail(root, f"field {where} must be a list, got {type(raw).__name__}")
    names = {t.name for t in inputs}
    out = []
    for i, item in enumerate(raw):
        _require(root, item, ("name", "after_layer"), f"{where}[{i}]")
        layer = item["after_layer"]
        if item["name"] not in names:
            raise _fail(root, f"field {where}[{i}].name is {item['name']!r}, which is no input of the graph")
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise _fail(root, f"field {where}[{i}].after_layer is {layer!r}, expected an integer >= 0")
        out.append((item["name"], layer))
    return tuple(out)


def _index_list(root: Path, where: str, raw) -> tuple[int, ...]:
    if not isinstance(raw, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in raw):
        raise _fail(root, f"field {where} is {raw!r}, expected a list of integers >= 0")
    return tuple(raw)


def _states(root: Path, gname: str, g: dict, inputs: tuple) -> tuple[tuple[int, ...] | None, tuple[StateSpec, ...]]:
    """graphs.<gname>.kv_layers / states (contract v5) validated against the graph's inputs."""
    kv = None if g.get("kv_layers") is None else _index_list(root, f"graphs.{gname}.kv_layers", g["kv_layers"])
    raw = g.get("states", [])
    if not isinstance(raw, list):
        raise _fail(root, f"field graphs.{gname}.states must be a list, got {type(raw).__name__}")
    names = {t.name for t in inputs}
    states = []
    for i, item in enumerate(raw):
        where = f"graphs.{gname}.states[{i}]"
        _require(root, item, ("name", "layers", "shape", "dtype"), where)
        shape = _index_list(root, f"{where}.shape", item["shape"])
        if item["dtype"] not in ("float32", "float16"):
            raise _fail(root, f"field {where}.dtype is {item['dtype']!r}, expected 'float32' or 'float16'")
        spec = StateSpec(str(item["name"]), _index_list(root, f"{where}.layers", item["layers"]), shape,
                         item["dtype"])
        missing = [past for _, past, _ in spec.names() if past not in names]
        if missing:
            raise _fail(root, f"field {where} names {missing[0]!r}, which is no input of the graph")
        states.append(spec)
    return kv, tuple(states)


def position_ids_input(positions: np.ndarray, rank: int) -> np.ndarray:
    """Positions int64 [R, S] of one request -> the probe/decoder `position_ids` input.

    rank 1 -> [1, S] (batch-first, as HF Llama); rank 3 -> [3, 1, S] (M-RoPE t/h/w rows, as HF Qwen2.5-VL).
    """
    positions = np.asarray(positions, dtype=np.int64)
    if positions.ndim != 2 or positions.shape[0] != rank:
        raise ValueError(f"positions must be [{rank}, S], got {list(positions.shape)}")
    return np.ascontiguousarray(positions if rank == 1 else positions[:, None, :])


@dataclass(frozen=True)
class TensorSpec:
    """One graph input/output: name, dtype string ('float32', 'int64', ...), shape (int or str axes)."""

    name: str
    dtype: str
    shape: tuple


@dataclass(frozen=True)
class GraphSpec:
    """One graph of the engine dir with its absolute path and I/O contract."""

    name: str
    path: Path
    sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    data_files: tuple[Path, ...] = ()
    data_sha256: dict = field(default_factory=dict)
    #: "standard" or "ort" (DECODER_FORMS; only the decoder has an ORT form)
    form: str = "standard"
    #: ORT-form decoder: {"theta": float, "mrope_section": [t, h, w] or None, "mrope_interleaved": bool} for the
    #: host rotary rows
    rotary: dict | None = None
    #: decoder: the extra per-row inputs (contract v4) as (input name, after_layer), in graph-input order
    extras: tuple[tuple[str, int], ...] = ()
    #: decoder: its sliding windows and prefill blocks (contract v5; plain causal without the record)
    attention: Attention = Attention()
    #: decoder (contract v5): the layers with a KV cache (None: every layer) and the states that are not KV
    kv_layers: tuple[int, ...] | None = None
    states: tuple[StateSpec, ...] = ()

    @property
    def extra_names(self) -> tuple[str, ...]:
        """The decoder's extra input names (graphs.decoder.extras), in order; () without extras."""
        return tuple(name for name, _ in self.extras)


@dataclass(frozen=True)
class Manifest:
    """The parsed manifest.json of one engine dir. ``raw`` keeps every field as written (extra optional
    sections such as "tensorrt" or "quantization" included)."""

    root: Path
    raw: dict
    family: str
    precision: str
    dims: dict
    visual: dict
    token_ids: dict
    chat_template: str
    processor: dict
    defaults: dict
    graphs: dict  # name -> GraphSpec
    options: dict  # family request-option defaults, e.g. {"newline_policy": "drop"}
    axes: dict  # symbolic axis -> [min, opt, max] the family declared (vision axes, ...)
    files: dict  # family file key -> absolute Path (hash-checked like the graphs)

    @property
    def float_dtype(self) -> str:
        """numpy dtype name of the float tensors ('float32' for fp32, 'float16' for fp16)."""
        return PRECISIONS[self.precision]

    @property
    def decoder_form(self) -> str:
        """'standard' or 'ort' (DECODER_FORMS): which decoder graph the dir holds."""
        return self.graphs["decoder"].form

    @property
    def max_visual_tokens(self) -> int:
        """Upper bound on the candidates n of one image (n itself is per request)."""
        return int(self.visual["max_visual_tokens"])

    @property
    def position_rank(self) -> int:
        """R: 1 (position_ids [B, S]) or 3 (M-RoPE position_ids [3, B, S])."""
        return int(self.visual["position_rank"])

    @property
    def position_mode(self) -> str:
        """'compact' (positions re-packed after pruning) or 'native' (kept tokens keep theirs). Informative:
        the family's position scheme is what the runtime runs."""
        return self.visual["position_mode"]


def _fail(root: Path, msg: str) -> ManifestError:
    return ManifestError(f"{Path(root) / MANIFEST}: {msg}")


def _require(root: Path, obj, keys, where: str) -> None:
    if not isinstance(obj, dict):
        raise _fail(root, f"field {where!r} must be an object, got {type(obj).__name__}")
    for key in keys:
        if key not in obj:
            prefix = f"{where}." if where else ""
            raise _fail(root, f"missing field {prefix}{key!r}")


def read_raw(path: str | os.PathLike) -> dict:
    """The manifest dict of engine dir ``path`` after the format/version check (nothing else validated).

    Raises ManifestError (one line naming the file) for a missing dir or manifest, bad JSON, a foreign
    format, a version-1 directory (re-export) or an unknown version.
    """
    root = Path(path)
    if not root.exists():
        raise ManifestError(f"engine directory not found: {root}")
    if not root.is_dir():
        raise ManifestError(f"not a directory: {root} (expected an engine dir written by coverpruner-export)")
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise ManifestError(f"{mpath}: manifest.json not found; is {root} an engine dir written by coverpruner-export?")
    try:
        raw = json.loads(mpath.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise _fail(root, f"not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise _fail(root, f"top level must be a JSON object, got {type(raw).__name__}")
    _require(root, raw, ("format", "format_version"), "")
    if raw["format"] != FORMAT:
        raise _fail(root, f"field 'format' is {raw['format']!r}, expected {FORMAT!r}")
    if raw["format_version"] == 1:
        raise _fail(root, "format_version 1 predates the family contract (format 2); re-export the directory "
                          "with coverpruner-export")
    if raw["format_version"] not in SUPPORTED_VERSIONS:
        raise _fail(root, f"unknown format_version {raw['format_version']!r}; this coverpruner reads "
                          f"{list(SUPPORTED_VERSIONS)} (re-export, or upgrade coverpruner)")
    return raw


def read_if_present(path: str | os.PathLike) -> dict | None:
    """The manifest dict in ``path`` when it holds a readable current-version one, else None (for
    partial re-exports, which keep the previous manifest's other graphs)."""
    try:
        return read_raw(path)
    except ManifestError:
        return None


def write_manifest(path: str | os.PathLike, manifest: dict) -> Path:
    """Write ``manifest`` as DIR/manifest.json atomically (a temp file renamed over it: never half-written)."""
    root = Path(path)
    out, tmp = root / MANIFEST, root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, out)
    return out


def _tensor_specs(root: Path, gname: str, kind: str, items) -> tuple[TensorSpec, ...]:
    if not isinstance(items, list):
        raise _fail(root, f"field graphs.{gname}.{kind} must be a list, got {type(items).__name__}")
    specs = []
    for i, item in enumerate(items):
        _require(root, item, ("name", "dtype", "shape"), f"graphs.{gname}.{kind}[{i}]")
        specs.append(TensorSpec(item["name"], item["dtype"], tuple(item["shape"])))
    return tuple(specs)


def parse_manifest(root: Path, raw: dict) -> Manifest:
    """Validate a version-2 manifest dict (as read_raw returns it) into a Manifest; ManifestError names the
    first bad field."""
    root = Path(root)
    _require(root, raw, _REQUIRED_TOP, "")
    _require(root, raw["dims"], _REQUIRED_DIMS, "dims")
    _require(root, raw["visual"], _REQUIRED_VISUAL, "visual")
    _require(root, raw["token_ids"], _REQUIRED_TOKEN_IDS, "token_ids")
    if raw["precision"] not in PRECISIONS:
        raise _fail(root, f"field 'precision' is {raw['precision']!r}, expected one of {list(PRECISIONS)}")
    if not isinstance(raw["chat_template"], str) or not raw["chat_template"]:
        raise _fail(root, "field 'chat_template' must be a non-empty string")
    visual = raw["visual"]
    if visual["position_rank"] not in POSITION_RANKS:
        raise _fail(root, f"field visual.position_rank is {visual['position_rank']!r}, expected one of "
                          f"{list(POSITION_RANKS)}")
    if visual["position_mode"] not in POSITION_MODES:
        raise _fail(root, f"field visual.position_mode is {visual['position_mode']!r}, expected one of "
                          f"{list(POSITION_MODES)}")
    if not isinstance(visual["max_visual_tokens"], int) or visual["max_visual_tokens"] < 1:
        raise _fail(root, f"field visual.max_visual_tokens is {visual['max_visual_tokens']!r}, expected a "
                          "positive integer")
    for key, value in raw["dims"].items():  # every dim is a size (or a list of sizes: mrope_section)
        items = value if isinstance(value, list) and key not in _REQUIRED_DIMS else [value]
        if not items or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in items):
            raise _fail(root, f"field dims.{key} is {value!r}, expected a positive integer"
                              + (" or a list of them" if isinstance(value, list) else ""))
    defaults = {"max_images": DEFAULT_MAX_IMAGES, **raw["defaults"]}
    max_images = defaults["max_images"]
    if isinstance(max_images, bool) or not isinstance(max_images, int) or max_images < 0:
        raise _fail(root, f"field defaults.max_images is {max_images!r}, expected an integer >= 0")
    for key in ("options", "axes", "files"):
        if not isinstance(raw.get(key, {}), dict):
            raise _fail(root, f"field {key!r} must be an object, got {type(raw[key]).__name__}")
    graphs_raw = raw["graphs"]
    _require(root, graphs_raw, REQUIRED_GRAPHS, "graphs")
    graphs = {}
    for name, g in graphs_raw.items():
        _require(root, g, _REQUIRED_GRAPH, f"graphs.{name}")
        form = g.get("form", "standard")
        allowed = DECODER_FORMS if name == "decoder" else ("standard",)
        if form not in allowed:
            raise _fail(root, f"field graphs.{name}.form is {form!r}, expected one of {list(allowed)}")
        rotary = g.get("rotary")
        if form == "ort" and (not isinstance(rotary, dict) or "theta" not in rotary):
            raise _fail(root, f"field graphs.{name}.rotary (theta, mrope_section) is required for form 'ort'")
        inputs = _tensor_specs(root, name, "inputs", g["inputs"])
        kv_layers, states = _states(root, name, g, inputs)
        graphs[name] = GraphSpec(
            name=name, path=root / g["file"], sha256=g["sha256"], inputs=inputs,
            outputs=_tensor_specs(root, name, "outputs", g["outputs"]),
            data_files=tuple(root / f for f in g.get("data_files", [])),
            data_sha256=dict(g.get("data_sha256", {})), form=form, rotary=rotary,
            extras=_extras(root, name, g.get("extras"), inputs),
            attention=_attention(root, name, g.get("attention")), kv_layers=kv_layers, states=states,
        )
    files = {}
    for key, rec in raw.get("files", {}).items():
        _require(root, rec, ("file", "sha256"), f"files.{key}")
        files[key] = root / rec["file"]
    return Manifest(
        root=root, raw=raw, family=raw["family"], precision=raw["precision"], dims=dict(raw["dims"]),
        visual=dict(visual), token_ids=dict(raw["token_ids"]), chat_template=raw["chat_template"],
        processor=dict(raw["processor"]), defaults=defaults, graphs=graphs,
        options=dict(raw.get("options", {})), axes=dict(raw.get("axes", {})), files=files,
    )


def _stat_key(path: Path) -> list:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _load_verify_cache(root: Path) -> dict:
    try:
        cache = json.loads((root / VERIFY_CACHE).read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def _save_verify_cache(root: Path, cache: dict) -> None:
    tmp = root / f"{VERIFY_CACHE}.{os.getpid()}.tmp"
    try:  # a read-only directory just means we hash again next time
        tmp.write_text(json.dumps(cache, indent=0, sort_keys=True))
        os.replace(tmp, root / VERIFY_CACHE)
    except OSError:
        tmp.unlink(missing_ok=True)


def _hashed_files(manifest: Manifest, names) -> list[tuple[str, Path, str | None]]:
    """(where, path, expected sha256) for the graphs `names` (their external data included) and the
    family files."""
    out = []
    for name in names:
        g = manifest.graphs[name]
        out.append((f"graphs.{name}", g.path, g.sha256))
        out += [(f"graphs.{name}", p, g.data_sha256.get(p.name)) for p in g.data_files]
    for key, path in manifest.files.items():
        out.append((f"files.{key}", path, manifest.raw["files"][key]["sha256"]))
    return out


def _changed(path: Path) -> ManifestError:
    return ManifestError(f"{path}: contents changed since the directory was verified (xxh3 mismatch under the "
                         "same size and mtime: a corrupted or edited file); re-export the directory")


class IntegrityCheck:
    """The xxh3 re-check of files whose (size, mtime) matched the verification cache, running in a daemon
    thread (``background``) or already done. ``result()`` waits for it and raises ManifestError naming the
    first file whose contents changed; it is cheap to call again."""

    def __init__(self, pending: list[tuple[Path, str]], background: bool):
        self._pending = pending
        self._error: ManifestError | None = None
        self._thread = None
        if background and pending:
            self._thread = threading.Thread(target=self._check, name="coverpruner-verify", daemon=True)
            self._thread.start()
        else:
            self._check()
            self.result()  # synchronous: a changed file raises here

    def _check(self) -> None:
        for path, expected in self._pending:
            try:
                ok = xxh3_file(path) == expected
            except OSError as exc:
                self._error = ManifestError(f"{path}: cannot read ({exc.strerror or exc})")
                return
            if not ok:
                self._error = _changed(path)
                return

    @property
    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def result(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error


def verify_files(manifest: Manifest, names=None, use_cache: bool = True, background: bool = False) -> IntegrityCheck:
    """Check each graph file (and its external-data files) and each family file against the manifest's sha256.

    A file not in the verification cache (``.coverpruner-verified.json``), or whose size or mtime changed, is
    hashed with sha256 now and compared with the manifest (its xxh3-128 is recorded in the same pass). A file
    whose (size, mtime_ns) matches the cache is re-hashed in full with xxh3 and compared with the recorded
    digest: so flipped bytes under an unchanged size and mtime are caught too, at memory speed instead of
    sha256's. ``background``: run that re-check in a thread and return at once (``IntegrityCheck.result()``
    reports it; Pipeline checks it before its first answer); else it is done before returning.
    Raises ManifestError naming the file, the expected and the actual hash on a sha256 mismatch, or the missing
    file. ``names`` restricts the graph check to some graphs (default: all listed).
    """
    root = manifest.root
    cache = _load_verify_cache(root) if use_cache else {}
    changed, pending = False, []
    for where, path, expected in _hashed_files(manifest, names or manifest.graphs):
        if not path.is_file():
            raise ManifestError(f"{path}: file listed in manifest {where} is missing")
        if expected is None:
            raise _fail(root, f"{where}.data_sha256 has no hash for {path.name!r}")
        key = f"{path.name}:{expected}"
        stat = _stat_key(path)
        hit = cache.get(key)
        if isinstance(hit, list) and len(hit) == 3 and hit[:2] == stat and isinstance(hit[2], str):
            pending.append((path, hit[2]))
            continue
        actual, fast = sha256_and_xxh3(path)
        if actual != expected:
            raise ManifestError(
                f"{path}: sha256 mismatch (manifest expects {expected[:16]}..., file has {actual[:16]}...); "
                "the file changed after export; re-export the directory")
        cache[key] = stat + [fast]
        changed = True
    if use_cache and changed:
        _save_verify_cache(root, cache)
    return IntegrityCheck(pending, background)


def load_manifest(path: str | os.PathLike, verify: bool = True) -> Manifest:
    """Read ``path``/manifest.json, validate its fields and (``verify``) the file hashes."""
    root = Path(path)
    manifest = parse_manifest(root, read_raw(root))
    if verify:
        verify_files(manifest).result()
    return manifest


def graph_spec(manifest: Manifest, name: str) -> GraphSpec:
    """The GraphSpec of ``name``; ManifestError if the manifest does not list it."""
    if name not in manifest.graphs:
        raise _fail(manifest.root, f"graph {name!r} is not listed under 'graphs' (have {sorted(manifest.graphs)})")
    return manifest.graphs[name]


def describe(manifest: Manifest) -> dict[str, Any]:
    """A short summary dict (family, precision, dims, visual) for logs and --json output."""
    return {"family": manifest.family, "precision": manifest.precision,
            "quantization": manifest.raw.get("quantization"),
            "source_model": manifest.raw.get("source_model"), "dims": manifest.dims, "visual": manifest.visual}
