"""Qwen3.5's conversation layout == HF's processor (Qwen3VLProcessor with the checkpoint's chat template), token for
token, with what the template does to the text: content trimmed, an earlier answer's reasoning dropped, the
generation prompt opening <think>; the turn boundary (ConversationLayout.turn_end) is where the generation prompt
starts; positions == HF's get_rope_index over two images."""

from __future__ import annotations

import numpy as np
import pytest


def _hf_ids(ckpt, messages, images):
    from tests.families.qwen3_vl.hf_qwen3 import hf_processor

    proc = hf_processor(ckpt)
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return proc(images=images or None, text=[text], return_tensors="pt"), text


def test_layout_and_positions_equal_hf(qwen35_export, qwen35_checkpoint, qwen35_hf):
    from tokenizers import Tokenizer

    from coverpruner.engine_dir import load_manifest
    from coverpruner.families import get_family
    from tests.families.qwen_common import sample_image

    images = [sample_image(1, (200, 240)), sample_image(2, (300, 140))]
    reasoning = "<think>\nthe sign is red\n</think>\n\n  It says STOP.  "
    messages = [{"role": "system", "content": [{"type": "text", "text": " Be brief. "}]},
                {"role": "user",
                 "content": [{"type": "image"}, {"type": "text", "text": "  What does the sign say?\n"}]},
                {"role": "assistant", "content": [{"type": "text", "text": reasoning}]},
                {"role": "user", "content": [{"type": "text", "text": "And here? "}, {"type": "image"}]}]
    inputs, text = _hf_ids(qwen35_checkpoint, messages, images)
    assert "the sign is red" not in text and text.endswith("<|im_start|>assistant\n<think>\n")
    rt = get_family("qwen3_5").runtime(load_manifest(qwen35_export))
    visions = [rt.prepare_image(img, {}) for img in images]
    tokenizer = Tokenizer.from_file(str(qwen35_export / "tokenizer.json"))
    layout = rt.conversation_layout(tokenizer, messages, [v.num_candidates for v in visions])
    assert layout.input_ids.tolist() == inputs["input_ids"][0].tolist()
    ids = layout.input_ids.tolist()
    assert tokenizer.decode(ids[layout.turn_end:], skip_special_tokens=False) == "<|im_start|>assistant\n<think>\n"
    assert tokenizer.decode(ids[:layout.turn_end], skip_special_tokens=False).endswith("<|vision_end|><|im_end|>\n")
    positions, _ = qwen35_hf.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                                   image_grid_thw=inputs["image_grid_thw"])
    np.testing.assert_array_equal(rt.native_positions(layout, visions), positions[:, 0].numpy())


@pytest.mark.parametrize("size", [(300, 250), (140, 420), (224, 224)])
def test_preprocessing_equals_hf(qwen35_export, qwen35_checkpoint, size):
    """Patches and grid == HF's image processor (Qwen2VLImageProcessor with the checkpoint's 16-px patches and 0.5
    mean / std), pixel for pixel."""
    from coverpruner.engine_dir import load_manifest
    from coverpruner.families import get_family
    from tests.families.qwen3_vl.hf_qwen3 import hf_processor
    from tests.families.qwen_common import sample_image

    image = sample_image(4, size)
    want = hf_processor(qwen35_checkpoint).image_processor(images=[image], return_tensors="np")
    got = get_family("qwen3_5").runtime(load_manifest(qwen35_export)).prepare_image(image, {})
    assert list(got.facts["grid_thw"]) == want["image_grid_thw"][0].tolist()
    np.testing.assert_array_equal(got.feeds["pixel_values"], want["pixel_values"])
