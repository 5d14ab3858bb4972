"""`coverpruner-export --model qwen3-vl-8b` (issue 27): the alias resolves to Qwen/Qwen3-VL-8B-Instruct in the
Hugging Face cache and the exporter gets that snapshot; absent, the CLI exits 2 saying what to download, writing
nothing. Cheap: no graph is exported here."""

from __future__ import annotations

import json

REPO_ID = "Qwen/Qwen3-VL-8B-Instruct"


def test_absent_weights_say_what_to_download(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    from coverpruner.export.cli import main

    cache = tmp_path / "empty_hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc = main(["--model", "qwen3-vl-8b", "--output", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert f"{REPO_ID!r} (from alias 'qwen3-vl-8b')" in err and f"huggingface-cli download {REPO_ID}" in err
    assert not (tmp_path / "out").exists()


def test_alias_resolves_from_the_hf_cache(qwen3_checkpoint, tmp_path, monkeypatch):
    """A cached snapshot under the 8B's repo id (here the tiny checkpoint's files) is what --model qwen3-vl-8b
    hands the exporter (export_model recorded, not run: exporting is the matrix's), with the repo id as the
    source; the family is the snapshot config's (Qwen3VLForConditionalGeneration)."""
    from huggingface_hub import constants

    from coverpruner.export import exporter
    from coverpruner.export.cli import main
    from coverpruner.families import family_for_model_type

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / ("models--" + REPO_ID.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for f in qwen3_checkpoint.iterdir():
        if f.is_file():
            (snap / f.name).symlink_to(f)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    calls = []

    def record(model_dir, output, source, opts):
        calls.append((model_dir, source, opts.dtype))
        raise exporter.TargetError("recorded")  # the CLI's one-line exit 2 path: nothing written

    monkeypatch.setattr(exporter, "export_model", record)
    assert main(["--model", "qwen3-vl-8b", "--output", str(tmp_path / "eng"), "--dtype", "fp16"]) == 2
    assert calls == [(snap, REPO_ID, "fp16")]
    config = json.loads((snap / "config.json").read_text())
    assert config["architectures"] == ["Qwen3VLForConditionalGeneration"]
    assert family_for_model_type(config["model_type"]).name == "qwen3_vl"
