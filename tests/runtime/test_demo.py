"""coverpruner-demo answers about the bundled image (checkpoint/export steps reuse the session fixtures)."""

import shutil

import pytest

from coverpruner.demo import DEMO_IMAGE, main

pytestmark = pytest.mark.slow


def test_bundled_image_is_packaged():
    from PIL import Image

    img = Image.open(DEMO_IMAGE)
    assert img.size == (480, 360) and img.mode == "RGB"


def test_demo_prints_answers_and_timings(tiny_checkpoint, tiny_export, tmp_path, capsys):
    shutil.copytree(tiny_checkpoint, tmp_path / "tiny-checkpoint")
    shutil.copytree(tiny_export, tmp_path / "tiny-engine")
    png = tmp_path / "sel.png"
    assert main(["--workdir", str(tmp_path), "--budget", "16", "--max-new-tokens", "4",
                 "--save-selection", str(png)]) == 0
    out = capsys.readouterr().out
    assert "reusing checkpoint" in out and "reusing engine dir" in out
    assert "demo weights are random" in out
    assert "A [budget 16 (coverpruner)]:" in out and "A [budget full (no pruning)]:" in out
    assert out.count("timings ms:") == 2 and "kept 16/144" in out and "kept 144/144" in out
    assert png.stat().st_size > 1000
