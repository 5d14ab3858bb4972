"""`coverpruner-export --model qwen3-vl-8b` (issue 27): the alias resolves to Qwen/Qwen3-VL-8B-Instruct in the
Hugging Face cache and exports from there; absent, the CLI exits 2 saying what to download, writing nothing."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

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


def test_alias_resolves_from_the_hf_cache_and_exports(qwen3_checkpoint, tmp_path, monkeypatch, capsys):
    """A cached snapshot under the 8B's repo id (here the tiny checkpoint's files) is what --model qwen3-vl-8b
    exports: the family is detected from the snapshot's config (Qwen3VLForConditionalGeneration)."""
    from huggingface_hub import constants

    from coverpruner.export.cli import main

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
    out = tmp_path / "eng"
    assert main(["--model", "qwen3-vl-8b", "--output", str(out), "--graphs", "embed", "--no-progress"]) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["family"] == "qwen3_vl" and man["source_model"] == REPO_ID and list(man["graphs"]) == ["embed"]
    assert man["processor"]["video"]["max_pixels"] == man["processor"]["max_pixels"]  # no video config: the image one
