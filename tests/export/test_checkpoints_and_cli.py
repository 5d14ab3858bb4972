"""Random checkpoint writer and the coverpruner-export CLI (missing weights, end to end)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coverpruner.export.cli import main as export_main
from coverpruner.testing.checkpoints import main as make_checkpoint_main

REPO = Path(__file__).resolve().parents[2]


def test_tiny_checkpoint_is_a_real_hf_checkpoint(tiny_checkpoint, hf_model, hf_processor):
    cfg = hf_model.config
    assert cfg.text_config.num_key_value_heads < cfg.text_config.num_attention_heads  # GQA
    assert cfg.vision_feature_select_strategy == "default"
    n = (cfg.vision_config.image_size // cfg.vision_config.patch_size) ** 2
    assert n >= 100
    tok = hf_processor.tokenizer
    for special in ("<unk>", "<s>", "</s>", "<image>", "<pad>"):
        assert tok.convert_tokens_to_ids(special) != tok.unk_token_id or special == "<unk>"
    assert tok.convert_tokens_to_ids("<image>") == cfg.image_token_id
    assert len(tok) <= cfg.text_config.vocab_size
    assert 900 <= len(tok) <= 1100
    # Weights are random, not HF's init constants (norms 1, biases 0).
    norm = hf_model.model.language_model.layers[0].input_layernorm.weight
    assert norm.std() > 0.01


def test_make_checkpoint_cli_layers_and_seed(tmp_path):
    assert make_checkpoint_main(["--preset", "tiny", "--layers", "1", "--output", str(tmp_path / "a"),
                                 "--seed", "3"]) == 0
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["text_config"]["num_hidden_layers"] == 1
    with pytest.raises(ValueError, match="--layers must be >= 1"):
        make_checkpoint_main(["--layers", "0", "--output", str(tmp_path / "b")])


def _run_cli(args, env_extra):
    env = {**os.environ, **env_extra, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "coverpruner.export.cli", *args], capture_output=True, text=True,
                          env=env, cwd=REPO)


def test_missing_weights_message_and_exit_code(tmp_path):
    cache = tmp_path / "empty_hf_cache"
    cache.mkdir()
    proc = _run_cli(["--model", "llava-1.5-7b", "--output", str(tmp_path / "out")],
                    {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    err = proc.stderr
    assert "llava-hf/llava-1.5-7b-hf" in err and "llava-1.5-7b" in err
    assert "huggingface-cli download llava-hf/llava-1.5-7b-hf" in err
    assert str(cache) in err and "local checkpoint directory" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_incomplete_local_directory_is_reported(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    proc = _run_cli(["--model", str(d), "--output", str(tmp_path / "out")], {})
    assert proc.returncode == 2
    assert "no weights" in proc.stderr and str(d) in proc.stderr and "Traceback" not in proc.stderr


def test_cli_exports_from_local_directory(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "eng"
    rc = export_main(["--model", str(tiny_checkpoint), "--output", str(out), "--graphs", "embed",
                      "--no-progress"])
    assert rc == 0
    man = json.loads((out / "manifest.json").read_text())
    assert list(man["graphs"]) == ["embed"] and man["source_model"] == str(tiny_checkpoint)
    assert "wrote embed" in capsys.readouterr().out
