"""The selector graph's inputs and outputs (docs/engine-dir.md), shared by its two forms: the standard-op Loop
graph (selector_graph.py) and the TensorRT plugin node (selector_plugin.py)."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

FLOAT_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


def selector_inputs(float_dtype: str) -> list[onnx.ValueInfoProto]:
    """image_features [n, d] float32|float16, relevance [n] float32, budget int64 scalar, tau float32 scalar."""
    if float_dtype not in FLOAT_TYPES:
        raise ValueError(f"float_dtype must be one of {sorted(FLOAT_TYPES)}, got {float_dtype!r}")
    return [
        helper.make_tensor_value_info("image_features", FLOAT_TYPES[float_dtype], ["n", "d"]),
        helper.make_tensor_value_info("relevance", TensorProto.FLOAT, ["n"]),
        helper.make_tensor_value_info("budget", TensorProto.INT64, []),
        helper.make_tensor_value_info("tau", TensorProto.FLOAT, []),
    ]


def selector_outputs() -> list[onnx.ValueInfoProto]:
    """keep [m] int64, ascending, m = min(budget, n)."""
    return [helper.make_tensor_value_info("keep", TensorProto.INT64, ["m"])]
