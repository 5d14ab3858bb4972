"""Engine/machine compatibility rules and build-option validation: pure logic, no TensorRT needed."""

from __future__ import annotations

import json
import shutil
import sys
import types

import pytest

from coverpruner.engines.tensorrt import (
    BuildOptions,
    EngineMismatchError,
    TensorRTBuildError,
    axis_ranges,
    budget_profile,
    check_engine_compat,
    input_profile,
    load_tensorrt,
)

SECTION = {"flavour": "tensorrt", "version": "10.3.0", "compute_capability": "8.7", "engines": {"vision": {}}}


def test_matching_engine_is_accepted():
    check_engine_compat(SECTION, "tensorrt", "10.3.0", "8.7")
    rtx = dict(SECTION, flavour="tensorrt_rtx", compute_capability=None)
    check_engine_compat(rtx, "tensorrt_rtx", "10.3.0", None)  # RTX engines are compiled for the GPU at load


@pytest.mark.parametrize("flavour,version,cc,message", [
    ("tensorrt", "10.7.0", "8.7", "built with tensorrt 10.3.0 but 10.7.0 is installed"),
    ("tensorrt", "10.3.0", "9.0", "built for compute capability 8.7 but this GPU is 9.0"),
    ("tensorrt", "10.3.0", None, "but this GPU is absent"),
    ("tensorrt_rtx", "10.3.0", "8.7", "built with tensorrt but this machine runs tensorrt_rtx"),
])
def test_mismatch_is_refused_with_reason(flavour, version, cc, message):
    with pytest.raises(EngineMismatchError, match=message):
        check_engine_compat(SECTION, flavour, version, cc)


def test_dir_without_engines_is_refused():
    with pytest.raises(EngineMismatchError, match="run `coverpruner-build DIR --backend tensorrt` first"):
        check_engine_compat(None, "tensorrt", "10.3.0", "8.7")


def test_session_factory_refuses_dir_without_engines(tmp_path):
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX bindings to get past the import")
    from coverpruner.engines.trt_session import TrtSessionFactory

    (tmp_path / "manifest.json").write_text(json.dumps({"format": "coverpruner-engine-dir", "format_version": 2}))
    with pytest.raises(EngineMismatchError, match="no TensorRT engines"):
        TrtSessionFactory(tmp_path)


MANIFEST = {"dims": {"hidden_size": 4096, "max_position_embeddings": 4096}, "visual": {"max_visual_tokens": 576}}


def test_axis_ranges_follow_manifest_and_options():
    r = axis_ranges(MANIFEST, BuildOptions(budgets=(64, 128), max_context=2048, max_batch=4))
    assert r["batch"] == (1, 1, 4)
    assert r["seq"] == (1, 640, 2048)
    assert r["n"] == r["num_visual"] == (1, 576, 576)
    assert r["d"] == (4096, 4096, 4096)
    assert r["past_sequence"] == (0, 128, 2047)
    assert r["total_sequence"] == (1, 129, 2048)
    r = axis_ranges(MANIFEST, BuildOptions(shapes={"seq": (1, 8, 16), "frames": (1, 2, 3)}))
    assert r["seq"] == (1, 8, 16) and r["frames"] == (1, 2, 3)
    assert r["past_sequence"][2] == 4095  # max_context defaults to max_position_embeddings
    # a family's own axes (manifest "axes", e.g. LLaVA-NeXT's tile axis) join the generic ones; --shape wins
    fam = {**MANIFEST, "visual": {"max_visual_tokens": 2880}, "axes": {"num_tiles": [1, 5, 5]}}
    r = axis_ranges(fam, BuildOptions())
    assert r["num_tiles"] == (1, 5, 5) and r["num_visual"] == (1, 2880, 2880)
    assert axis_ranges(fam, BuildOptions(shapes={"num_tiles": (1, 3, 3)}))["num_tiles"] == (1, 3, 3)
    # a short context (budget + 64 > context - 1): the past length's opt stays within its max (a valid profile)
    r = axis_ranges(MANIFEST, BuildOptions(budgets=(64,), max_context=128))
    assert r["past_sequence"] == (0, 127, 127) and r["total_sequence"] == (1, 128, 128)


def test_input_profile_and_budget_profile():
    r = axis_ranges(MANIFEST, BuildOptions(max_context=1024))
    spec = {"name": "past_key_values.0.key", "shape": ["batch", 32, "past_sequence", 128]}
    assert input_profile("decoder", spec, r) == {"min": [1, 32, 0, 128], "opt": [1, 32, 128, 128],
                                                 "max": [1, 32, 1023, 128]}
    with pytest.raises(TensorRTBuildError, match=r"graph 'decoder', input 'x': no range for symbolic axis 'q'"):
        input_profile("decoder", {"name": "x", "shape": ["q"]}, r)
    assert budget_profile(BuildOptions(budgets=(128, 64, 192))) == {"min": [64], "opt": [128], "max": [192]}


@pytest.mark.parametrize("kwargs,message", [
    ({"precision": "fp8"}, "precision must be one of"),
    ({"budgets": ()}, "budgets must be"),
    ({"budgets": (64, 0)}, "budgets must be"),
    ({"max_context": 1}, "max_context must be >= 2"),
    ({"max_batch": 0}, "max_batch must be >= 1"),
    ({"shapes": {"seq": (5, 2, 9)}}, "min <= opt <= max"),
])
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BuildOptions(**kwargs).validate()


def test_unknown_flavour_and_missing_module(monkeypatch):
    with pytest.raises(ValueError, match="flavour must be one of"):
        load_tensorrt("onnxruntime")
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # None in sys.modules: `import tensorrt` raises ImportError
    with pytest.raises(TensorRTBuildError, match=r"no usable TensorRT python module \(tensorrt: .*pip install tensorrt"):
        load_tensorrt("tensorrt")
    placeholder = types.ModuleType("tensorrt_rtx")  # the pip placeholder: importable, no bindings
    monkeypatch.setitem(sys.modules, "tensorrt_rtx", placeholder)
    with pytest.raises(TensorRTBuildError, match=r"tensorrt: .*; tensorrt_rtx: installed without python bindings"):
        load_tensorrt()


def test_missing_plugin_library_is_named(tmp_path):
    from coverpruner.engines.tensorrt import TrtModule, load_plugin_library

    with pytest.raises(TensorRTBuildError, match=r"plugin library .*missing.so does not exist"):
        load_plugin_library(TrtModule(module=None, flavour="tensorrt", version="10.3.0"), tmp_path / "missing.so")


@pytest.mark.tensorrt
def test_engines_need_a_usable_gpu_to_run(tiny_export, tmp_path):
    """Built here by TensorRT-RTX without a GPU: loading them names the missing GPU, not a version mismatch."""
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX bindings to build engines without a GPU")
    from coverpruner.engines.tensorrt import BuildOptions, build_engine_dir, detect_compute_capability
    from coverpruner.engines.trt_session import TrtSessionFactory

    if detect_compute_capability() is not None:
        pytest.skip("a CUDA GPU is usable here; the GPU tests cover running engines")
    engine_dir = shutil.copytree(tiny_export, tmp_path / "engine")
    build_engine_dir(engine_dir, BuildOptions(graphs=("embed",)))
    with pytest.raises(EngineMismatchError, match="TensorRT engines run on a CUDA GPU and none is usable here"):
        TrtSessionFactory(engine_dir)
