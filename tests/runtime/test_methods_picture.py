"""draw_methods / scripts/peer_selection_picture.py: the four methods' selections of one image side by side in one
PNG, each view exactly draw_selection of that method's kept tokens under a title strip."""

import runpy
import sys

import numpy as np
from PIL import Image

from coverpruner.runtime.visualize import draw_selection

METHODS = ["coverpruner", "divprune", "dart", "cdpruner"]
TITLE, GAP = 14, 16


def test_script_draws_each_methods_selection_side_by_side(tiny_export, demo_image, pipe, tmp_path, monkeypatch):
    out = tmp_path / "methods.png"
    monkeypatch.setattr(sys, "argv", ["peer_selection_picture.py", str(tiny_export), "--image", str(demo_image),
                                      "--prompt", "What is shown?", "--budget", "24", "--out", str(out)])
    try:
        runpy.run_path("scripts/peer_selection_picture.py", run_name="__main__")
    except SystemExit as exc:
        assert exc.code == 0
    pic = np.asarray(Image.open(out).convert("RGB"))
    x = 0
    for method in METHODS:  # each view: the method's own draw_selection below a title strip
        r = pipe.generate(demo_image, "What is shown?", budget=24, method=method, max_new_tokens=1)
        view = np.asarray(draw_selection(demo_image, r.kept_indices, r.panels))
        np.testing.assert_array_equal(pic[TITLE:TITLE + view.shape[0], x:x + view.shape[1]], view)
        x += view.shape[1] + GAP
    assert pic.shape[1] == x - GAP
    assert not out.with_name(out.name + ".tmp").exists()


def test_script_refuses_an_unknown_method_in_one_line(tiny_export, demo_image, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["peer_selection_picture.py", str(tiny_export), "--image", str(demo_image),
                                      "--prompt", "x", "--methods", "dart,fastv", "--out", str(tmp_path / "a.png")])
    code = None
    try:
        runpy.run_path("scripts/peer_selection_picture.py", run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "unknown method(s) ['fastv']" in err[0]
    assert not (tmp_path / "a.png").exists()
