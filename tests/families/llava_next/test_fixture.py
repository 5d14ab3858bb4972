"""The LLaVA-NeXT checkpoint presets (configs only for the 7B widths: no weights are written)."""

from __future__ import annotations

import pytest

from coverpruner.families import get_family
from coverpruner.testing.cli import main
from coverpruner.testing.llava_next_checkpoints import build_next_config


def test_tiny_fixture_is_gqa_with_non_square_grids(next_checkpoint):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(next_checkpoint))
    assert cfg.model_type == "llava_next"
    assert cfg.text_config.num_key_value_heads < cfg.text_config.num_attention_heads
    assert [84, 168] in cfg.image_grid_pinpoints and [252, 84] in cfg.image_grid_pinpoints
    fam = get_family("llava_next")
    s = fam.anyres(cfg)
    assert s.max_tiles == 5 and s.max_rows == 36 + 12 * 13 and fam.num_visual_tokens(cfg) == 36 + 144


def test_shape_real_7b_preset_has_vicuna_and_clip_l336_widths():
    cfg = build_next_config("llava-next-7b", image_token_id=1000, pad_token_id=1001, tokenizer_size=1002,
                            layers=2, vision_layers=4)
    t, v = cfg.text_config, cfg.vision_config
    assert (t.hidden_size, t.num_attention_heads, t.intermediate_size, t.vocab_size, t.num_hidden_layers) == \
        (4096, 32, 11008, 32064, 2)
    assert (v.hidden_size, v.image_size, v.patch_size, v.num_hidden_layers) == (1024, 336, 14, 4)
    assert [672, 672] in cfg.image_grid_pinpoints
    fam = get_family("llava_next")
    assert fam.num_visual_tokens(cfg) == 2880 and fam.anyres(cfg).max_rows == 576 + 48 * 49  # 2,928 rows


def test_cli_rejects_bad_layer_counts_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--preset", "tiny", "--vision-layers", "2", "--output", str(tmp_path / "x")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--vision-layers is only supported for the LLaVA-NeXT presets" in err
    with pytest.raises(SystemExit) as exc:
        main(["--preset", "llava-next-tiny", "--layers", "0", "--output", str(tmp_path / "y")])
    assert exc.value.code == 2 and "--layers must be >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
