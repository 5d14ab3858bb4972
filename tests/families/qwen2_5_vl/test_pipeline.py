"""Qwen2.5-VL's pipeline quirks: fixed image_size == the HF reference on the resized image, bad sizes, the
selection picture on the merged grid, the CLI flag. Budgets full/64/16 x methods == the HF reference (and pruned ==
masked full model) is the matrix test (tests/matrix/test_pipeline_reference.py; facts in matrix.py)."""

import numpy as np
import pytest

from coverpruner.runtime.errors import CoverPrunerError
from tests.families.qwen2_5_vl import hf_reference as ref
from tests.families.qwen2_5_vl.fixtures import sample_image

PROMPT = "What is written on the sign next to the red car?"
STEPS = 10
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pipe(qwen_export):
    from coverpruner.runtime.pipeline import Pipeline

    return Pipeline.load(qwen_export)


def _eos(model):
    return set(model.generation_config.eos_token_id)  # what HF generate stops on


def test_fixed_image_size(pipe, qwen_hf, qwen_checkpoint):
    """image_size=(W, H) == the HF processor fed the image resized to W x H; n = (W/28)*(H/28)."""
    from PIL import Image

    image = sample_image(6, (200, 330))
    ours = pipe.generate(image, PROMPT, budget=16, method="divprune", max_new_tokens=STEPS, image_size=(252, 196))
    assert ours.num_visual_tokens == 9 * 7
    req = ref.native_request(qwen_hf, qwen_checkpoint, image.resize((252, 196), Image.BICUBIC), PROMPT)
    keep = ref.select(qwen_hf, req, "divprune", 16)
    np.testing.assert_array_equal(ours.kept_indices, keep)
    assert ours.token_ids == ref.pruned_generate(qwen_hf, req, keep, STEPS, _eos(qwen_hf))


@pytest.mark.parametrize("size,msg", [((250, 196), "multiples of 28"), ("1008x1008", "outside the checkpoint"),
                                      ("big", "WIDTHxHEIGHT")])
def test_bad_image_size_is_one_line(pipe, size, msg):
    with pytest.raises(CoverPrunerError, match=msg) as exc:
        pipe.generate(sample_image(0), PROMPT, image_size=size, max_new_tokens=2)
    assert "\n" not in str(exc.value)


def test_selection_picture_on_merged_grid(pipe, tmp_path):
    from coverpruner.runtime.visualize import save_selection

    res = pipe.generate(sample_image(5, (300, 250)), PROMPT, budget=16, max_new_tokens=2)
    (panel,) = res.panels
    assert panel.shape == (11, 9) and panel.box == (0.0, 0.0, 250.0, 300.0)
    np.testing.assert_array_equal(panel.cells, np.arange(99))
    out = save_selection(tmp_path / "sel.png", sample_image(5, (300, 250)), res.kept_indices, res.panels)
    assert out.stat().st_size > 1000


def test_cli_image_size_flag(qwen_export, tmp_path, capsys):
    import json

    from coverpruner.runtime.cli import main

    img = tmp_path / "img.png"
    sample_image(7, (200, 330)).save(img)
    args = [str(qwen_export), "--image", str(img), "--prompt", PROMPT, "--budget", "8", "--max-new-tokens", "3"]
    assert main(args + ["--image-size", "252x196", "--json", "--save-selection", str(tmp_path / "sel.png")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_visual_tokens"] == 63 and out["kept_tokens"] == 8 and out["options"]["image_size"] == [252, 196]
    assert (tmp_path / "sel.png").stat().st_size > 1000
    assert main(args + ["--image-size", "250x196"]) == 2
    err = capsys.readouterr().err.strip()
    assert "multiples of 28" in err and len(err.splitlines()) == 1
