"""Qwen3-VL preprocessing == transformers' image processor as the checkpoint configures it (16-px patches, merge 2,
0.5 mean/std), pixel for pixel; the layout and positions == HF's processor and get_rope_index."""

from __future__ import annotations

import json

import numpy as np
import pytest

# (H, W): a small image scaled up to min_pixels, odd sizes rounded to 32 px, a wide one, a large one scaled down
SIZES = [(40, 50), (300, 250), (140, 420), (900, 700)]


@pytest.mark.parametrize("size", SIZES)
def test_pixels_equal_hf_image_processor(qwen3_checkpoint, size):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from coverpruner.families.qwen3_preprocess import Qwen3ImageSettings
    from coverpruner.families.qwen_vl import preprocess_qwen_image
    from tests.families.qwen3_vl.fixtures import sample_image

    image = sample_image(2, size)
    hf = Qwen2VLImageProcessorPil.from_pretrained(str(qwen3_checkpoint))(images=[image], return_tensors="np")
    settings = Qwen3ImageSettings.from_dict(json.loads((qwen3_checkpoint / "preprocessor_config.json").read_text()))
    ours = preprocess_qwen_image(image, settings)
    assert ours.grid_thw == tuple(int(v) for v in hf["image_grid_thw"][0])
    np.testing.assert_array_equal(ours.pixel_values, hf["pixel_values"])
    h, w = ours.resized
    assert h % 32 == 0 and w % 32 == 0 and settings.min_pixels <= h * w <= settings.max_pixels
    assert ours.num_visual_tokens == h * w // (32 * 32)  # one visual token per 32x32 px


@pytest.mark.parametrize("size", [(300, 250), (140, 420)])
def test_layout_and_positions_equal_hf(qwen3_checkpoint, qwen3_hf, qwen3_export, size):
    import torch

    from tests.families.qwen3_vl.fixtures import our_request, sample_image
    from tests.families.qwen3_vl.hf_qwen3 import hf_inputs

    image, prompt = sample_image(4, size), "Which colour is the largest blob?"
    ref = hf_inputs(qwen3_checkpoint, image, prompt)
    vision, layout, positions = our_request(qwen3_export, image, prompt)
    assert layout.input_ids.tolist() == ref["input_ids"][0].tolist()
    with torch.no_grad():
        want, _ = qwen3_hf.model.get_rope_index(ref["input_ids"], ref["mm_token_type_ids"],
                                                image_grid_thw=ref["image_grid_thw"])
    np.testing.assert_array_equal(positions, want[:, 0].numpy())
    _, gh, gw = vision.facts["grid_thw"]  # the image spans max(gh, gw)/2 positions, not its n rows
    assert positions.max() == positions.shape[1] - vision.num_candidates + max(gh, gw) // 2 - 1


def test_chat_template_keeps_tools(qwen3_checkpoint):
    """The checkpoint's tool-capable template renders tools, tool calls and tool responses (HF's renderer)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen3_checkpoint))
    tools = [{"type": "function", "function": {"name": "zoom", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "zoom in"}]},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "zoom",
                                                                                  "arguments": {"x": 1}}}]},
                {"role": "tool", "content": "done"}]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert '"name": "zoom"' in text and '<tool_call>\n{"name": "zoom", "arguments": {"x": 1}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\ndone\n</tool_response><|im_end|>\n" in text
    assert "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>zoom in<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
