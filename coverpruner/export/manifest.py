"""manifest.json of an engine dir (docs/engine-dir.md, format version 1): build, read, write."""

from __future__ import annotations

import json
from pathlib import Path

import coverpruner
from coverpruner.export.onnx_io import SavedGraph, describe_io
from coverpruner.filehash import sha256_file

FORMAT = "coverpruner-engine-dir"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def graph_entry(saved: SavedGraph) -> dict:
    """Manifest entry of one graph: file, external data files, hashes, opset, inputs/outputs."""
    d = saved.onnx_file.parent
    opset, inputs, outputs = describe_io(saved.onnx_file)
    return {
        "file": saved.onnx_file.name,
        "data_files": list(saved.data_files),
        "sha256": sha256_file(saved.onnx_file),
        "data_sha256": {f: sha256_file(d / f) for f in saved.data_files},
        "opset": opset,
        "inputs": inputs,
        "outputs": outputs,
    }


def build_manifest(*, family, config, model_dir: Path, source_model: str, precision: str, graphs: dict,
                   tokenizer_files: list[str], processor_files: list[str], selector_form: str | None,
                   versions: dict) -> dict:
    """The full manifest dict. `graphs` maps graph name -> graph_entry(...)."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "family": family.name,
        "source_model": source_model,
        "coverpruner_version": coverpruner.__version__,
        "precision": precision,
        "dims": family.dims(config),
        "token_ids": family.token_ids(config),
        "chat_template": family.chat_template(model_dir),
        "layout": family.layout(),
        "processor": family.processor_settings(model_dir),
        "defaults": {"budget": 64, "tau": 0.3, "method": "coverpruner", "position_mode": family.position_mode},
        "tokenizer_files": tokenizer_files,
        "processor_files": processor_files,
        "selector_form": selector_form,
        "export": versions,
        "graphs": graphs,
    }


def read_manifest(directory: Path) -> dict | None:
    """The manifest in `directory`, or None when there is none or it is not an engine-dir manifest."""
    f = Path(directory) / MANIFEST
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text())
    except json.JSONDecodeError:
        return None
    return data if data.get("format") == FORMAT else None


def write_manifest(directory: Path, manifest: dict) -> Path:
    f = Path(directory) / MANIFEST
    f.write_text(json.dumps(manifest, indent=2) + "\n")
    return f
