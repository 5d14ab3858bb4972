"""coverpruner-run on a LLaVA-NeXT engine dir: --newline-policy, the selection picture, bad input (one line,
exit 2), budgets above n, extreme aspect ratios."""

from __future__ import annotations

import json

import numpy as np
import pytest

from coverpruner.runtime.cli import main
from tests.families.llava_next.fixtures import smooth_image

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("next_cli") / "img.png"
    smooth_image(300, 120, seed=5).save(path)
    return path


def _run(capsys, *argv):
    code = main(list(map(str, argv)))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_newline_policy_flag_and_selection_picture(next_export, image_file, tmp_path, capsys):
    png = tmp_path / "sel.png"
    prefill = {}
    for policy in ("drop", "keep"):
        code, out, err = _run(capsys, next_export, "--image", image_file, "--prompt", "What is it?", "--budget", 16,
                              "--max-new-tokens", 3, "--newline-policy", policy, "--json", "--save-selection", png)
        assert code == 0, err
        res = json.loads(out)
        assert res["options"] == {"newline_policy": policy} and len(res["kept_indices"]) == 16
        prefill[policy] = res["prefill_tokens"]
    from PIL import Image

    pic = Image.open(png)
    assert pic.width > 2 * pic.height  # two panels for a landscape image
    # 300 x 120 -> 1x3 grid; its unpadded rows each carry one newline, kept only under "keep"
    assert prefill["keep"] - prefill["drop"] > 0


def test_unknown_newline_policy_is_one_line_exit_2(next_export, image_file, capsys):
    code, out, err = _run(capsys, next_export, "--image", image_file, "--prompt", "hi", "--newline-policy", "sometimes")
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "newline_policy" in err and "sometimes" in err


def test_budget_above_n_keeps_every_candidate(next_pipe):
    res = next_pipe.generate(smooth_image(200, 240), "What is it?", budget=10_000, max_new_tokens=2)
    full = next_pipe.generate(smooth_image(200, 240), "What is it?", budget="full", max_new_tokens=2)
    assert res.kept_indices.tolist() == list(range(156)) and res.token_ids == full.token_ids


@pytest.mark.parametrize("size", [(10000, 50), (50, 10000), (1, 1)], ids=["10000x50", "50x10000", "1x1"])
def test_extreme_and_tiny_images_give_an_answer(next_pipe, size):
    """10,000 x 50 keeps no grid rows (n = 36 base tokens), 50 x 10,000 keeps 18 newline-only rows, 1 x 1 is
    upscaled: each is a correct HF-shaped request (the token counts are checked against HF in
    test_preprocess.py), not a traceback."""
    w, h = size
    res = next_pipe.generate(smooth_image(w, h), "What is it?", budget=16, max_new_tokens=2)
    assert len(res.kept_indices) == 16 and res.num_visual_tokens >= 36 and len(res.token_ids) == 2
    assert np.all(np.diff(res.kept_indices) > 0)
