"""Issue 40: Qwen3-VL takes image_size and min/max pixels as Qwen2.5-VL does (a user can bound its visual tokens),
on the Python API, the CLI and the server's extra fields.

The reference is transformers' image processor called with the same bounds (its per-call size={"shortest_edge":
min_pixels, "longest_edge": max_pixels}), pixel for pixel; the token counts are the literal arithmetic of one token
per 32 x 32 px of the resized image. The tiny checkpoint's own limits are 32*32*[4, 160] pixels.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow
PROMPT = "Which colour is the largest blob?"


@pytest.fixture(scope="module")
def pipe(qwen3_export):
    from coverpruner.runtime.pipeline import Pipeline

    return Pipeline.load(qwen3_export)


@pytest.mark.parametrize("size, lo, hi", [((300, 250), None, 32 * 32 * 20), ((140, 420), 32 * 32 * 30, None),
                                          ((40, 50), 32 * 32 * 9, 32 * 32 * 12)])
def test_pixel_bounds_equal_hf_image_processor(qwen3_checkpoint, size, lo, hi):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from coverpruner.families.qwen3_preprocess import Qwen3ImageSettings
    from coverpruner.families.qwen_vl import preprocess_qwen_image
    from tests.families.qwen3_vl.fixtures import sample_image

    config = json.loads((qwen3_checkpoint / "preprocessor_config.json").read_text())
    settings = Qwen3ImageSettings.from_dict(config)
    image = sample_image(2, size)
    bounds = {"shortest_edge": lo or settings.min_pixels, "longest_edge": hi or settings.max_pixels}
    hf = Qwen2VLImageProcessorPil.from_pretrained(str(qwen3_checkpoint))(images=[image], size=bounds,
                                                                          return_tensors="np")
    ours = preprocess_qwen_image(image, settings, min_pixels=lo, max_pixels=hi)
    assert ours.grid_thw == tuple(int(v) for v in hf["image_grid_thw"][0])
    np.testing.assert_array_equal(ours.pixel_values, hf["pixel_values"])
    h, w = ours.resized
    assert bounds["shortest_edge"] <= h * w <= bounds["longest_edge"]


def test_token_counts_through_api_cli_and_server(pipe, qwen3_export, tmp_path, capsys):
    from coverpruner.runtime.cli import main
    from coverpruner.serving import ServerConfig
    from tests.families.qwen3_vl.fixtures import sample_image
    from tests.serving.conftest import data_url, start_server, user_message

    image = sample_image(3, (300, 250))
    # the default smart resize: 288 x 256 px = 9 x 8 tokens
    assert pipe.generate(image, PROMPT, budget=4, max_new_tokens=1).num_visual_tokens == 9 * 8
    assert pipe.generate(image, PROMPT, budget=4, max_new_tokens=1, image_size=(128, 96)).num_visual_tokens == 4 * 3
    capped = pipe.generate(image, PROMPT, budget=4, max_new_tokens=1, max_pixels=32 * 32 * 20)
    # over 20 tokens' pixels: beta = sqrt(300 * 250 / 20480), sides floor(300 / beta / 32) = floor(250 / beta / 32) = 4
    assert capped.num_visual_tokens == 4 * 4

    path = tmp_path / "img.png"
    image.save(path)
    args = [str(qwen3_export), "--image", str(path), "--prompt", PROMPT, "--budget", "4", "--max-new-tokens", "1",
            "--json"]
    assert main(args + ["--max-pixels", str(32 * 32 * 20)]) == 0
    assert json.loads(capsys.readouterr().out)["num_visual_tokens"] == 16
    assert main(args + ["--image-size", "128x96"]) == 0
    assert json.loads(capsys.readouterr().out)["num_visual_tokens"] == 12

    png = path.read_bytes()
    with start_server(ServerConfig(str(qwen3_export), threads=1, model_name="tiny")) as url:
        import openai

        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        for extra, n in (({"max_pixels": 32 * 32 * 20}, 16), ({"image_size": "128x96"}, 12),
                         ({"min_pixels": 32 * 32 * 100}, None)):
            r = client.chat.completions.create(model="tiny", messages=user_message(data_url(png), PROMPT),
                                               max_tokens=1, extra_body={"budget": 4, **extra})
            got = r.model_extra["coverpruner"]["n"]
            assert got == n if n is not None else got >= 100, (extra, got)


@pytest.mark.parametrize("options, message", [
    ({"max_pixels": 32 * 32 * 161}, "max_pixels <= 163840"),
    ({"min_pixels": 500}, "need 1024"),
    ({"min_pixels": 32 * 32 * 50, "max_pixels": 32 * 32 * 40}, "min_pixels <= max_pixels"),
    ({"max_pixels": "²"}, "max_pixels must be an integer >= 1"),
    ({"image_size": (128, 96), "max_pixels": 32 * 32 * 10}, "outside the checkpoint's limits"),
])
def test_bad_bounds_are_one_line(pipe, options, message):
    from coverpruner.runtime.errors import CoverPrunerError
    from tests.families.qwen3_vl.fixtures import sample_image

    with pytest.raises(CoverPrunerError, match=message) as info:
        pipe.generate(sample_image(0, (300, 250)), PROMPT, max_new_tokens=1, **options)
    assert "\n" not in str(info.value)
