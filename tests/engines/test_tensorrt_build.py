"""TensorRT-RTX builds engines without a GPU with optimization profiles from the manifest, and refuses bad requests
with clear errors. "Every graph of every family builds" is tests/matrix/test_tensorrt_builds.py."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper

from coverpruner.engines.build_cli import main as build_main
from coverpruner.engines.tensorrt import (
    BuildOptions,
    TensorRTBuildError,
    build_engine_dir,
    detect_compute_capability,
)

from tests.trt_plans import is_trt_rtx_plan

pytestmark = pytest.mark.tensorrt


def _selector_dir(tmp_path, dtype="float32", precision="fp32", form="loop"):
    from coverpruner.export.selector import build_selector_model

    d = tmp_path / f"sel_{dtype}_{form}"
    d.mkdir()
    onnx.save(build_selector_model(dtype, form=form), d / "selector.onnx")
    ft = "float16" if dtype == "float16" else "float32"
    manifest = {
        "format": "coverpruner-engine-dir", "format_version": 2, "precision": precision, "selector_form": form,
        "dims": {"hidden_size": 32, "max_position_embeddings": 128}, "visual": {"max_visual_tokens": 48},
        "graphs": {"selector": {"file": "selector.onnx",
                                "inputs": [{"name": "image_features", "dtype": ft, "shape": ["n", "d"]},
                                           {"name": "relevance", "dtype": "float32", "shape": ["n"]},
                                           {"name": "budget", "dtype": "int64", "shape": []},
                                           {"name": "tau", "dtype": "float32", "shape": []}],
                                "outputs": [{"name": "keep", "dtype": "int64", "shape": ["m"]}]}},
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def test_float16_selector_loop_builds(trt_rtx, tmp_path):
    d = _selector_dir(tmp_path, "float16", "fp16")
    section = build_engine_dir(d, BuildOptions(budgets=(8, 16, 32), precision="fp16"), trt_rtx)
    assert section["precision"] == "fp16"
    assert section["engines"]["selector"]["shape_inputs"]["budget"] == {"min": [8], "opt": [8], "max": [32]}
    assert (d / "selector.engine").stat().st_size > 1000


def test_rtx_refuses_precision_the_graph_does_not_have(trt_rtx, tmp_path):
    d = _selector_dir(tmp_path)
    with pytest.raises(TensorRTBuildError, match=r"strongly typed.*re-export with --dtype fp16"):
        build_engine_dir(d, BuildOptions(precision="fp16"), trt_rtx)


def test_int8_needs_qdq_graph(trt_rtx, tmp_path):
    d = _selector_dir(tmp_path)
    with pytest.raises(TensorRTBuildError, match="Q/DQ"):
        build_engine_dir(d, BuildOptions(precision="int8"), trt_rtx)


def test_plugin_form_needs_plugin_library(trt_rtx, tmp_path):
    d = _selector_dir(tmp_path, form="plugin")
    with pytest.raises(TensorRTBuildError, match="--plugin PATH"):
        build_engine_dir(d, BuildOptions(), trt_rtx)


@pytest.mark.skipif(detect_compute_capability() is not None, reason="checks the GPU-less refusal")
def test_plugin_form_with_rtx_without_gpu_is_refused_not_crashed(trt_rtx, tmp_path):
    d = _selector_dir(tmp_path, form="plugin")
    with pytest.raises(TensorRTBuildError, match="without a GPU"):
        build_engine_dir(d, BuildOptions(plugin=tmp_path / "libcoverpruner_trt_plugin.so"), trt_rtx)


def _tiny_graph_dir(tmp_path, input_shape, manifest_shape, name="x"):
    node = helper.make_node("Relu", [name], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(name, TensorProto.FLOAT, input_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, input_shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    d = tmp_path / "g"
    d.mkdir()
    onnx.save(model, d / "g.onnx")
    manifest = {"format": "coverpruner-engine-dir", "format_version": 2, "precision": "fp32",
                "dims": {"hidden_size": 8, "max_position_embeddings": 64}, "visual": {"max_visual_tokens": 4},
                "graphs": {"g": {"file": "g.onnx", "inputs": [{"name": "x", "dtype": "float32",
                                                               "shape": manifest_shape}], "outputs": []}}}
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def test_unknown_axis_is_named_and_can_be_given(trt_rtx, tmp_path):
    d = _tiny_graph_dir(tmp_path, ["frames", 8], ["frames", 8])
    with pytest.raises(TensorRTBuildError, match=r"input 'x': no range for symbolic axis 'frames'.*--shape"):
        build_engine_dir(d, BuildOptions(), trt_rtx)
    section = build_engine_dir(d, BuildOptions(shapes={"frames": (1, 4, 16)}), trt_rtx)
    assert section["engines"]["g"]["profile"]["x"] == {"min": [1, 8], "opt": [4, 8], "max": [16, 8]}


def test_manifest_and_graph_must_agree(trt_rtx, tmp_path):
    d = _tiny_graph_dir(tmp_path, ["batch", 8], ["batch", 8, 2])
    with pytest.raises(TensorRTBuildError, match=r"rank 2 in the ONNX file, 3 in manifest.json"):
        build_engine_dir(d, BuildOptions(), trt_rtx)
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["graphs"]["g"]["inputs"][0]["name"] = "pixels"
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TensorRTBuildError, match=r"has inputs \['x'\] but manifest.json lists \['pixels'\]"):
        build_engine_dir(d, BuildOptions(), trt_rtx)


def test_parser_errors_name_the_graph(trt_rtx, tmp_path):
    d = _tiny_graph_dir(tmp_path, ["batch", 8], ["batch", 8])
    model = onnx.load(d / "g.onnx")
    model.graph.node[0].op_type = "NoSuchOp"
    onnx.save(model, d / "g.onnx")
    with pytest.raises(TensorRTBuildError, match=r"graph 'g': TensorRT's ONNX parser rejected g.onnx"):
        build_engine_dir(d, BuildOptions(), trt_rtx)


def test_missing_or_foreign_manifest(trt_rtx, tmp_path):
    with pytest.raises(TensorRTBuildError, match="manifest.json not found"):
        build_engine_dir(tmp_path, BuildOptions(), trt_rtx)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "other", "format_version": 3}))
    with pytest.raises(TensorRTBuildError, match="field 'format' is 'other', expected 'coverpruner-engine-dir'"):
        build_engine_dir(tmp_path, BuildOptions(), trt_rtx)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "coverpruner-engine-dir", "format_version": 1}))
    with pytest.raises(TensorRTBuildError, match="format_version 1 predates the family contract.*re-export"):
        build_engine_dir(tmp_path, BuildOptions(), trt_rtx)


def test_cli_builds_and_reports_errors(trt_rtx, tmp_path, capsys):
    d = _selector_dir(tmp_path)
    assert build_main([str(d), "--backend", "tensorrt", "--flavour", "tensorrt_rtx", "--budgets", "4,12",
                       "--max-context", "64"]) == 0
    assert "selector:" in capsys.readouterr().out
    assert json.loads((d / "manifest.json").read_text())["tensorrt"]["budgets"] == [4, 12]
    with pytest.raises(SystemExit) as exc:
        build_main([str(d), "--flavour", "tensorrt_rtx", "--precision", "int8"])
    assert exc.value.code == 2
    assert "Q/DQ" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_main([str(d), "--budgets", "0,4"])
    assert "--budgets needs ints >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_fp16_export_builds_fp16_engines(trt_rtx, tiny_checkpoint, tmp_path):
    """fp16 graphs (strongly typed for TensorRT-RTX) build as fp16 engines: decoder and selector, the two with
    the most dynamic shapes."""
    from coverpruner.export.exporter import ExportOptions, export_model

    out = tmp_path / "fp16"
    export_model(tiny_checkpoint, out, "tiny", ExportOptions(dtype="fp16", graphs=("selector", "decoder"),
                                                             progress=False))
    section = build_engine_dir(out, BuildOptions(precision="fp16", budgets=(8, 32), max_context=128), trt_rtx)
    assert set(section["engines"]) == {"selector", "decoder"} and section["precision"] == "fp16"
    assert all((out / rec["file"]).stat().st_size > 1000 for rec in section["engines"].values())
    assert all(is_trt_rtx_plan(out / rec["file"]) for rec in section["engines"].values())
