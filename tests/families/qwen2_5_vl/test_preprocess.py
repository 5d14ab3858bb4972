"""numpy Qwen2-VL preprocessing == transformers' Qwen2VLImageProcessorPil (pixels and grid), fixed sizes."""

import numpy as np
import pytest
from PIL import Image

from coverpruner.families.qwen_vl import QwenImageSettings, check_image_size, preprocess_qwen_image

transformers = pytest.importorskip("transformers")

SIZES = {  # (H, W): square, landscape, portrait, needs upscaling (< min_pixels), above max_pixels
    "square": (224, 224), "landscape": (240, 400), "portrait_odd": (517, 301), "tiny": (20, 33),
    "huge": (900, 1300), "thin": (60, 700),
}


def _hf(**kw):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(**kw)


@pytest.mark.parametrize("name", sorted(SIZES))
@pytest.mark.parametrize("limits", [(56 * 56, 28 * 28 * 1280), (28 * 28 * 4, 28 * 28 * 160)])
def test_matches_hf_processor(name, limits):
    rng = np.random.default_rng(len(name))
    img = Image.fromarray(rng.integers(0, 256, (*SIZES[name], 3), dtype=np.uint8))
    hf = _hf(size={"shortest_edge": limits[0], "longest_edge": limits[1]})
    ref = hf(images=[img], return_tensors="np")
    ours = preprocess_qwen_image(img, QwenImageSettings.from_dict(hf.to_dict()))
    assert ours.grid_thw == tuple(ref["image_grid_thw"][0].tolist())
    assert ours.pixel_values.dtype == np.float32 and ours.pixel_values.shape == ref["pixel_values"].shape
    np.testing.assert_array_equal(ours.pixel_values, ref["pixel_values"])  # bit-identical


def test_grayscale_and_rgba_match_hf():
    rng = np.random.default_rng(1)
    hf = _hf()
    for img in (Image.fromarray(rng.integers(0, 256, (300, 200), dtype=np.uint8), mode="L"),
                Image.fromarray(rng.integers(0, 256, (180, 260, 4), dtype=np.uint8), mode="RGBA")):
        ref = hf(images=[img], return_tensors="np")
        np.testing.assert_array_equal(preprocess_qwen_image(img, QwenImageSettings()).pixel_values,
                                      ref["pixel_values"])


@pytest.mark.parametrize("wh", [(1008, 1008), (1008, 672), (336, 588)])
def test_fixed_size_equals_hf_on_the_resized_image(wh):
    """image_size=(W, H) == HF's processor fed the image already resized to W x H (a fixed point of its rule)."""
    w, h = wh
    rng = np.random.default_rng(3)
    img = Image.fromarray(rng.integers(0, 256, (517, 733, 3), dtype=np.uint8))
    s = QwenImageSettings(max_pixels=28 * 28 * 16384)
    ours = preprocess_qwen_image(img, s, image_size=(w, h))
    hf = _hf(size={"shortest_edge": s.min_pixels, "longest_edge": s.max_pixels})
    ref = hf(images=[img.resize((w, h), resample=Image.BICUBIC)], return_tensors="np")
    assert ours.grid_thw == (1, h // 14, w // 14) == tuple(ref["image_grid_thw"][0].tolist())
    assert ours.resized == (h, w) and ours.original == (517, 733)
    np.testing.assert_array_equal(ours.pixel_values, ref["pixel_values"])


def test_paper_resolution_has_1296_tokens():
    s = QwenImageSettings(max_pixels=28 * 28 * 16384)
    img = Image.new("RGB", (640, 480), (10, 20, 30))
    assert preprocess_qwen_image(img, s, image_size=(1008, 1008)).num_visual_tokens == 1296


@pytest.mark.parametrize("bad,msg", [
    ((1000, 1008), "multiples of 28"), ((0, 28), "multiples of 28"), ((28, 28), "outside the checkpoint's limits"),
    ((28 * 200, 28 * 200), "outside the checkpoint's limits"), ("1008x1008", "(width, height)"),
    ((1008.5, 1008), "(width, height)"),
])
def test_bad_image_size_is_one_clear_line(bad, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")) as exc:
        check_image_size(bad, QwenImageSettings())
    assert "\n" not in str(exc.value)
