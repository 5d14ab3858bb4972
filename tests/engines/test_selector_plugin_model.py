"""selector.onnx in plugin form: one custom node whose domain, op type, version and namespace are those the
C++ plugin registers, with the tensor names of docs/engine-dir.md."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto

from coverpruner.engines.native_build import CSRC_DIR
from coverpruner.export.selector import build_selector_model
from coverpruner.export.selector_plugin import (
    PLUGIN_DOMAIN,
    PLUGIN_NAMESPACE,
    PLUGIN_OP,
    PLUGIN_VERSION,
    build_selector_plugin_model,
    plugin_constants_from_header,
)


def test_python_and_cpp_agree_on_the_plugin_identity():
    consts = plugin_constants_from_header(CSRC_DIR / "plugin" / "selector_plugin_core.h")
    assert consts["kPluginName"] == PLUGIN_OP
    assert consts["kPluginVersion"] == PLUGIN_VERSION
    assert consts["kPluginNamespace"] == PLUGIN_NAMESPACE
    assert consts["kOnnxDomain"] == PLUGIN_DOMAIN


@pytest.mark.parametrize("dtype,elem", [("float32", TensorProto.FLOAT), ("float16", TensorProto.FLOAT16)])
def test_one_node_with_contract_names(dtype, elem):
    model = build_selector_model(dtype, form="plugin")
    onnx.checker.check_model(model)
    (node,) = model.graph.node
    assert (node.op_type, node.domain) == (PLUGIN_OP, PLUGIN_DOMAIN)
    assert list(node.input) == ["image_features", "relevance", "budget", "tau"]
    assert list(node.output) == ["keep", "keep_length"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"opt_budget": 64, "plugin_version": b"1", "plugin_namespace": b""}
    ins = {i.name: i.type.tensor_type for i in model.graph.input}
    assert ins["image_features"].elem_type == elem
    assert ins["relevance"].elem_type == TensorProto.FLOAT and ins["tau"].elem_type == TensorProto.FLOAT
    assert ins["budget"].elem_type == TensorProto.INT64 and len(ins["budget"].shape.dim) == 0
    assert [o.name for o in model.graph.output] == ["keep"]
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.INT64
    assert {o.domain: o.version for o in model.opset_import}[PLUGIN_DOMAIN] == 1


def test_opt_budget_attribute_and_bad_arguments():
    (node,) = build_selector_plugin_model(opt_budget=128).graph.node
    assert [a.i for a in node.attribute if a.name == "opt_budget"] == [128]
    with pytest.raises(ValueError, match="float_dtype must be one of"):
        build_selector_plugin_model("bfloat16")
    with pytest.raises(ValueError, match="opset must be >= 17"):
        build_selector_plugin_model(opset=13)
    with pytest.raises(ValueError, match="opt_budget must be an int >= 1"):
        build_selector_plugin_model(opt_budget=0)


def test_header_parser_reports_missing_constants(tmp_path):
    header = tmp_path / "x.h"
    header.write_text('constexpr char kPluginName[] = "CoverageSelector";\n')
    with pytest.raises(ValueError, match="kOnnxDomain"):
        plugin_constants_from_header(header)
