"""Prompt layout == HF's Qwen2_5_VLProcessor; native 3-D positions == HF get_rope_index; decode positions."""

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from coverpruner.families.qwen_vl import decode_position, native_positions
from tests.families.qwen2_5_vl.fixtures import our_request, sample_image
from tests.families.qwen2_5_vl.hf_qwen import hf_inputs

PROMPT = "What color is the bus on the left side of the street?"


@pytest.mark.parametrize("size", [(224, 224), (300, 250), (140, 420)])
def test_layout_and_positions_match_hf_processor(size, qwen_checkpoint, qwen_hf, qwen_export):
    image = sample_image(0, size)
    ref = hf_inputs(qwen_checkpoint, image, PROMPT)
    vision, layout, ours = our_request(qwen_export, image, PROMPT)
    np.testing.assert_array_equal(layout.input_ids, ref["input_ids"][0].numpy())
    np.testing.assert_array_equal(layout.visual_positions, np.flatnonzero(ref["mm_token_type_ids"][0].numpy() == 1))
    tok = Tokenizer.from_file(str(qwen_export / "tokenizer.json"))
    assert tok.decode(layout.input_ids[layout.instruction_positions].tolist()) == PROMPT
    np.testing.assert_array_equal(vision.feeds["pixel_values"], ref["pixel_values"].numpy())
    assert vision.facts["grid_thw"] == tuple(ref["image_grid_thw"][0].tolist())

    ref_pos, ref_delta = qwen_hf.model.get_rope_index(ref["input_ids"], ref["mm_token_type_ids"],
                                                      image_grid_thw=ref["image_grid_thw"])
    np.testing.assert_array_equal(ours, ref_pos[:, 0].numpy())
    # HF decodes the t-th new token at (L + t) + rope_delta in all three rows.
    length = layout.input_ids.size
    for t in (0, 1, 5):
        np.testing.assert_array_equal(decode_position(ours, t), [length + t + int(ref_delta[0, 0])] * 3)


def test_positions_two_images_and_text_between(qwen_hf):
    """Two image runs with text around them: positions == get_rope_index (rules, not just one layout)."""
    img_id = qwen_hf.config.image_token_id
    grids = [(1, 6, 10), (1, 8, 4)]
    ids = np.concatenate([[5, 6, 7], [img_id] * 15, [8, 9], [img_id] * 8, [10, 11, 12]]).astype(np.int64)
    tt = torch.from_numpy(ids)[None]
    ref, _ = qwen_hf.model.get_rope_index(tt, (tt == img_id).int(), image_grid_thw=torch.tensor(grids))
    np.testing.assert_array_equal(native_positions(ids, img_id, grids, 2), ref[:, 0].numpy())


def test_positions_reject_mismatched_runs():
    with pytest.raises(ValueError, match="does not match grid"):
        native_positions(np.array([1, 9, 9, 9, 2]), 9, [(1, 4, 4)], 2)
    with pytest.raises(ValueError, match="fewer runs"):
        native_positions(np.array([1, 9, 9, 9, 9, 2]), 9, [(1, 4, 4), (1, 4, 4)], 2)


@pytest.mark.parametrize("prompt,msg", [("look <|image_pad|>", "image token"), ("<|vision_start|>x", "image markers")])
def test_prompt_with_image_marker_is_rejected(qwen_export, prompt, msg):
    with pytest.raises(ValueError, match=msg):
        our_request(qwen_export, sample_image(0), prompt)
