"""Issue 17 items 3 and 8 (export): a re-export never leaves a broken engine dir, and a bad --output is refused
before the model loads.

- ``--graphs decoder`` into a dir exported from another checkpoint exited 0 and rewrote the manifest with only
  the decoder (the dir no longer loaded): now refused with one line, the dir untouched.
- A re-export (or --quantize) killed part-way left no .onnx files and the old manifest: now the work happens in
  a temporary dir beside the target that is swapped in on success, so the old dir keeps working.
- ``--output AFILE/sub``: NotADirectoryError after 11 s of export; now one line at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coverpruner.export.cli import main

from .conftest import one_line, repo_env, run_main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory) -> Path:
    from coverpruner.testing.checkpoints import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("other_checkpoint"), preset="tiny", seed=1)


def _snapshot(root: Path) -> dict:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.iterdir()}


def _answer(engine, image) -> list[int]:
    from coverpruner.runtime import Pipeline

    return Pipeline.load(engine, provider="cpu", threads=1).generate(str(image), "hi", budget=8,
                                                                     max_new_tokens=3).token_ids


def test_partial_reexport_from_another_checkpoint_is_refused(engine_copy, other_checkpoint, capsys):
    before = _snapshot(engine_copy)
    manifest = (engine_copy / "manifest.json").read_bytes()
    code, _, err = run_main(main, capsys, "--model", other_checkpoint, "--output", engine_copy, "--graphs", "decoder",
                            "--no-progress")
    assert code == 2
    line = one_line(err)
    assert "--graphs" in line and str(engine_copy) in line
    assert _snapshot(engine_copy) == before and (engine_copy / "manifest.json").read_bytes() == manifest


def _kill_at_first_write(cmd: list[str], target: Path, limit_s: float = 180) -> int | None:
    """Run ``cmd``; SIGKILL it as soon as the target dir changes or an .onnx file appears beside it (a temporary
    dir). Returns the exit code when it finished before that, else None."""
    before = _snapshot(target)
    siblings = {p for p in target.parent.iterdir()}
    proc = subprocess.Popen(cmd, env=repo_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + limit_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return proc.returncode
            new = [p for p in target.parent.iterdir() if p not in siblings and p.is_dir()]
            if _snapshot(target) != before or any(any(p.glob("*.onnx")) for p in new):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                return None
            time.sleep(0.02)
        pytest.fail(f"{cmd} neither wrote nor finished in {limit_s} s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.parametrize("extra", [["--model", "CKPT", "--dtype", "fp32"], ["--quantize", "int8"]],
                         ids=["export", "quantize"])
def test_killed_reexport_leaves_the_old_dir_working(engine_copy, tiny_checkpoint, tiny_export, demo_image, extra):
    expected = _answer(tiny_export, demo_image)
    extra = [str(tiny_checkpoint) if a == "CKPT" else a for a in extra]
    cmd = [sys.executable, "-m", "coverpruner.export.cli", "--output", str(engine_copy), "--no-progress", *extra]
    code = _kill_at_first_write(cmd, engine_copy)
    assert code in (None, 0)
    from coverpruner.engine_dir import load_manifest

    load_manifest(engine_copy, verify=True)  # every file matches its hash
    if code is None:  # killed: the old engine answers exactly as before
        assert _answer(engine_copy, demo_image) == expected


def test_output_under_a_file_is_refused_at_once(tiny_checkpoint, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    t0 = time.monotonic()
    code, _, err = run_main(main, capsys, "--model", tiny_checkpoint, "--output", afile / "sub", "--no-progress")
    assert code == 2 and time.monotonic() - t0 < 5
    assert "afile" in one_line(err)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only dirs; needs an unprivileged user")
def test_unwritable_output_is_refused_before_export(tiny_checkpoint, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    t0 = time.monotonic()
    code, _, err = run_main(main, capsys, "--model", tiny_checkpoint, "--output", ro / "engine", "--no-progress")
    assert code == 2 and time.monotonic() - t0 < 5
    assert "ro" in one_line(err) and not any(ro.iterdir())
