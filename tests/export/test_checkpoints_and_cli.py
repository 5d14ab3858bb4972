"""Random checkpoint writer and the coverpruner-export CLI (missing weights, end to end)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coverpruner.export.cli import main as export_main
from coverpruner.testing.cli import main as make_checkpoint_main

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
    with pytest.raises(SystemExit) as exc:  # one line on stderr, exit code 2, nothing written
        make_checkpoint_main(["--layers", "0", "--output", str(tmp_path / "b")])
    assert exc.value.code == 2 and not (tmp_path / "b").exists()


def test_llava_7b_preset_has_the_real_widths():
    """The latency preset matches llava-hf/llava-1.5-7b-hf's shapes (config only; no weights written)."""
    from coverpruner.families import get_family
    from coverpruner.testing.llava_checkpoints import build_config

    cfg = build_config("llava-1.5-7b", image_token_id=32000, pad_token_id=32001, tokenizer_size=1002, layers=2)
    t, v = cfg.text_config, cfg.vision_config
    assert (t.hidden_size, t.num_attention_heads, t.num_key_value_heads, t.intermediate_size, t.vocab_size) == \
        (4096, 32, 32, 11008, 32064)
    assert t.num_hidden_layers == 2 and t.max_position_embeddings == 4096
    assert (v.hidden_size, v.num_hidden_layers, v.num_attention_heads, v.intermediate_size) == (1024, 24, 16, 4096)
    assert (v.image_size, v.patch_size, v.hidden_act) == (336, 14, "quick_gelu")
    assert get_family("llava").num_visual_tokens(cfg) == 576 == cfg.image_seq_length
    assert build_config("llava-1.5-7b", 32000, 32001, 1002).text_config.num_hidden_layers == 32


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


def _fake_hf_cache(cache: Path, repo_id: str, files: dict[str, Path | str]) -> Path:
    """The hub cache layout: models--org--name/{refs/main, snapshots/<commit>/...}. Returns the snapshot dir."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for name, src in files.items():
        (snap / name).write_bytes(src.read_bytes() if isinstance(src, Path) else src.encode())
    return snap


def test_resolve_alias_and_repo_id_from_hf_cache(tiny_checkpoint, tmp_path):
    from coverpruner.export.resolve import MissingModelError, resolve_model

    cache = tmp_path / "hub"
    files = {f.name: f for f in tiny_checkpoint.iterdir() if f.is_file()}
    snap = _fake_hf_cache(cache, "llava-hf/llava-1.5-7b-hf", files)
    assert resolve_model("llava-1.5-7b", cache_dir=str(cache)) == (snap, "llava-hf/llava-1.5-7b-hf")
    assert resolve_model("llava-hf/llava-1.5-7b-hf", cache_dir=str(cache))[0] == snap

    # A snapshot with the config but a missing weight shard is reported, not half-exported.
    index = '{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}'
    _fake_hf_cache(cache, "llava-hf/llava-1.5-13b-hf", {"config.json": "{}", "model.safetensors.index.json": index,
                                                        "model-00001-of-00002.safetensors": "x"})
    with pytest.raises(MissingModelError, match=r"(?s)llava-1.5-13b-hf.*incomplete.*model-00002-of-00002.*"
                                                r"huggingface-cli download llava-hf/llava-1.5-13b-hf"):
        resolve_model("llava-1.5-13b", cache_dir=str(cache))


def test_bad_cli_arguments_exit_2(tiny_checkpoint, tmp_path):
    with pytest.raises(SystemExit) as exc:
        export_main(["--model", str(tiny_checkpoint), "--output", str(tmp_path), "--graphs", "vision,foo"])
    assert exc.value.code == 2
    assert export_main(["--model", str(tiny_checkpoint), "--output", str(tmp_path), "--opset", "16"]) == 2


def test_option_defaults_are_checked_then_recorded(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """--option NAME=VALUE: refused in one line before anything is written when the family lacks the option or
    the value; otherwise recorded as the manifest's default (a test family with a `mirror` option)."""
    import coverpruner.families as families

    out = tmp_path / "eng"
    assert export_main(["--model", str(tiny_checkpoint), "--output", str(out), "--graphs", "embed", "--no-progress",
                        "--option", "newline_policy=keep"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["coverpruner-export: --option: model family 'llava' has no option(s) ['newline_policy']; it "
                   "takes none"]
    assert not out.exists()

    monkeypatch.setitem(families.FAMILIES, "llava_mirror", families.FamilyEntry("tests.runtime.test_family_options:MirrorFamily", ("llava",)))
    monkeypatch.setitem(families.FAMILIES, "llava", families.FAMILIES["llava_mirror"])
    families.get_family.cache_clear()
    try:
        assert export_main(["--model", str(tiny_checkpoint), "--output", str(out), "--graphs", "embed",
                            "--no-progress", "--option", "mirror=maybe"]) == 2
        assert "--option: mirror must be one of ['no', 'yes'], got 'maybe'" in capsys.readouterr().err
        assert export_main(["--model", str(tiny_checkpoint), "--output", str(out), "--graphs", "embed",
                            "--no-progress", "--option", "mirror=yes"]) == 0
        man = json.loads((out / "manifest.json").read_text())
        assert man["family"] == "llava_mirror" and man["options"] == {"mirror": "yes"}
    finally:
        families.get_family.cache_clear()


def test_progress_in_a_log_is_a_line_per_stage(tiny_checkpoint, tmp_path, capsys):
    """Issue 40: export's bar, refreshed every second, wrote one endless line of carriage-return redraws into a
    non-terminal log (transformers' "Loading weights" bar too). Into a pipe (capsys: not a TTY) each stage is one
    plain line."""
    out = tmp_path / "eng"
    assert export_main(["--model", str(tiny_checkpoint), "--output", str(out), "--graphs", "embed,probe"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err, err[:300]
    lines = err.strip().splitlines()
    assert [ln.split(" (")[0] for ln in lines] == ["export: load model: stage 1/4", "export: embed: stage 2/4",
                                                   "export: probe: stage 3/4", "export: manifest: stage 4/4",
                                                   "export: done, 4/4 stages"], lines


def test_stage_bar_is_tqdm_on_a_terminal():
    import io

    from coverpruner.progress import StageLines, stage_bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert not isinstance(stage_bar(3, "x", file=Terminal()), StageLines)
    assert isinstance(stage_bar(3, "x", file=io.StringIO()), StageLines)
    assert stage_bar(3, "x", enabled=False, file=io.StringIO()).disable
