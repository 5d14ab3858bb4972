"""The tiny Qwen2.5-VL fixture has the properties the parity tests rely on; the CLI writes Qwen presets."""

import json

import pytest

from coverpruner.families import family_for_model_type, resolve_alias


def test_tiny_fixture_properties(qwen_hf, qwen_checkpoint):
    cfg = qwen_hf.config
    t, v = cfg.text_config, cfg.vision_config
    assert t.num_attention_heads == 2 * t.num_key_value_heads  # GQA
    attn = qwen_hf.model.language_model.layers[0].self_attn
    assert all(getattr(attn, p).bias is not None and float(getattr(attn, p).bias.detach().abs().max()) > 0
               for p in ("q_proj", "k_proj", "v_proj"))
    assert t.rope_parameters["mrope_section"] == [2, 3, 3] and sum([2, 3, 3]) * 2 == attn.head_dim
    assert v.window_size // (v.spatial_merge_size * v.patch_size) == 3 and list(v.fullatt_block_indexes) == [1, 3]
    gen = json.loads((qwen_checkpoint / "generation_config.json").read_text())
    assert gen["repetition_penalty"] == 1.05  # as published; the runtime decodes greedily without it
    tok = json.loads((qwen_checkpoint / "tokenizer.json").read_text())
    added = {a["content"] for a in tok["added_tokens"]}
    assert {"<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|im_start|>", "<|im_end|>"} <= added


def test_family_registry_and_aliases():
    fam = family_for_model_type("qwen2_5_vl")
    assert fam.name == "qwen2_5_vl"
    assert resolve_alias("qwen2.5-vl-7b") == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert resolve_alias("qwen2.5-vl-3b") == "Qwen/Qwen2.5-VL-3B-Instruct"


@pytest.mark.slow
def test_make_checkpoint_cli_writes_qwen(tmp_path, capsys):
    from coverpruner.testing.cli import main

    assert main(["--preset", "qwen2.5-vl-tiny", "--layers", "1", "--output", str(tmp_path / "q")]) == 0
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    assert cfg["model_type"] == "qwen2_5_vl" and cfg["text_config"]["num_hidden_layers"] == 1
    assert (tmp_path / "q" / "chat_template.jinja").is_file()
