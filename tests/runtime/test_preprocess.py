"""numpy/PIL preprocessing == transformers' PIL image processors (CLIP and LLaVA pad-to-square)."""

import numpy as np
import pytest
from PIL import Image

from coverpruner.runtime.errors import ImageError
from coverpruner.families.clip import ImageSettings, preprocess_image

from .bad_images import bad_images

transformers = pytest.importorskip("transformers")


def _images():
    rng = np.random.default_rng(0)
    yield "rgb_landscape", Image.fromarray(rng.integers(0, 256, (240, 400, 3), dtype=np.uint8))
    yield "rgb_portrait_odd", Image.fromarray(rng.integers(0, 256, (517, 301, 3), dtype=np.uint8))
    yield "small_needs_upscale", Image.fromarray(rng.integers(0, 256, (20, 33, 3), dtype=np.uint8))
    yield "exact_size", Image.fromarray(rng.integers(0, 256, (336, 336, 3), dtype=np.uint8))
    yield "grayscale", Image.fromarray(rng.integers(0, 256, (300, 200), dtype=np.uint8), mode="L")
    yield "rgba", Image.fromarray(rng.integers(0, 256, (180, 260, 4), dtype=np.uint8), mode="RGBA")
    pal = Image.fromarray(rng.integers(0, 256, (128, 96, 3), dtype=np.uint8)).convert("P")
    pal.info["transparency"] = 0
    yield "palette_transparency", pal


CONFIGS = {
    "clip336": dict(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}),
    "clip_nonsquare_crop": dict(size={"shortest_edge": 64}, crop_size={"height": 48, "width": 80}),
    "crop_bigger_than_resize": dict(size={"shortest_edge": 30}, crop_size={"height": 40, "width": 40}),
    "bilinear_tiny": dict(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}, resample=2,
                          image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]),
}


@pytest.mark.parametrize("cfg", sorted(CONFIGS))
def test_matches_hf_clip_pil_processor(cfg):
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    hf = CLIPImageProcessorPil(**CONFIGS[cfg])
    ours = ImageSettings.from_dict(hf.to_dict())
    for name, img in _images():
        want = hf(images=img, return_tensors="np")["pixel_values"]
        got = preprocess_image(img, ours)
        assert got.dtype == np.float32 and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=f"{cfg}/{name}")


def test_matches_hf_llava_pad_to_square():
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    hf = LlavaImageProcessorPil(do_pad=True, size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    ours = ImageSettings.from_dict(hf.to_dict())
    assert ours.do_pad
    for name, img in _images():
        want = hf(images=img, return_tensors="np")["pixel_values"]
        np.testing.assert_array_equal(preprocess_image(img, ours), want, err_msg=name)


def test_manifest_flat_processor_block_and_path_input(tmp_path):
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    flat = {"crop_size": 32, "shortest_edge": 32, "resample": 3, "do_center_crop": True, "do_resize": True,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
            "do_convert_rgb": True}
    hf = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (50, 70, 3), dtype=np.uint8))
    path = tmp_path / "x.png"
    img.save(path)
    got = preprocess_image(path, ImageSettings.from_dict(flat))
    np.testing.assert_array_equal(got, hf(images=img, return_tensors="np")["pixel_values"])


def test_missing_and_corrupt_images(tmp_path):
    s = ImageSettings()
    with pytest.raises(ImageError, match="image not found"):
        preprocess_image(tmp_path / "nope.png", s)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image at all")
    with pytest.raises(ImageError, match="cannot read image"):
        preprocess_image(bad, s)
    good = tmp_path / "trunc.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(good)
    data = good.read_bytes()
    good.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError, match="cannot read image"):
        preprocess_image(good, s)


@pytest.mark.parametrize("name", sorted(bad_images()))
def test_oversized_and_malformed_files_are_one_clear_image_error(tmp_path, name):
    data, expect = bad_images()[name]
    path = tmp_path / f"{name}.png"
    path.write_bytes(data)
    with pytest.raises(ImageError) as info:
        preprocess_image(path, ImageSettings())
    msg = str(info.value)
    assert expect in msg and str(path) in msg and "\n" not in msg, msg
