"""coverpruner.staged_dir: a directory replaced all at once (export, --quantize and coverpruner-build use it)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from coverpruner.staged_dir import StagedDir

REPO = Path(__file__).resolve().parents[1]


def _tree(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _old(tmp_path):
    target = tmp_path / "engine"
    (target / "sub").mkdir(parents=True)
    (target / "a.onnx").write_bytes(b"old graph")
    (target / "notes.txt").write_bytes(b"mine")
    (target / "sub" / "x").write_bytes(b"nested")
    return target


def test_success_swaps_in_the_stage_and_carries_what_is_kept(tmp_path):
    target = _old(tmp_path)
    with StagedDir(target) as stage:
        assert stage.path.parent == target.parent and stage.path.name.startswith(".engine.staging-")
        (stage.path / "a.onnx").write_bytes(b"new graph")
        assert _tree(target)["a.onnx"] == b"old graph"  # nothing visible before the swap
        carried = stage.carry_rest(skip={"sub"})
    assert carried == ["notes.txt"]
    assert _tree(target) == {"a.onnx": b"new graph", "notes.txt": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]  # stage and old contents gone


def test_carry_links_files_and_folders(tmp_path):
    target = _old(tmp_path)
    inode = (target / "notes.txt").stat().st_ino
    with StagedDir(target) as stage:
        stage.carry("notes.txt")
        stage.carry("sub")
    assert (target / "notes.txt").stat().st_ino == inode  # a hard link, not a copy
    assert _tree(target) == {"notes.txt": b"mine", "sub/x": b"nested"}


def test_an_exception_leaves_the_target_untouched(tmp_path):
    target = _old(tmp_path)
    before = _tree(target)
    with pytest.raises(RuntimeError):
        with StagedDir(target) as stage:
            (stage.path / "a.onnx").write_bytes(b"half")
            raise RuntimeError("export failed")
    assert _tree(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]


def test_a_new_target_is_created(tmp_path):
    with StagedDir(tmp_path / "new" / "engine") as stage:
        (stage.path / "m").write_text("x")
    assert (tmp_path / "new" / "engine" / "m").read_text() == "x"


def test_a_killed_writer_leaves_the_target_and_its_stage_is_cleared_next_time(tmp_path):
    target = _old(tmp_path)
    before = _tree(target)
    code = ("import os, sys\nfrom coverpruner.staged_dir import StagedDir\n"
            f"with StagedDir({str(target)!r}) as s:\n"
            "    (s.path / 'a.onnx').write_bytes(b'half')\n    os._exit(9)\n")  # dies without cleaning up
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 9
    assert _tree(target) == before
    assert len(list(tmp_path.glob(".engine.staging-*"))) == 1
    with StagedDir(target) as stage:
        stage.carry_rest()
    assert _tree(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]


def test_export_refuses_a_folder_that_is_not_an_engine_dir(tmp_path):
    from coverpruner.export.exporter import ExportOptions, TargetError, check_target

    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"x")
    with pytest.raises(TargetError, match="no manifest.json"):
        check_target(tmp_path / "photos", ExportOptions(), "some/model")
    (tmp_path / "empty").mkdir()
    check_target(tmp_path / "empty", ExportOptions(), "some/model")  # an empty folder is fine


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_the_swapped_in_dir_has_the_umask_mode_not_mkdtemp_0700(tmp_path, umask):
    """Issue 40: an exported engine dir was 0700 (mkdtemp's private mode) where its checkpoint was 0755; a server
    running as another user could not read it. The stage is chmod-ed to what mkdir gives under the umask."""
    old = os.umask(umask)
    try:
        with StagedDir(tmp_path / "engine") as stage:
            (stage.path / "manifest.json").write_text("{}")
        (tmp_path / "plain").mkdir()  # the reference: what mkdir gives under this umask
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "engine").stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode) \
        == 0o777 & ~umask


def test_atomic_result_files_are_not_private(tmp_path):
    from coverpruner.evaluation.files import write_atomic

    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "results.md", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "results.md").stat().st_mode) == 0o644
