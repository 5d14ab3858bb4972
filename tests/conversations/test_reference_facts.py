"""Facts about transformers' processors, chat templates and positions that the conversation layout (family
contract v3) must reproduce; each one checked here so a transformers upgrade that changes it is seen.
docs/conversations.md cites the source lines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conversations import reference as R
from tests.conversations.conversations import CONVERSATIONS, SIZES, image


pytestmark = pytest.mark.slow  # runs the tiny HF processors and models

@pytest.mark.parametrize("fam_name", ["llava", "llava_next"])
def test_llava_template_facts(hf_family, fam_name):
    """llava-hf's template: a bare string content renders nothing (so it is normalised to a text part), a system
    message has no role prefix, a message's images come first whatever their order among its parts, and an
    image_url part is an image (transformers rewrites it to {"type": "image", "url": ...} before rendering)."""
    proc = hf_family(fam_name).processor
    bare = proc.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
                                    add_generation_prompt=True)
    assert bare == "USER: ASSISTANT:"
    parts = [{"role": "system", "content": [{"type": "text", "text": "S"}]},
             {"role": "user", "content": [{"type": "text", "text": "Q"}, {"type": "image"}]},
             {"role": "assistant", "content": [{"type": "text", "text": "A"}]}]
    assert proc.apply_chat_template(parts, add_generation_prompt=True) == "S USER: <image>\nQ ASSISTANT: A ASSISTANT:"
    url = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}},
                                        {"type": "text", "text": "Q"}]}]
    # the template itself selects only type == "image"; the processor rewrites image_url parts into those first
    assert proc.apply_chat_template(url, add_generation_prompt=True) == "USER: <image>\nQ ASSISTANT:"


def test_qwen_template_facts(hf_family):
    """Qwen2.5-VL's template: a default system prompt when the first message is not a system one, string content
    as is, images in part order as <|vision_start|><|image_pad|><|vision_end|>."""
    proc = hf_family("qwen2_5_vl").processor
    text = proc.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "Q"}, {"type": "image"}]}], add_generation_prompt=True,
        tokenize=False)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                    "Q<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("fam_name", R.FAMILIES)
def test_span_rows_per_image(hf_family, fam_name):
    """S_j per image as the processor computes it: LLaVA a constant, NeXT from each image's own size (anyres
    grid, unpadding, newline rows), Qwen2.5-VL prod(grid_thw_j) / merge^2."""
    fam = hf_family(fam_name)
    nat = R.native(fam, CONVERSATIONS["three_images"]())
    sizes = [s.size for s in nat.spans]
    if fam_name == "llava":
        assert sizes == [144, 144, 144]
    elif fam_name == "llava_next":
        proc = fam.processor
        tile = nat.inputs["pixel_values"].shape[-1]
        want = [proc._get_number_of_features(h, w, tile, tile) - 1 for w, h in SIZES]  # -1: "default" drops CLS
        assert sizes == want and len(set(sizes)) > 1
    elif fam_name == "gemma3":  # a fixed number of soft tokens per image (pan-and-scan off)
        assert sizes == [fam.processor.image_seq_length] * 3 == [fam.model.config.mm_tokens_per_image] * 3
    else:
        merge = fam.processor.image_processor.merge_size
        assert sizes == [int(g.prod()) // merge ** 2 for g in nat.inputs["image_grid_thw"]] and len(set(sizes)) > 1


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_qwen_positions_follow_the_literal_rule(hf_family, conversation):
    """get_rope_index over several images == the rule written out in qwen_literal_positions (Qwen2.5-VL's
    conversation hooks, tests/families/qwen2_5_vl/conversation.py)."""
    fam = hf_family("qwen2_5_vl")
    nat = R.native(fam, CONVERSATIONS[conversation]())
    grids = [tuple(int(x) for x in g) for g in nat.inputs.get("image_grid_thw", [])]
    merge = fam.model.config.vision_config.spatial_merge_size
    literal = fam.hooks.qwen_literal_positions(nat.ids.tolist(), nat.spans, grids, merge)
    np.testing.assert_array_equal(nat.positions.numpy(), literal)
    if not grids:
        assert torch.equal(nat.positions, torch.arange(nat.ids.numel())[None].expand(3, -1))


def test_image_parts_in_every_form_load_the_same(hf_family, tmp_path):
    """{"type": "image"} with a PIL image, a path or a uint8 array, and {"type": "image_url"} with a data: URL or a
    local path: the same native ids and image rows."""
    from tests.conversations.conversations import data_url

    fam = hf_family("llava")
    img = image(0)
    path = tmp_path / "a.png"
    img.save(path)
    forms = [{"type": "image", "image": img}, {"type": "image", "image": str(path)},
             {"type": "image", "image": np.asarray(img)},
             {"type": "image_url", "image_url": {"url": data_url(img)}},
             {"type": "image_url", "image_url": {"url": str(path)}}]
    natives = [R.native(fam, [{"role": "user", "content": [part, {"type": "text", "text": "Q"}]}]) for part in forms]
    for nat in natives[1:]:
        assert torch.equal(nat.ids, natives[0].ids) and torch.equal(nat.embeds, natives[0].embeds)
