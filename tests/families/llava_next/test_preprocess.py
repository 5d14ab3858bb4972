"""LLaVA-NeXT preprocessing and prompt layout (numpy/PIL) against transformers' processor (PIL backend)."""

from __future__ import annotations

import numpy as np
import pytest

from coverpruner.families import get_family, resolve_alias
from coverpruner.families.hf import render_conversation, tokenize_conversation
from coverpruner.families.llava_next.anyres import AnyresSettings, geometry, prepare_tiles
from coverpruner.runtime.errors import ImageError, ManifestError
from tests.families.llava_next.fixtures import IMAGE_SIZES, smooth_image

PROMPT = "What is on the left of the picture?"


def test_processor_is_the_pil_backend(next_processor):
    # The class this module promises to equal; without torchvision transformers picks it on its own.
    assert type(next_processor.image_processor).__name__ == "LlavaNextImageProcessorPil"


@pytest.mark.parametrize("size", IMAGE_SIZES, ids=[f"{w}x{h}" for w, h in IMAGE_SIZES])
def test_tiles_equal_hf_pixel_values(next_processor, next_settings, size):
    w, h = size
    img = smooth_image(w, h, seed=w + h)
    ref = next_processor.image_processor(img, return_tensors="np")
    got, geo = prepare_tiles(img, next_settings)
    assert tuple(ref["image_sizes"][0]) == geo.image_size == (h, w)
    # HF pads the tile axis with zero tiles up to the batch maximum; one image -> no padding.
    np.testing.assert_array_equal(got, ref["pixel_values"][0])
    assert got.dtype == np.float32 and got.shape[0] == geo.num_tiles


@pytest.mark.parametrize("size", IMAGE_SIZES, ids=[f"{w}x{h}" for w, h in IMAGE_SIZES])
def test_prompt_layout_equals_hf_processor(next_checkpoint, next_processor, next_settings, size):
    """Image token count (rows of the packed span) and every id equal LlavaNextProcessor's."""
    from tokenizers import Tokenizer

    fam = get_family("llava_next")
    w, h = size
    img = smooth_image(w, h)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    text = next_processor.apply_chat_template(messages, add_generation_prompt=True)
    ids = next_processor(images=img, text=text, return_tensors="np")["input_ids"][0]
    geo = geometry(h, w, next_settings)
    # the runtime's layout: LLaVA's template rules with <image> expanded to the span's rows
    rendered = render_conversation(fam.chat_template(next_checkpoint), messages, "<image>", [geo.num_rows])
    tok = Tokenizer.from_file(str(next_checkpoint / "tokenizer.json"))
    layout = tokenize_conversation(tok, rendered, messages, next_processor.image_token_id, [geo.num_rows])
    np.testing.assert_array_equal(layout.input_ids, ids)
    assert tok.decode(layout.input_ids[layout.instruction_turn[0]].tolist()) == PROMPT


def test_extreme_aspect_ratio_keeps_only_the_base_image(next_settings):
    """10,000 x 50: the unpadded grid has zero rows (HF cuts them all); n = the base image's 36 rows."""
    geo = geometry(50, 10000, next_settings)
    assert geo.grid == (1, 3) and geo.grid_shape[0] == 0
    assert geo.num_candidates == geo.num_rows == 36
    tall = geometry(10000, 50, next_settings)  # zero columns: 18 newline rows and no grid candidates
    assert tall.grid_shape == (18, 0) and tall.num_candidates == 36 and tall.num_rows == 54


def test_unpadding_keeps_hf_rounding_on_llava_v16_tiles():
    """420 (H) x 300 (W) on 336-px tiles: grid 2x1 (48 x 24 features); new_h = round(420*24/300) = 33 but HF
    cuts (48-33)//2 = 7 rows per side and keeps 34 rows, all 24 columns; plus 34 newline rows."""
    s = AnyresSettings(tile=336, patch=14, pinpoints=((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)))
    geo = geometry(420, 300, s)
    assert geo.grid == (2, 1) and geo.rows_kept == (7, 41) and geo.cols_kept == (0, 24)
    assert geo.num_candidates == 576 + 34 * 24 and geo.num_rows == 576 + 34 * 25
    full = geometry(672, 672, s)  # the benchmark's image: 2,880 candidates, 2,928 rows
    assert (full.num_candidates, full.num_rows, full.num_tiles) == (2880, 2928, 5)


def test_bad_images_and_settings_give_one_line_errors(next_settings, tmp_path):
    with pytest.raises(ImageError, match="image not found"):
        prepare_tiles(tmp_path / "missing.png", next_settings)
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(ImageError, match="cannot read image"):
        prepare_tiles(tmp_path / "bad.png", next_settings)
    with pytest.raises(ImageError, match="no pixels"):
        geometry(0, 10, next_settings)
    with pytest.raises(ManifestError, match="multiples of the tile 84"):
        AnyresSettings.from_dict({**next_settings.to_dict(), "image_grid_pinpoints": [[84, 100]]})
    with pytest.raises(ManifestError, match="missing or invalid field"):
        AnyresSettings.from_dict({"tile": 84})


def test_aliases_and_registry():
    fam = get_family("llava_next")
    assert resolve_alias("llava-next-7b") == "llava-hf/llava-v1.6-vicuna-7b-hf"
    assert resolve_alias("llava-next-13b") == "llava-hf/llava-v1.6-vicuna-13b-hf"
    from coverpruner.families import family_for_model_type

    assert family_for_model_type("llava_next") is fam
