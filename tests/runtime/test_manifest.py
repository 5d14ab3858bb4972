"""Manifest loading: every bad engine dir gives a one-line ManifestError naming file and field."""

import copy
import hashlib
import json
import os

import pytest

from coverpruner.runtime.errors import ManifestError
from coverpruner.filehash import sha256_file
from coverpruner.runtime.manifest import load_manifest

GRAPHS = ("vision", "embed", "probe", "selector", "decoder")


def _write_dir(root, mutate=None):
    root.mkdir(parents=True, exist_ok=True)
    graphs = {}
    for i, name in enumerate(GRAPHS):
        data = f"graph {name} ".encode() * (1000 + i)
        (root / f"{name}.onnx").write_bytes(data)
        graphs[name] = {"file": f"{name}.onnx", "sha256": hashlib.sha256(data).hexdigest(), "data_files": [],
                        "data_sha256": {}, "inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 3]}],
                        "outputs": [{"name": "y", "dtype": "float32", "shape": ["batch", 3]}]}
    m = {"format": "coverpruner-engine-dir", "format_version": 1, "family": "llava", "precision": "fp32",
         "dims": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
                  "vocab_size": 1024, "num_visual_tokens": 144, "max_position_embeddings": 1024},
         "token_ids": {"image_token_id": 1000, "bos_token_id": 1, "eos_token_id": 2},
         "chat_template": "{{ messages }}", "processor": {"crop_size": 168, "shortest_edge": 168},
         "defaults": {"budget": 64, "tau": 0.3, "method": "coverpruner", "position_mode": "compact"},
         "graphs": graphs}
    if mutate:
        m = copy.deepcopy(m)
        mutate(m)
    (root / "manifest.json").write_text(json.dumps(m))
    return root


def test_valid_dir_loads(tmp_path):
    m = load_manifest(_write_dir(tmp_path / "e"))
    assert m.family == "llava" and m.position_mode == "compact" and m.float_dtype == "float32"
    assert set(m.graphs) == set(GRAPHS) and m.graphs["decoder"].path == tmp_path / "e" / "decoder.onnx"


def test_missing_directory_and_manifest(tmp_path):
    with pytest.raises(ManifestError, match="engine directory not found"):
        load_manifest(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(ManifestError, match="not a directory"):
        load_manifest(tmp_path / "f")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ManifestError, match="manifest.json not found"):
        load_manifest(tmp_path / "empty")


def test_unknown_version_and_format(tmp_path):
    with pytest.raises(ManifestError, match="unknown format_version 7"):
        load_manifest(_write_dir(tmp_path / "a", lambda m: m.update(format_version=7)))
    with pytest.raises(ManifestError, match="expected 'coverpruner-engine-dir'"):
        load_manifest(_write_dir(tmp_path / "b", lambda m: m.update(format="onnx-bundle")))


def test_missing_fields_are_named(tmp_path):
    with pytest.raises(ManifestError, match=r"missing field dims\.'hidden_size'"):
        load_manifest(_write_dir(tmp_path / "a", lambda m: m["dims"].pop("hidden_size")))
    with pytest.raises(ManifestError, match=r"missing field graphs\.'probe'"):
        load_manifest(_write_dir(tmp_path / "b", lambda m: m["graphs"].pop("probe")))
    with pytest.raises(ManifestError, match=r"missing field graphs\.decoder\.'sha256'"):
        load_manifest(_write_dir(tmp_path / "c", lambda m: m["graphs"]["decoder"].pop("sha256")))
    with pytest.raises(ManifestError, match="missing field 'chat_template'"):
        load_manifest(_write_dir(tmp_path / "d", lambda m: m.pop("chat_template")))
    d = _write_dir(tmp_path / "e")
    (d / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_manifest(d)


def test_sha256_mismatch_and_missing_graph_file(tmp_path):
    d = _write_dir(tmp_path / "e")
    load_manifest(d)  # verifies and caches
    data = bytearray((d / "probe.onnx").read_bytes())
    data[10] ^= 1  # same size, different content
    (d / "probe.onnx").write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"probe\.onnx: sha256 mismatch"):
        load_manifest(d)
    os.remove(d / "probe.onnx")
    with pytest.raises(ManifestError, match=r"probe\.onnx: file listed in manifest graphs\.probe is missing"):
        load_manifest(d)


def test_verification_cache_skips_rehash_until_file_changes(tmp_path, monkeypatch):
    d = _write_dir(tmp_path / "e")
    load_manifest(d)
    calls = []
    import coverpruner.runtime.manifest as mod
    monkeypatch.setattr(mod, "sha256_file", lambda p, chunk=1 << 20: calls.append(p.name) or sha256_file(p))
    load_manifest(d)
    assert calls == []  # unchanged files: no re-hash
    (d / "embed.onnx").write_bytes((d / "embed.onnx").read_bytes())  # rewrite: new mtime
    os.utime(d / "embed.onnx", ns=(1, 1))
    load_manifest(d)
    assert calls == ["embed.onnx"]
