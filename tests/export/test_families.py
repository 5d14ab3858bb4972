"""Family registry and the LLaVA layout rules (torch-free) against the HF processor."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coverpruner.families import family_for_model_type, family_names, get_family, resolve_alias
from coverpruner.families.hf import (
    OffsetIndex,
    instruction_positions_from_offsets,
    render_chat_template,
    render_conversation,
    tokenize_conversation,
)
from coverpruner.families.contract import ConversationLayout, Family, FamilyRuntime
from tests.families.llava.fixtures import PROMPT, family_runtime


def test_family_modules_import_without_torch():
    code = ("import sys; import coverpruner.families as f; from coverpruner.families.hf import render_conversation; "
            "[f.get_family(n) for n in f.family_names()]; f.request_options(); "
            "render_conversation('USER: <image>\\n{{ messages[0][\"content\"][1][\"text\"] }} ASSISTANT:', "
            "[{'role': 'user', 'content': [{'type': 'image'}, {'type': 'text', 'text': 'hi'}]}], '<image>', [3]); "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_registry_lookups_and_errors():
    assert get_family("llava") is family_for_model_type("llava")
    assert resolve_alias("llava-1.5-7b") == "llava-hf/llava-1.5-7b-hf"
    assert resolve_alias("llava-1.5-13b") == "llava-hf/llava-1.5-13b-hf"
    assert resolve_alias("someone/model") == "someone/model"
    # every package under coverpruner/families/ (tests/test_family_discovery.py checks that set), sorted
    with pytest.raises(KeyError, match=re.escape(f"known families: {family_names()}")):
        get_family("nope")
    assert {"gemma3", "llava", "llava_next", "qwen2_5_vl", "qwen3_5", "qwen3_vl"} <= set(family_names())
    with pytest.raises(KeyError, match="model_type 'bert' is not supported"):
        family_for_model_type("bert")


def test_chat_template_rendering_matches_transformers(hf_processor, tiny_checkpoint):
    """Our jinja2 rendering (incl. the {% generation %} tag) equals transformers' apply_chat_template."""
    fam = get_family("llava")
    tpl = fam.chat_template(tiny_checkpoint)
    assert "{% generation %}" in tpl
    conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A red bus."}]},
            {"role": "user", "content": [{"type": "text", "text": "And the sky?"}]}]
    for add in (True, False):
        assert render_chat_template(tpl, conv, add) == hf_processor.apply_chat_template(conv,
                                                                                        add_generation_prompt=add)


def test_instruction_positions_are_exactly_the_prompt_tokens(request_inputs, hf_processor):
    """Tokens at instruction positions decode to the prompt; none is visual or template text."""
    ins = request_inputs.instruction_positions
    assert np.all(np.diff(ins) == 1)  # one contiguous run after the image
    assert ins[0] > request_inputs.visual_positions[-1]
    text = hf_processor.tokenizer.decode(request_inputs.input_ids[0, ins])
    assert text.strip() == PROMPT
    before = hf_processor.tokenizer.decode(request_inputs.input_ids[0, ins[0] - 1:ins[0]])
    after = hf_processor.tokenizer.decode(request_inputs.input_ids[0, ins[-1] + 1:])
    assert before == "\n" and "ASSISTANT" in after


def test_offset_overlap_rule():
    offsets = [(0, 0), (0, 4), (4, 5), (5, 9), (9, 12), (12, 12)]
    np.testing.assert_array_equal(instruction_positions_from_offsets(offsets, (4, 9)), [2, 3])
    np.testing.assert_array_equal(instruction_positions_from_offsets(offsets, (3, 10)), [1, 2, 3, 4])


def _literal_overlap(offsets, spans):
    """The design rule read literally: token i counts when its offsets are non-empty and overlap some span."""
    return [i for i, (a, b) in enumerate(offsets) if b > a and any(a < e and b > s for s, e in spans)]


@pytest.mark.parametrize("monotone", [True, False])
def test_offset_index_equals_the_literal_rule(monotone):
    """OffsetIndex finds the same tokens as the literal scan, for many spans at once, with empty tokens
    (special tokens' (0, 0), zero-width pieces) mixed in; unordered offsets take its scanning branch."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        widths = rng.integers(0, 4, size=40)  # 0: an empty token
        ends = np.cumsum(widths)
        offsets = [(int(e - w), int(e)) for e, w in zip(ends, widths)]
        offsets[0] = (0, 0)
        if not monotone:
            perm = rng.permutation(len(offsets))
            offsets = [offsets[i] for i in perm]
        top = int(ends[-1]) + 2
        spans = [tuple(sorted(int(x) for x in rng.integers(0, top, size=2))) for _ in range(int(rng.integers(0, 6)))]
        got = OffsetIndex(offsets).overlapping(spans)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, _literal_overlap(offsets, spans))


def test_layout_errors_are_clear(tiny_checkpoint):
    from tokenizers import Tokenizer

    fam = get_family("llava")
    tpl = fam.chat_template(tiny_checkpoint)
    tok = Tokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))
    def turn(prompt):
        return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]

    with pytest.raises(ValueError, match="must not contain the image token"):
        family_runtime(tiny_checkpoint).conversation_layout(tok, turn("look at <image>"), [144])
    rendered = render_conversation(tpl, turn("hello"), "<image>", [10])
    with pytest.raises(ValueError, match="has 10 image tokens .* expected 144"):
        tokenize_conversation(tok, rendered, turn("hello"), tok.token_to_id("<image>"), [144])
    with pytest.raises(FileNotFoundError, match="no chat template found"):
        fam.chat_template(tiny_checkpoint / "missing")


def test_processor_settings_match_hf_image_processor(hf_processor, tiny_checkpoint):
    s = get_family("llava").processor_settings(tiny_checkpoint)
    ip = hf_processor.image_processor
    assert s["crop_size"] == ip.crop_size["height"] and s["shortest_edge"] == ip.size["shortest_edge"]
    assert s["image_mean"] == pytest.approx(list(ip.image_mean)) and s["image_std"] == pytest.approx(list(ip.image_std))
    assert s["rescale_factor"] == pytest.approx(ip.rescale_factor)


def test_compact_positions(tiny_checkpoint):
    """LLaVA: native 0..L-1, a pruned sequence re-packed 0..L'-1, the t-th generated token at L' + t."""
    rt = family_runtime(tiny_checkpoint)
    layout = ConversationLayout(np.arange(10, 19), (np.arange(2, 6),), np.array([0]), (np.array([7]),), np.array([7]))
    native = rt.native_positions(layout, None)
    np.testing.assert_array_equal(native, [np.arange(9)])
    pruned = rt.pruned_positions(native, np.array([0, 1, 3, 6, 7, 8]))
    np.testing.assert_array_equal(pruned, [[0, 1, 2, 3, 4, 5]])
    assert rt.decode_position(native, pruned, 0).tolist() == [6]
    assert rt.decode_position(native, pruned, 3).tolist() == [9]
    assert rt.position_rank == 1 and isinstance(rt, FamilyRuntime) and isinstance(get_family("llava"), Family)


def test_manifest_fields_of_llava(tiny_checkpoint):
    from transformers import AutoConfig

    fields = get_family("llava").manifest_fields(AutoConfig.from_pretrained(str(tiny_checkpoint)), tiny_checkpoint)
    assert fields["visual"] == {"max_visual_tokens": 144, "position_rank": 1, "position_mode": "compact"}
    assert fields["options"] == {} and fields["axes"] == {} and get_family("llava").request_options == ()


@pytest.mark.parametrize("size", [(200, 240), (500, 120), (60, 90)])
def test_llava_prepare_image_equals_hf_and_gives_crop_geometry(hf_processor, tiny_checkpoint, size):
    """pixel_values as the HF processor's; the panel's box is the center crop in original-image pixels."""
    from tests.families.llava.fixtures import sample_image

    image = sample_image(seed=1, size=size)
    vision = family_runtime(tiny_checkpoint).prepare_image(image, {})
    want = hf_processor.image_processor(images=image, return_tensors="np")["pixel_values"]
    np.testing.assert_array_equal(vision.feeds["pixel_values"], want)
    assert vision.num_candidates == 144
    (panel,) = vision.panels
    assert panel.shape == (12, 12) and panel.cells.tolist() == list(range(144))
    h, w = size
    s = min(h, w)  # shortest edge -> 168, then a 168 x 168 center crop: a centred s x s square of the original
    left, top = (w - s) / 2, (h - s) / 2
    np.testing.assert_allclose(panel.box, (left, top, left + s, top + s), atol=w / 168 + h / 168)


@pytest.mark.parametrize("name", family_names())
def test_every_registered_family_meets_the_contract(name):
    """Each adapter has every Family member; its request options are valid Python keywords with a default
    that validates (the Pipeline falls back to it)."""
    fam = get_family(name)
    assert isinstance(fam, Family) and fam.name == name
    for opt in fam.request_options:
        assert opt.name.isidentifier() and opt.validate(opt.default) == opt.default


def test_crop_box_with_pad_to_square():
    """do_pad (LLaVA's 'pad' aspect mode): a 200 x 100 image is padded to a 200 x 200 square (50 px above and
    below), resized to 168 and kept whole, so the grid covers y -50..150 of the original."""
    from coverpruner.families.clip import crop_box
    from coverpruner.families.clip import ImageSettings

    s = ImageSettings(shortest_edge=168, crop_height=168, crop_width=168, do_pad=True)
    np.testing.assert_allclose(crop_box(200, 100, s), (0, -50, 200, 150))
    np.testing.assert_allclose(crop_box(100, 200, s), (-50, 0, 150, 200))
