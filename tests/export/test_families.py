"""Family registry and the LLaVA layout rules (torch-free) against the HF processor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coverpruner.families import family_for_model_type, get_family, resolve_alias
from coverpruner.families.base import instruction_positions_from_offsets, render_chat_template
from tests.export.conftest import PROMPT


def test_family_modules_import_without_torch():
    code = ("import sys; import coverpruner.families as f; fam = f.get_family('llava'); "
            "fam.render_prompt('USER: <image>\\n{{ messages[0][\"content\"][1][\"text\"] }} ASSISTANT:', 'hi', 3); "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_registry_lookups_and_errors():
    assert get_family("llava") is family_for_model_type("llava")
    assert resolve_alias("llava-1.5-7b") == "llava-hf/llava-1.5-7b-hf"
    assert resolve_alias("llava-1.5-13b") == "llava-hf/llava-1.5-13b-hf"
    assert resolve_alias("someone/model") == "someone/model"
    with pytest.raises(KeyError, match="known families: \\['llava', 'llava_next'\\]"):
        get_family("nope")
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


def test_layout_errors_are_clear(tiny_checkpoint):
    from tokenizers import Tokenizer

    fam = get_family("llava")
    tpl = fam.chat_template(tiny_checkpoint)
    with pytest.raises(ValueError, match="must not contain the image token"):
        fam.render_prompt(tpl, "look at <image>", 144)
    tok = Tokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))
    rendered = fam.render_prompt(tpl, "hello", 10)
    with pytest.raises(ValueError, match="has 10 image tokens .* expected 144"):
        fam.native_layout(tok, rendered, tok.token_to_id("<image>"), 144)
    with pytest.raises(FileNotFoundError, match="no chat template found"):
        fam.chat_template(tiny_checkpoint / "missing")


def test_processor_settings_match_hf_image_processor(hf_processor, tiny_checkpoint):
    s = get_family("llava").processor_settings(tiny_checkpoint)
    ip = hf_processor.image_processor
    assert s["crop_size"] == ip.crop_size["height"] and s["shortest_edge"] == ip.size["shortest_edge"]
    assert s["image_mean"] == pytest.approx(list(ip.image_mean)) and s["image_std"] == pytest.approx(list(ip.image_std))
    assert s["rescale_factor"] == pytest.approx(ip.rescale_factor)


def test_compact_positions():
    np.testing.assert_array_equal(get_family("llava").pruned_position_ids(5), [[0, 1, 2, 3, 4]])
