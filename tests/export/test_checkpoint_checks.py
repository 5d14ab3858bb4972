"""Issue 40: export refuses (or picks the standard decoder form for) a checkpoint the runtime cannot run.

Tiny checkpoints of unusual widths exported "successfully" and then failed every request: head_dim 24 (ONNX
Runtime's GroupQueryAttention CPU kernel, the ORT-form decoder's attention, refuses head_size % 16 != 0) and an
mrope_section that does not sum to head_dim / 2 (the first text request was a 500). Now the default export picks
the standard form for the first (and the dir answers), an explicit --decoder-form ort is refused in one line, and
the inconsistent rotary sections are refused before anything is written, whatever the form.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from types import SimpleNamespace

import pytest

from coverpruner.export.checkpoint_checks import CheckpointError, check_dims, resolve_decoder_form
from coverpruner.export.cli import main as export_main

DIMS = {"head_dim": 16, "num_heads": 4, "num_kv_heads": 2}
PLAIN = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


@pytest.mark.parametrize("dims, config, message", [
    ({**DIMS, "head_dim": 15}, PLAIN, "head_dim 15 must be a positive even number"),
    ({**DIMS, "num_kv_heads": 3}, PLAIN, "num_attention_heads 4 must be a multiple of num_key_value_heads 3"),
    ({**DIMS, "mrope_section": [2, 3, 4]}, PLAIN, "mrope_section [2, 3, 4] must be three positive sizes summing to "
                                                  "head_dim / 2 = 8 (head_dim 16); got sum 9"),
    ({**DIMS, "mrope_section": [8, 0, 0]}, PLAIN, "three positive sizes"),
    (DIMS, SimpleNamespace(rope_parameters={"partial_rotary_factor": 1.5}), "partial_rotary_factor 1.5"),
])
def test_inconsistent_dims_are_refused(dims, config, message):
    with pytest.raises(CheckpointError, match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        check_dims(dims, config)


def test_consistent_dims_pass():
    check_dims({**DIMS, "mrope_section": [2, 3, 3]}, PLAIN)


@pytest.mark.parametrize("head_dim, config, dtype, want", [
    (16, PLAIN, "fp32", ("ort", None)),
    (16, PLAIN, "fp16", ("standard", None)),
    (24, PLAIN, "fp32", ("standard", "head_dim % 16 == 0; this checkpoint's head_dim is 24")),
    (16, SimpleNamespace(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "fp32", ("standard", "'yarn'")),
    (16, SimpleNamespace(rope_parameters={}, partial_rotary_factor=0.5), "fp32", ("standard", "rotates all")),
])
def test_auto_picks_the_form_that_runs(head_dim, config, dtype, want):
    form, note = resolve_decoder_form("auto", dtype, {**DIMS, "head_dim": head_dim}, config)
    assert form == want[0]
    assert (note is None) if want[1] is None else (want[1] in note)
    if want[1] is not None:
        with pytest.raises(CheckpointError, match="--decoder-form ort: .*export with --decoder-form standard"):
            resolve_decoder_form("ort", dtype, {**DIMS, "head_dim": head_dim}, config)
    assert resolve_decoder_form("standard", dtype, {**DIMS, "head_dim": head_dim}, config) == ("standard", None)


@pytest.fixture(scope="module")
def head_dim_24_checkpoint(tmp_path_factory):
    """The tiny LLaVA preset with 3 heads of 24 (hidden 72, one kv head)."""
    from coverpruner.testing import presets
    from coverpruner.testing.checkpoints import write_checkpoint

    base = presets.PRESETS["tiny"]
    odd = dataclasses.replace(base, text={**base.text, "hidden_size": 72, "num_attention_heads": 3,
                                          "num_key_value_heads": 1})
    presets.PRESETS["tiny-head-dim-24"] = odd
    try:
        return write_checkpoint(tmp_path_factory.mktemp("hd24"), preset="tiny-head-dim-24", seed=0)
    finally:
        del presets.PRESETS["tiny-head-dim-24"]


@pytest.mark.slow
def test_head_dim_24_exports_the_standard_form_and_answers(head_dim_24_checkpoint, tmp_path, capsys, demo_image):
    from coverpruner.runtime import Pipeline

    out = tmp_path / "eng"
    assert export_main(["--model", str(head_dim_24_checkpoint), "--output", str(out), "--no-progress",
                        "--decoder-form", "ort"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GroupQueryAttention CPU kernel needs head_dim % 16 == 0" in err[0], err
    assert not out.exists()
    assert export_main(["--model", str(head_dim_24_checkpoint), "--output", str(out), "--no-progress",
                        "--graphs", "vision,embed,probe,selector,decoder"]) == 0
    assert "note: decoder exported in the standard form" in capsys.readouterr().err
    assert json.loads((out / "manifest.json").read_text())["graphs"]["decoder"].get("form", "standard") == "standard"
    result = Pipeline.load(out, provider="cpu", threads=1).generate(str(demo_image), "hi", max_new_tokens=3,
                                                                    budget=8)
    assert len(result.token_ids) == 3


@pytest.mark.slow
def test_mrope_section_not_covering_head_dim_is_refused_before_writing(builds, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(builds.checkpoint("qwen2.5-vl-tiny"), ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    text = config.get("text_config", config)
    rope = text.get("rope_parameters") or text.get("rope_scaling")
    rope["mrope_section"] = [2, 3, 4]
    (ckpt / "config.json").write_text(json.dumps(config))
    out = tmp_path / "eng"
    capsys.readouterr()  # the checkpoint writer's own output
    for form in ("auto", "standard"):
        assert export_main(["--model", str(ckpt), "--output", str(out), "--no-progress", "--decoder-form", form]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["coverpruner-export: rope mrope_section [2, 3, 4] must be three positive sizes summing to "
                       "head_dim / 2 = 8 (head_dim 16); got sum 9"], err
        assert not out.exists()
