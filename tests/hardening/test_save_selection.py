"""Issue 17 items 4 and 6: coverpruner-run --save-selection checks its path before any work: the parent folder
must exist (it was created), the name must end in .png (any name got PNG bytes), and it must not be a folder
(IsADirectoryError traceback)."""

from __future__ import annotations

import pytest

from coverpruner.runtime.cli import main

from .conftest import one_line, run_main

pytestmark = pytest.mark.slow


def _save(tiny_export, demo_image, capsys, target):
    return run_main(main, capsys, tiny_export, "--image", demo_image, "--prompt", "hi", "--budget", "8",
                    "--max-new-tokens", "1", "--save-selection", target)


def test_missing_parent_is_refused_and_not_created(tiny_export, demo_image, tmp_path, capsys):
    target = tmp_path / "no-such-dir" / "x.png"
    code, out, err = _save(tiny_export, demo_image, capsys, target)
    assert code == 2 and out == ""
    assert "save-selection" in one_line(err)
    assert not target.parent.exists()


@pytest.mark.parametrize("name", ["x.jpg", "x", "x.png.txt"])
def test_non_png_name_is_refused(tiny_export, demo_image, tmp_path, capsys, name):
    code, out, err = _save(tiny_export, demo_image, capsys, tmp_path / name)
    assert code == 2 and out == ""
    assert ".png" in one_line(err)
    assert not (tmp_path / name).exists()


def test_directory_is_refused(tiny_export, demo_image, tmp_path, capsys):
    folder = tmp_path / "sel.png"
    folder.mkdir()
    code, out, err = _save(tiny_export, demo_image, capsys, folder)
    assert code == 2 and out == ""
    assert "directory" in one_line(err) or "folder" in one_line(err)
