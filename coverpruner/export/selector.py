"""selector.onnx in either form: "loop" (standard ops, selector_graph.py, default) or "plugin" (one custom
node that TensorRT resolves to the CoverageSelector plugin, selector_plugin.py)."""

from __future__ import annotations

import onnx

from coverpruner.export.selector_graph import build_selector_loop_model
from coverpruner.export.selector_plugin import build_selector_plugin_model

FORMS = ("loop", "plugin")


def build_selector_model(float_dtype: str = "float32", opset: int = 17, form: str = "loop") -> onnx.ModelProto:
    """The selector graph of `form` for image_features of `float_dtype` at default-domain `opset`."""
    if form == "loop":
        return build_selector_loop_model(float_dtype, opset)
    if form == "plugin":
        return build_selector_plugin_model(float_dtype=float_dtype, opset=opset)
    raise ValueError(f"selector form must be one of {FORMS}, got {form!r}")
