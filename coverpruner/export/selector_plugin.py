"""selector.onnx in plugin form: one custom node that TensorRT resolves to the CoverageSelector plugin
(coverpruner/engines/csrc/plugin). ONNX Runtime's CPU provider cannot run it; TensorRT (trtexec
--dynamicPlugins, IPluginRegistry.load_library) and ONNX Runtime's TensorRT provider
(trt_extra_plugin_lib_paths) can, once libcoverpruner_trt_plugin.so is loaded.

Inputs  image_features [n, d] float32|float16, relevance [n] float32, budget int64 scalar, tau float32 scalar
Output  keep [m] int64, ascending, m = min(budget, n)            (the tensor names of docs/engine-dir.md)

The node has a second output, keep_length (int32 scalar, = m: TensorRT size tensors are int32): TensorRT plugins with data-dependent output
shapes report the length through such a size tensor. It is not a graph output. The budget is a runtime tensor
read on the GPU, so one engine serves every budget.
"""

from __future__ import annotations

import re
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from coverpruner.engine_dir import PLUGIN_NAMESPACE, PLUGIN_OP, PLUGIN_VERSION  # noqa: F401 (re-exported)
from coverpruner.export.selector_io import selector_inputs, selector_outputs

# Must equal kOnnxDomain in selector_plugin_core.h. The domain ONNX Runtime's TensorRT provider registers for plugins loaded through trt_extra_plugin_lib_paths;
# TensorRT's own ONNX parser looks plugins up by op type, version and namespace attributes.
PLUGIN_DOMAIN = "trt.plugins"
DEFAULT_OPT_BUDGET = 64



def build_selector_plugin_model(float_dtype: str = "float32", opset: int = 17,
                                opt_budget: int = DEFAULT_OPT_BUDGET) -> onnx.ModelProto:
    """The one-node selector graph.

    float_dtype: "float32" or "float16", the type of image_features. opset: default-domain opset (>= 17).
    opt_budget: the keep length TensorRT plans memory and kernels for (the plugin's `opt_budget` field);
    any budget still runs, up to n.
    """
    if opset < 17:
        raise ValueError(f"opset must be >= 17, got {opset}")
    if isinstance(opt_budget, bool) or not isinstance(opt_budget, int) or opt_budget < 1:
        raise ValueError(f"opt_budget must be an int >= 1, got {opt_budget!r}")
    node = helper.make_node(
        PLUGIN_OP,
        ["image_features", "relevance", "budget", "tau"],
        ["keep", "keep_length"],
        name="coverage_selector",
        domain=PLUGIN_DOMAIN,
        opt_budget=opt_budget,
        plugin_version=PLUGIN_VERSION,
        plugin_namespace=PLUGIN_NAMESPACE,
    )
    graph = helper.make_graph(
        [node],
        "coverage_selector_plugin",
        inputs=selector_inputs(float_dtype),
        outputs=selector_outputs(),
        value_info=[helper.make_tensor_value_info("keep_length", TensorProto.INT32, [])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(PLUGIN_DOMAIN, 1)],
        producer_name="coverpruner",
    )
    model.ir_version = min(model.ir_version, 8 if opset <= 17 else 9)
    onnx.checker.check_model(model)
    return model


def plugin_constants_from_header(header: str | Path) -> dict[str, str]:
    """kPluginName, kPluginVersion, kPluginNamespace, kOnnxDomain as written in selector_plugin_core.h."""
    text = Path(header).read_text()
    found = dict(re.findall(r'constexpr char (k\w+)\[\] = "([^"]*)";', text))
    missing = {"kPluginName", "kPluginVersion", "kPluginNamespace", "kOnnxDomain"} - found.keys()
    if missing:
        raise ValueError(f"{header}: constants {sorted(missing)} not found")
    return found
