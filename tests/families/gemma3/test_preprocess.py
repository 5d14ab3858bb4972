"""Gemma 3's run-time rules against transformers' Gemma3Processor, without an engine dir: pixel_values bit-equal
(with and without pan-and-scan, landscape and portrait, at the activation boundary), the conversation layout token
for token (system turn, trimmed text parts, several images and turns, pan-and-scan crops) with the soft tokens where
the processor's token_type_ids mark them, and the blocks the image span gives the decoder (one per crop)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.families.gemma3 import hf_gemma3 as hf
from tests.families.llava.fixtures import family_runtime

pytest.importorskip("transformers", reason="the references are transformers' processor")


@pytest.fixture(scope="module")
def runtime(gemma3_checkpoint):
    return family_runtime(gemma3_checkpoint, "gemma3")


@pytest.fixture(scope="module")
def processor(gemma3_checkpoint):
    import transformers

    return transformers.AutoProcessor.from_pretrained(str(gemma3_checkpoint))


@pytest.fixture(scope="module")
def tokenizer(gemma3_checkpoint):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(gemma3_checkpoint / "tokenizer.json"))


def _image(h: int, w: int, seed: int = 0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


# (H, W), pan-and-scan, crops: landscape 3 crops; portrait 2; 1.2:1 just activates but its crops would be under the
# 256-px minimum; a square image never crops; RGBA (composited on white) without pan-and-scan
CASES = [((300, 800), True, 3), ((900, 400), True, 2), ((300, 360), True, 0), ((500, 500), True, 0),
         ((200, 240), False, 0)]


@pytest.mark.parametrize("size,pan,crops", CASES)
def test_pixels_equal_the_processor(runtime, processor, size, pan, crops):
    img = _image(*size)
    if not pan:
        img = img.convert("RGBA")
    vision = runtime.prepare_image(img, {"pan_and_scan": pan})
    want = processor.image_processor(img, return_tensors="np", **hf.processor_kwargs(processor, pan))
    assert vision.facts["crops"] == crops == int(want["num_crops"][0])
    assert vision.feeds["pixel_values"].dtype == np.float32
    np.testing.assert_array_equal(vision.feeds["pixel_values"], want["pixel_values"])  # bit-equal
    assert vision.num_candidates == 144 * (1 + crops) and len(vision.panels) == 1 + crops
    w, h = img.size
    boxes = [p.box for p in vision.panels]
    assert boxes[0] == (0.0, 0.0, float(w), float(h))
    if crops:  # the crops tile the image along its long side
        long = 2 if w >= h else 3
        assert boxes[1][long - 2] == 0 and boxes[-1][long] == (w if w >= h else h)


def test_pan_and_scan_option_parses_cli_values(runtime):
    from coverpruner.families.gemma3 import PAN_AND_SCAN_OPTION

    assert PAN_AND_SCAN_OPTION.validate("yes") is True and PAN_AND_SCAN_OPTION.validate("0") is False
    with pytest.raises(ValueError, match="pan_and_scan must be true or false, got 'maybe'"):
        PAN_AND_SCAN_OPTION.validate("maybe")


@pytest.mark.parametrize("pan", [False, True])
def test_layout_equals_the_processor(runtime, processor, tokenizer, pan):
    """system turn (kept as written), user text parts with surrounding spaces (the template trims them), an
    assistant turn, two images in two user turns, generation prompt; the processor's ids and token types."""
    a, b = _image(300, 800, 1), _image(240, 200, 2)
    messages = [{"role": "system", "content": [{"type": "text", "text": "Answer briefly. "}]},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  What is shown? "}]},
                {"role": "assistant", "content": [{"type": "text", "text": "A red house."}]},
                {"role": "user", "content": [{"type": "text", "text": "And in this one?"}, {"type": "image"}]}]
    visions = [runtime.prepare_image(img, {"pan_and_scan": pan}) for img in (a, b)]
    layout = runtime.conversation_layout(tokenizer, messages, [v.num_candidates for v in visions],
                                         [v.facts for v in visions])
    hf_messages = [{"role": m["role"], "content": [dict(p, image=img) if p["type"] == "image" else p
                                                   for p, img in zip(m["content"], _images_of(m, a, b))]}
                   for m in messages]
    want = processor.apply_chat_template(hf_messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                         return_tensors="np", processor_kwargs={"do_pan_and_scan": pan})
    assert layout.input_ids.tolist() == want["input_ids"][0].tolist()
    assert layout.input_ids[0] == tokenizer.token_to_id("<bos>") and layout.input_ids[1] != layout.input_ids[0]
    np.testing.assert_array_equal(layout.visual_positions, np.flatnonzero(want["token_type_ids"][0] == 1))
    decode = [tokenizer.decode(layout.input_ids[i].tolist()) for i in (*layout.instruction_turn,
                                                                      layout.instruction_latest)]
    assert decode == ["What is shown?", "And in this one?", "And in this one?"]


def _images_of(message, a, b):
    """The image each part of a test message stands for (a in the first user turn, b in the second)."""
    img = a if any(p.get("text", "").strip() == "What is shown?" for p in message["content"]) else b
    return [img] * len(message["content"])


def test_each_crop_is_one_block(runtime):
    """The decoder's blocks: crop k's soft tokens are block k (the rows one crop's kept tokens attend both ways);
    the budget is one number over every crop's candidates."""
    vision = runtime.prepare_image(_image(300, 800), {"pan_and_scan": True})
    feats = {"image_features": np.random.default_rng(0).standard_normal((4, 144, 64)).astype(np.float32)}
    span = runtime.image_span(feats, vision, {})
    np.testing.assert_array_equal(span.blocks, np.repeat(np.arange(4), 144))
    np.testing.assert_array_equal(span.candidates, np.arange(576))
    np.testing.assert_array_equal(span.rows[144:288], feats["image_features"][1])
    with pytest.raises(ValueError, match=r"expected \[4, 144, d\]"):
        runtime.image_span({"image_features": feats["image_features"][:3]}, vision, {})


def test_transformers_applies_no_softcapping(gemma3_hf):
    """Why the export declares no logit softcapping: Gemma3ForConditionalGeneration ignores both config values
    (attn_logit_softcapping never reaches its attention; final_logit_softcapping is Gemma3ForCausalLM's only), so
    logits with tiny caps equal those without."""
    import torch

    _, model = gemma3_hf
    ids = torch.tensor([[2, 5, 17, 265, 900, 1003]])
    text = model.config.text_config
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        saved = text.attn_logit_softcapping, text.final_logit_softcapping
        text.attn_logit_softcapping, text.final_logit_softcapping = 0.5, 0.5
        try:
            capped = model(input_ids=ids).logits
        finally:
            text.attn_logit_softcapping, text.final_logit_softcapping = saved
    assert plain.abs().max() > 1.0  # a cap of 0.5 would change these logits if it were applied
    torch.testing.assert_close(capped, plain, rtol=0, atol=0)
