"""ONNX node builders shared by the selector graphs: selector.onnx (selector_graph.py, coverpruner) and the peers'
selector_dart.onnx / selector_cdpruner.onnx (peer_graphs.py).

Every builder returns plain nodes over fixed tensor names, so a graph is the concatenation of its lists; the
names each one reads from the enclosing scope are in its docstring. What they hold is what the graphs agree on:
unit rows of V for cosines, the min-max scaling of the relevance, the lowest tied index as a float32 ReduceMin
(no ArgMax / TopK tie order, no NonZero: portable to TensorRT's parser), the picks sorted by a float32 TopK.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from coverpruner.selection.ties import EPS32, NORM_EPS

#: the constants several graphs read, by name -> (value, numpy dtype)
CONSTANTS = {
    "eps": (NORM_EPS, np.float32),
    "eps32": (EPS32, np.float32),
    "zero_i": (0, np.int64),
    "one_i": (1, np.int64),
    "zero_f": (0.0, np.float32),
    "one_f": (1.0, np.float32),
    "neg_inf": (-np.inf, np.float32),
    "true": (True, np.bool_),
    "axis0": ([0], np.int64),
    "axis1": ([1], np.int64),
    "shape_1": ([1], np.int64),
    "shape_1_neg": ([-1], np.int64),
    "shape_col": ([-1, 1], np.int64),
}


def const(name: str, value, dtype=None) -> onnx.NodeProto:
    """A Constant node whose output `name` holds `value` as a numpy array of `dtype`."""
    arr = np.asarray(value, dtype=dtype)
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name))


def consts(*names: str) -> list[onnx.NodeProto]:
    """Constant nodes of CONSTANTS' `names`."""
    return [const(name, *CONSTANTS[name]) for name in names]


def value(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def unit_rows(opset: int) -> list[onnx.NodeProto]:
    """image_features [n, d] float32|float16 -> v [n, d] float32, sq_norm / norm_raw [n, 1] (squared and plain L2
    norms), vn [n, d] unit rows (norm clamped at NORM_EPS: an all-zero row stays zero), n_tokens int64 scalar, n_f
    its float32. Reads eps (and axis1 at opset >= 18, where ReduceSumSquare takes its axes as an input); the
    squared norms come without an [n, d] square."""
    n = helper.make_node
    sq_norm = (n("ReduceSumSquare", ["v", "axis1"], ["sq_norm"], keepdims=1) if opset >= 18 else
               n("ReduceSumSquare", ["v"], ["sq_norm"], axes=[1], keepdims=1))
    return [
        n("Cast", ["image_features"], ["v"], to=TensorProto.FLOAT),
        sq_norm,  # [n, 1]
        n("Sqrt", ["sq_norm"], ["norm_raw"]),
        n("Max", ["norm_raw", "eps"], ["norm"]),
        n("Div", ["v", "norm"], ["vn"]),  # [n, d]
        n("Shape", ["v"], ["v_shape"]),
        n("Gather", ["v_shape", "zero_i"], ["n_tokens"], axis=0),  # int64 scalar
        n("Cast", ["n_tokens"], ["n_f"], to=TensorProto.FLOAT),
    ]


def minmax_relevance(out: str, flat: str) -> list[onnx.NodeProto]:
    """relevance [n] float32 -> `out` [n] = (r - min r) / (max r - min r), the constant `flat` everywhere when r is
    constant (no division by zero). Reads zero_f, one_f."""
    n = helper.make_node
    return [
        n("ReduceMin", ["relevance"], ["r_min"], keepdims=0),
        n("ReduceMax", ["relevance"], ["r_max"], keepdims=0),
        n("Sub", ["r_max", "r_min"], ["span"]),
        n("Greater", ["span", "zero_f"], ["has_span"]),
        n("Where", ["has_span", "span", "one_f"], ["safe_span"]),
        n("Sub", ["relevance", "r_min"], ["r_shift"]),
        n("Div", ["r_shift", "safe_span"], ["r_scaled"]),
        n("Where", ["has_span", "r_scaled", flat], [out]),
    ]


def lowest_tied(tag: str, score: str, threshold: str, index_f: str, out: str) -> list[onnx.NodeProto]:
    """`out` int64 [] = the lowest of `index_f` (float32 indices, exact below 2^24; float rather than int64 for
    TensorRT) whose `score` is >= `threshold`, the minimum of the tied indices rather than ArgMax's tie order.
    Reads n_f (the rank of the others); intermediate names start with `tag`."""
    n = helper.make_node
    return [
        n("GreaterOrEqual", [score, threshold], [f"{tag}_tied"]),
        n("Where", [f"{tag}_tied", index_f, "n_f"], [f"{tag}_ranked"]),
        n("ReduceMin", [f"{tag}_ranked"], [f"{out}_f"], keepdims=0),  # []
        n("Cast", [f"{out}_f"], [out], to=TensorProto.INT64),
    ]


def sorted_keep() -> list[onnx.NodeProto]:
    """picks (the Loop's scan output, [m] or [m, 1] int64) -> keep [m] int64 ascending: a TopK on float32 (exact
    for n < 2^24) sorts where int64 TopK is not portable. Reads trip_count (m), shape_1, shape_1_neg."""
    n = helper.make_node
    return [
        n("Reshape", ["picks", "shape_1_neg"], ["picks_flat"]),
        n("Cast", ["picks_flat"], ["picks_f"], to=TensorProto.FLOAT),
        n("Reshape", ["trip_count", "shape_1"], ["k_1d"]),
        n("TopK", ["picks_f", "k_1d"], ["sorted_f", "sorted_pos"], axis=0, largest=0, sorted=1),
        n("Cast", ["sorted_f"], ["keep"], to=TensorProto.INT64),
    ]


def selector_model(nodes: list, name: str, inputs: list, outputs: list, opset: int) -> onnx.ModelProto:
    """The checked model of graph `name` at default-domain `opset`, its IR version capped (8 up to opset 17, else
    9) so older onnxruntime builds load it."""
    graph = helper.make_graph(nodes, name, inputs=inputs, outputs=outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="coverpruner")
    model.ir_version = min(model.ir_version, 8 if opset <= 17 else 9)
    onnx.checker.check_model(model)
    return model
