"""Load and validate an engine dir's manifest.json (format version 1, docs/engine-dir.md).

The runtime trusts nothing but this file: every graph file is checked against its sha256
(streamed, 1 MiB at a time) before a session opens it. A verified (size, mtime_ns) pair is
remembered in ``.coverpruner-verified.json`` next to the manifest so that a second load of an
unchanged directory skips re-hashing multi-GiB files; any change to a file's size or mtime
forces a fresh hash.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coverpruner.filehash import sha256_file
from coverpruner.runtime.errors import ManifestError

FORMAT_NAME = "coverpruner-engine-dir"
SUPPORTED_VERSIONS = (1,)
GRAPH_NAMES = ("vision", "embed", "probe", "selector", "decoder")
#: Graphs the pipeline cannot run without (selector.onnx is optional: the numpy selector is default).
REQUIRED_GRAPHS = ("vision", "embed", "probe", "decoder")
VERIFY_CACHE = ".coverpruner-verified.json"

_REQUIRED_TOP = ("format", "format_version", "family", "precision", "dims", "token_ids",
                 "chat_template", "processor", "defaults", "graphs")
_REQUIRED_DIMS = ("hidden_size", "num_layers", "num_kv_heads", "head_dim", "vocab_size",
                  "num_visual_tokens", "max_position_embeddings")
_REQUIRED_TOKEN_IDS = ("image_token_id", "eos_token_id")
_REQUIRED_GRAPH = ("file", "sha256", "inputs", "outputs")


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


@dataclass(frozen=True)
class Manifest:
    """The parsed manifest.json of one engine dir. ``raw`` keeps every field as written."""

    root: Path
    raw: dict
    family: str
    precision: str
    dims: dict
    token_ids: dict
    chat_template: str
    processor: dict
    defaults: dict
    graphs: dict  # name -> GraphSpec

    @property
    def float_dtype(self) -> str:
        """numpy dtype name of the float tensors ('float32' for fp32, 'float16' for fp16)."""
        return {"fp32": "float32", "fp16": "float16"}[self.precision]

    @property
    def position_mode(self) -> str:
        """'compact' (positions re-packed after pruning) or 'native' (kept tokens keep theirs)."""
        return self.defaults.get("position_mode", "compact")


def _fail(root: Path, msg: str) -> ManifestError:
    return ManifestError(f"{root / 'manifest.json'}: {msg}")


def _require(root: Path, obj: dict, keys, where: str) -> None:
    if not isinstance(obj, dict):
        raise _fail(root, f"field {where!r} must be an object, got {type(obj).__name__}")
    for key in keys:
        if key not in obj:
            prefix = f"{where}." if where else ""
            raise _fail(root, f"missing field {prefix}{key!r}")


def _tensor_specs(root: Path, gname: str, kind: str, items) -> tuple[TensorSpec, ...]:
    if not isinstance(items, list):
        raise _fail(root, f"field graphs.{gname}.{kind} must be a list, got {type(items).__name__}")
    specs = []
    for i, item in enumerate(items):
        _require(root, item, ("name", "dtype", "shape"), f"graphs.{gname}.{kind}[{i}]")
        specs.append(TensorSpec(item["name"], item["dtype"], tuple(item["shape"])))
    return tuple(specs)


def _stat_key(path: Path) -> list:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _load_verify_cache(root: Path) -> dict:
    try:
        return json.loads((root / VERIFY_CACHE).read_text())
    except (OSError, ValueError):
        return {}


def _save_verify_cache(root: Path, cache: dict) -> None:
    try:  # a read-only directory just means we hash again next time
        (root / VERIFY_CACHE).write_text(json.dumps(cache, indent=0, sort_keys=True))
    except OSError:
        pass


def verify_files(manifest: Manifest, names=None, use_cache: bool = True) -> None:
    """Check each graph file (and its external-data files) against the manifest's sha256.

    Raises ManifestError naming the file, the expected and the actual hash on a mismatch, or the
    missing file. ``names`` restricts the check to some graphs (default: all listed).
    """
    root = manifest.root
    cache = _load_verify_cache(root) if use_cache else {}
    changed = False
    for name in names or manifest.graphs:
        g = manifest.graphs[name]
        pairs = [(g.path, g.sha256)] + [(p, g.data_sha256.get(p.name)) for p in g.data_files]
        for path, expected in pairs:
            if not path.is_file():
                raise ManifestError(f"{path}: file listed in manifest graphs.{name} is missing")
            if expected is None:
                raise _fail(root, f"graphs.{name}.data_sha256 has no hash for {path.name!r}")
            key = f"{path.name}:{expected}"
            stat = _stat_key(path)
            if cache.get(key) == stat:
                continue
            actual = sha256_file(path)
            if actual != expected:
                raise ManifestError(
                    f"{path}: sha256 mismatch (manifest expects {expected[:16]}..., file has {actual[:16]}...); "
                    "the file changed after export; re-export the directory"
                )
            cache[key] = stat
            changed = True
    if use_cache and changed:
        _save_verify_cache(root, cache)


def load_manifest(path: str | os.PathLike, verify: bool = True) -> Manifest:
    """Read ``path``/manifest.json, validate its fields and (``verify``) the graph hashes."""
    root = Path(path)
    if not root.exists():
        raise ManifestError(f"engine directory not found: {root}")
    if not root.is_dir():
        raise ManifestError(f"not a directory: {root} (expected an engine dir written by coverpruner-export)")
    mpath = root / "manifest.json"
    if not mpath.is_file():
        raise ManifestError(f"{mpath}: manifest.json not found; is {root} an engine dir written by coverpruner-export?")
    try:
        raw = json.loads(mpath.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise _fail(root, f"not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise _fail(root, f"top level must be a JSON object, got {type(raw).__name__}")
    _require(root, raw, ("format", "format_version"), "")
    if raw["format"] != FORMAT_NAME:
        raise _fail(root, f"field 'format' is {raw['format']!r}, expected {FORMAT_NAME!r}")
    if raw["format_version"] not in SUPPORTED_VERSIONS:
        raise _fail(root, f"unknown format_version {raw['format_version']!r}; this runtime reads "
                          f"{list(SUPPORTED_VERSIONS)} (re-export, or upgrade coverpruner)")
    _require(root, raw, _REQUIRED_TOP, "")
    _require(root, raw["dims"], _REQUIRED_DIMS, "dims")
    _require(root, raw["token_ids"], _REQUIRED_TOKEN_IDS, "token_ids")
    if raw["precision"] not in ("fp32", "fp16"):
        raise _fail(root, f"field 'precision' is {raw['precision']!r}, expected 'fp32' or 'fp16'")
    if not isinstance(raw["chat_template"], str) or not raw["chat_template"]:
        raise _fail(root, "field 'chat_template' must be a non-empty string")
    graphs_raw = raw["graphs"]
    _require(root, graphs_raw, REQUIRED_GRAPHS, "graphs")
    graphs = {}
    for name, g in graphs_raw.items():
        _require(root, g, _REQUIRED_GRAPH, f"graphs.{name}")
        graphs[name] = GraphSpec(
            name=name,
            path=root / g["file"],
            sha256=g["sha256"],
            inputs=_tensor_specs(root, name, "inputs", g["inputs"]),
            outputs=_tensor_specs(root, name, "outputs", g["outputs"]),
            data_files=tuple(root / f for f in g.get("data_files", [])),
            data_sha256=dict(g.get("data_sha256", {})),
        )
    mode = raw["defaults"].get("position_mode", "compact")
    if mode not in ("compact", "native"):
        raise _fail(root, f"field defaults.position_mode is {mode!r}, expected 'compact' or 'native'")
    manifest = Manifest(
        root=root, raw=raw, family=raw["family"], precision=raw["precision"], dims=dict(raw["dims"]),
        token_ids=dict(raw["token_ids"]), chat_template=raw["chat_template"],
        processor=dict(raw["processor"]), defaults=dict(raw["defaults"]), graphs=graphs,
    )
    if verify:
        verify_files(manifest)
    return manifest


def graph_spec(manifest: Manifest, name: str) -> GraphSpec:
    """The GraphSpec of ``name``; ManifestError if the manifest does not list it."""
    if name not in manifest.graphs:
        raise _fail(manifest.root, f"graph {name!r} is not listed under 'graphs' (have {sorted(manifest.graphs)})")
    return manifest.graphs[name]


def describe(manifest: Manifest) -> dict[str, Any]:
    """A short summary dict (family, precision, dims) for logs and --json output."""
    return {"family": manifest.family, "precision": manifest.precision,
            "quantization": manifest.raw.get("quantization"),
            "source_model": manifest.raw.get("source_model"), "dims": manifest.dims}
