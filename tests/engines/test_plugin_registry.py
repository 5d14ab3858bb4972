"""The plugin library, built with TensorRT headers, loads into a TensorRT plugin registry (TensorRT-RTX here:
no GPU needed): getCreators/setLoggerFinder are found, the creator has the node's name/version/namespace and
field list, and a bad field is refused by the creator with the core's message. Needs TENSORRT_ROOT (headers)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from coverpruner.export.selector_plugin import PLUGIN_NAMESPACE, PLUGIN_OP, PLUGIN_VERSION

pytestmark = pytest.mark.tensorrt

SCRIPT = textwrap.dedent("""
    import sys, numpy as np, tensorrt_rtx as trt
    logger = trt.Logger(trt.Logger.WARNING)
    trt.Builder(logger)
    reg = trt.get_plugin_registry()
    from coverpruner.engines.native_build import preload_cublas
    preload_cublas()  # as load_plugin_library does: the self-contained plugin finds a pip-wheel cuBLAS by soname
    assert reg.load_library(sys.argv[1]) is not None, "load_library failed"
    creator = reg.get_creator(sys.argv[2], sys.argv[3], sys.argv[4])
    assert creator is not None, "creator not registered"
    print("fields", [f.name for f in creator.field_names])
    ok = creator.create_plugin("sel", trt.PluginFieldCollection(
        [trt.PluginField("opt_budget", np.array([32], np.int64), trt.PluginFieldType.INT64)]), trt.TensorRTPhase.BUILD)
    core = ok.get_capability_interface(trt.PluginCapabilityType.CORE)
    print("created", core.plugin_name, core.plugin_version)
    bad = creator.create_plugin("sel", trt.PluginFieldCollection(
        [trt.PluginField("budget", np.array([32], np.int64), trt.PluginFieldType.INT64)]), trt.TensorRTPhase.BUILD)
    print("bad", bad)
""")


def test_plugin_loads_into_tensorrt_registry(native_libs, tmp_path):
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX python bindings are not installed")
    if native_libs.plugin is None:
        pytest.skip("the TensorRT plugin was not built: TensorRT headers not found (set TENSORRT_ROOT)")
    # a subprocess: a plugin registry is process-wide and a failed load must not take pytest down
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(native_libs.plugin), PLUGIN_OP, PLUGIN_VERSION,
                           PLUGIN_NAMESPACE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fields ['opt_budget']" in proc.stdout
    assert f"created {PLUGIN_OP} {PLUGIN_VERSION}" in proc.stdout
    assert "bad None" in proc.stdout
    assert "unknown field 'budget' (expected only 'opt_budget')" in proc.stdout + proc.stderr
