"""The engine dir as files: checker, manifest contents and hashes, external data, re-export hygiene, fp16."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from coverpruner.export.exporter import ExportOptions, export_model
from coverpruner.export.onnx_io import ExportError
from coverpruner.filehash import sha256_file
from tests.families.llava.fixtures import ort_session

pytestmark = pytest.mark.slow

CONTRACT = {  # docs/engine-dir.md: tensor names are the contract
    "vision": (["pixel_values"], ["image_features"]),
    "embed": (["input_ids"], ["inputs_embeds"]),
    "probe": (["inputs_embeds", "position_ids", "visual_positions", "instruction_positions"], ["relevance"]),
    "selector": (["image_features", "relevance", "budget", "tau"], ["keep"]),
    "selector_dart": (["image_features", "budget", "pivots"], ["keep"]),
    "selector_cdpruner": (["image_features", "relevance", "budget", "relevance_weight"], ["keep"]),
    "decoder": (["inputs_embeds", "attention_mask", "position_ids", "past_key_values.0.key",
                 "past_key_values.0.value", "past_key_values.1.key", "past_key_values.1.value"],
                ["logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"]),
}


def test_every_graph_passes_checker_and_manifest_hashes(tiny_export):
    man = json.loads((tiny_export / "manifest.json").read_text())
    assert man["graphs"], "no graphs exported"
    for name, entry in man["graphs"].items():
        path = tiny_export / entry["file"]
        onnx.checker.check_model(str(path))
        assert entry["sha256"] == sha256_file(path)
        assert [i["name"] for i in entry["inputs"]] == CONTRACT[name][0]
        assert [o["name"] for o in entry["outputs"]] == CONTRACT[name][1]
        assert entry["opset"] >= 17
        assert onnx.load(str(path), load_external_data=False).ir_version <= 10
        ort_session(path)  # loadable by the installed onnxruntime


def test_manifest_describes_family_and_model(tiny_export, tiny_checkpoint):
    man = json.loads((tiny_export / "manifest.json").read_text())
    cfg = json.loads((tiny_checkpoint / "config.json").read_text())
    assert (man["format"], man["format_version"], man["family"], man["precision"]) == \
        ("coverpruner-engine-dir", 2, "llava", "fp32")
    dims = man["dims"]
    assert man["visual"] == {"max_visual_tokens": 144, "position_rank": 1, "position_mode": "compact"}
    assert dims["num_kv_heads"] == 2 and dims["num_heads"] == 4
    assert dims["num_layers"] == cfg["text_config"]["num_hidden_layers"]
    assert man["token_ids"]["image_token_id"] == cfg["image_token_index"]
    assert man["chat_template"] == (tiny_checkpoint / "chat_template.jinja").read_text()
    assert man["options"] == {} and man["axes"] == {} and man["files"] == {}
    assert man["processor"]["crop_size"] == 168 and man["processor"]["resample"] == 3
    for f in man["tokenizer_files"] + man["processor_files"]:
        assert (tiny_export / f).read_bytes() == (tiny_checkpoint / f).read_bytes()
    assert "tokenizer.json" in man["tokenizer_files"]
    probe_in = {i["name"]: i for i in man["graphs"]["probe"]["inputs"]}
    assert probe_in["visual_positions"]["dtype"] == "int64"
    decoder_out = man["graphs"]["decoder"]["outputs"][0]
    assert decoder_out["shape"] == ["batch", 1, cfg["text_config"]["vocab_size"]]


def test_external_data_and_stale_data_removed_on_reexport(tiny_checkpoint, tmp_path):
    out = tmp_path / "eng"
    export_model(tiny_checkpoint, out, "tiny", ExportOptions(graphs=("embed", "probe"), external_data="always",
                                                             progress=False))
    man = json.loads((out / "manifest.json").read_text())
    for g in ("embed", "probe"):
        entry = man["graphs"][g]
        assert entry["data_files"] == [f"{g}.onnx.data"]
        assert entry["data_sha256"][f"{g}.onnx.data"] == sha256_file(out / f"{g}.onnx.data")
        onnx.checker.check_model(str(out / f"{g}.onnx"))  # resolves the external data by path
    ids = np.array([[1, 5, 9, 1000, 3]], np.int64)
    (emb,) = ort_session(out / "embed.onnx").run(None, {"input_ids": ids})
    assert emb.shape == (1, 5, 64) and np.abs(emb).sum() > 0

    # Re-export embed inline: its .data must go; probe (not re-exported) stays in the manifest.
    export_model(tiny_checkpoint, out, "tiny", ExportOptions(graphs=("embed",), external_data="never",
                                                             progress=False))
    man2 = json.loads((out / "manifest.json").read_text())
    assert not (out / "embed.onnx.data").exists()
    assert man2["graphs"]["embed"]["data_files"] == []
    assert man2["graphs"]["probe"] == man["graphs"]["probe"]
    (emb2,) = ort_session(out / "embed.onnx").run(None, {"input_ids": ids})
    np.testing.assert_array_equal(emb, emb2)


def test_unsupported_opset_is_a_clear_error(tiny_checkpoint, tmp_path):
    # opset 18 is native; the ONNX version converter cannot lower the probe's dynamic-axis ops to 17.
    with pytest.raises(ExportError, match=r"probe\.onnx: opset 17 was requested .* opset 18"):
        export_model(tiny_checkpoint, tmp_path, "tiny", ExportOptions(graphs=("probe",), opset=17, progress=False))
    export_model(tiny_checkpoint, tmp_path, "tiny", ExportOptions(graphs=("embed",), opset=17, progress=False))
    assert onnx.load(str(tmp_path / "embed.onnx")).opset_import[0].version == 17


def test_fp16_export_runs_and_tracks_fp32(tiny_checkpoint, tiny_export, tmp_path):
    out = tmp_path / "fp16"
    export_model(tiny_checkpoint, out, "tiny", ExportOptions(dtype="fp16", graphs=("embed", "probe", "decoder"),
                                                             progress=False))
    man = json.loads((out / "manifest.json").read_text())
    assert man["precision"] == "fp16"
    assert man["graphs"]["probe"]["inputs"][0]["dtype"] == "float16"
    assert man["graphs"]["probe"]["outputs"][0]["dtype"] == "float32"  # relevance stays float32
    assert man["graphs"]["decoder"]["outputs"][0]["dtype"] == "float16"

    ids = np.arange(1, 161, dtype=np.int64)[None] % 1000
    (e16,) = ort_session(out / "embed.onnx").run(None, {"input_ids": ids})
    (e32,) = ort_session(tiny_export / "embed.onnx").run(None, {"input_ids": ids})
    assert e16.dtype == np.float16 and np.abs(e16.astype(np.float32) - e32).max() < 1e-3
    feed = {"position_ids": np.arange(160)[None], "visual_positions": np.arange(3, 147),
            "instruction_positions": np.arange(150, 158)}
    (r16,) = ort_session(out / "probe.onnx").run(None, {"inputs_embeds": e16, **feed})
    (r32,) = ort_session(tiny_export / "probe.onnx").run(None, {"inputs_embeds": e32, **feed})
    assert np.abs(r16 - r32).max() < 0.01 * r32.max()

    def dec(path, emb, dtype):
        f = {"inputs_embeds": emb, "attention_mask": np.ones((1, 160), np.int64), "position_ids": feed["position_ids"]}
        for i in range(2):
            for k in ("key", "value"):
                f[f"past_key_values.{i}.{k}"] = np.zeros((1, 2, 0, 16), dtype)
        return ort_session(path).run(["logits"], f)[0].astype(np.float32)

    l16, l32 = dec(out / "decoder.onnx", e16, np.float16), dec(tiny_export / "decoder.onnx", e32, np.float32)
    assert np.abs(l16 - l32).max() < 0.05 * np.abs(l32).max()
    assert l16.argmax() == l32.argmax()
