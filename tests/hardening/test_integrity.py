"""Issue 17 items 2 and 7: an engine dir whose files changed, or whose manifest was edited by hand, is refused
with one line before it answers.

Item 2: bytes flipped in decoder.onnx with the same size and mtime used to load from the
``.coverpruner-verified.json`` cache (keyed by size and mtime) and answer garbage with exit 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from coverpruner.runtime.cli import main

from .conftest import free_port, one_line, repo_env, run_main

pytestmark = pytest.mark.slow


def _flip_keeping_stat(path, offset_fraction=0.6, count=64):
    """Invert ``count`` bytes in the middle of ``path`` (inside the weights) keeping its size and mtime."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(int(st.st_size * offset_fraction))
        block = f.read(count)
        f.seek(int(st.st_size * offset_fraction))
        f.write(bytes(b ^ 0xFF for b in block))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def _run(capsys, engine, image, *extra):
    return run_main(main, capsys, engine, "--image", image, "--prompt", "hi", "--budget", "8",
                    "--max-new-tokens", "2", "--json", *extra)


def test_flipped_bytes_with_same_stat_are_detected(engine_copy, demo_image, capsys):
    code, _, err = _run(capsys, engine_copy, demo_image)  # a clean load fills the verification cache
    assert code == 0, err
    _flip_keeping_stat(engine_copy / "decoder.onnx")
    code, out, err = _run(capsys, engine_copy, demo_image)
    assert code == 2 and out == ""
    line = one_line(err)
    assert "decoder.onnx" in line and ("changed" in line or "mismatch" in line)


def test_flipped_bytes_are_detected_by_the_python_api(engine_copy, demo_image):
    """The Python API refuses to answer too (a long-lived server must not answer from a rotten file)."""
    from coverpruner.runtime import CoverPrunerError, Pipeline

    Pipeline.load(engine_copy, provider="cpu", threads=1).generate(str(demo_image), "hi", budget=8, max_new_tokens=1)
    _flip_keeping_stat(engine_copy / "vision.onnx", 0.5)
    with pytest.raises(CoverPrunerError, match="vision.onnx"):
        pipe = Pipeline.load(engine_copy, provider="cpu", threads=1)
        pipe.generate(str(demo_image), "hi", budget=8, max_new_tokens=1)


def _edit_manifest(engine, **dims):
    path = engine / "manifest.json"
    raw = json.loads(path.read_text())
    raw["dims"].update(dims)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize("dims", [{"num_layers": 7}, {"max_position_embeddings": "abc"},
                                  {"num_kv_heads": -1}, {"vocab_size": 1.5}])
def test_hand_edited_manifest_is_one_line_in_run(engine_copy, demo_image, capsys, dims):
    """Item 7: ValueError tracebacks in run."""
    _edit_manifest(engine_copy, **dims)
    code, out, err = _run(capsys, engine_copy, demo_image)
    assert code == 2 and out == ""
    line = one_line(err)
    assert "manifest.json" in line and next(iter(dims)) in line


def test_hand_edited_manifest_is_one_line_in_serve(engine_copy):
    """Item 7 (serve): the server refuses to start with one line and exit 2 (bounded: 120 s)."""
    _edit_manifest(engine_copy, max_position_embeddings="abc")
    proc = subprocess.run([sys.executable, "-m", "coverpruner.serving.cli", str(engine_copy), "--port",
                           str(free_port())], capture_output=True, text=True, timeout=120, env=repo_env())
    assert proc.returncode == 2
    line = one_line(proc.stderr)
    assert "max_position_embeddings" in line


def test_load_manifest_verify_catches_flipped_bytes_synchronously(engine_copy):
    """engine_dir.load_manifest(verify=True) (coverpruner-build, the export checks) re-checks cached files at once."""
    from coverpruner.engine_dir import load_manifest
    from coverpruner.runtime import ManifestError

    load_manifest(engine_copy)  # fills the cache
    _flip_keeping_stat(engine_copy / "embed.onnx", 0.5)
    with pytest.raises(ManifestError, match="embed.onnx: contents changed"):
        load_manifest(engine_copy)
