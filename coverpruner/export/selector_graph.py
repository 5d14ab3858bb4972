"""selector.onnx: the coverage selector as a standard-op ONNX graph (a Loop), portable to ONNX Runtime and to
TensorRT's ONNX parser.

Inputs  image_features [n, d] float32|float16, relevance [n] float32, budget int64 scalar, tau float32 scalar
Output  keep [m] int64, ascending, m = min(budget, n)

Written for TensorRT's parser as well as ORT: ArgMax runs on a 2-D [1, n] tensor, the Loop runs exactly
min(budget, n) iterations (trip count min(budget, n); its condition is the constant true passed through the body
unchanged, so there is no early exit and the scan output always has the trip count's length), and there is no
NonZero. Ties go to the lowest index without relying on ArgMax's tie order: among gains within
tie_rtol(n, float32) * best of the best (coverpruner.selection's rule with a float32 window of at most 8 ulps),
the maximum of `is_best * (n - index)` is unique. Everything runs in float32 and the gains are recomputed from
scratch every step; the numpy reference runs in float64, so only genuine float32 near-ties (gains within a few
float32 roundings) can break differently.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from coverpruner.export.selector_io import selector_inputs, selector_outputs
from coverpruner.selection.coverage import EPS32, NORM_EPS

def _const(name: str, value, dtype=None) -> onnx.NodeProto:
    arr = np.asarray(value, dtype=dtype)
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name))


def _loop_body() -> onnx.GraphProto:
    """One greedy step. Carried: c [n] coverage, taken [1, n] bool. Scan output: the pick k [1] int64.

    c is carried 1-D and reshaped to a column inside the body: TensorRT-RTX 1.7's Myelin compiler rejects a
    loop-carried [n, 1] tensor that is broadcast against A (CHECK(dim_count == stride_order.size())).
    """
    n = helper.make_node
    nodes = [
        n("Reshape", ["c_in", "shape_col"], ["c_col"]),  # [n, 1]
        # uncovered gain of every candidate column: sum_i w_i * relu(A_ik - c_i)   -> gain [1, n]
        n("Sub", ["A", "c_col"], ["excess"]),
        n("Relu", ["excess"], ["uncovered"]),
        n("Mul", ["uncovered", "w_col"], ["weighted"]),
        n("ReduceSum", ["weighted", "axis0"], ["gain_raw"], keepdims=1),
        n("Where", ["taken_in", "neg_inf", "gain_raw"], ["gain"]),
        # lowest index among the maxima: unique max of is_best * (n - index)
        n("ReduceMax", ["gain"], ["best"], keepdims=1),  # gain is [1, n]: reduce all, no axes (opset-agnostic)
        n("Abs", ["best"], ["best_abs"]),
        n("Mul", ["best_abs", "tie_rtol"], ["tie_window"]),  # relative to the current best gain
        n("Sub", ["best", "tie_window"], ["threshold"]),
        n("GreaterOrEqual", ["gain", "threshold"], ["is_best"]),
        n("Cast", ["is_best"], ["is_best_f"], to=TensorProto.FLOAT),
        n("Mul", ["is_best_f", "rank_row"], ["ranked"]),
        n("ArgMax", ["ranked"], ["k_2d"], axis=1, keepdims=1, select_last_index=0),  # [1, 1]
        n("Reshape", ["k_2d", "shape_1"], ["k"]),
        # c <- max(c, A[:, k]); taken[k] <- true
        n("Gather", ["A", "k"], ["a_col"], axis=1),  # [n, 1]
        n("Max", ["c_col", "a_col"], ["c_next"]),
        n("Reshape", ["c_next", "shape_1_neg"], ["c_out"]),
        n("Equal", ["index_row", "k_2d"], ["is_k"]),
        n("Or", ["taken_in", "is_k"], ["taken_out"]),
        n("Identity", ["cond_in"], ["cond_out"]),  # never false: no early exit
        n("Identity", ["k"], ["k_out"]),
    ]
    return helper.make_graph(
        nodes,
        "greedy_step",
        inputs=[
            helper.make_tensor_value_info("iter", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("c_in", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("taken_in", TensorProto.BOOL, [1, "n"]),
        ],
        outputs=[
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("c_out", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("taken_out", TensorProto.BOOL, [1, "n"]),
            helper.make_tensor_value_info("k_out", TensorProto.INT64, [1]),
        ],
    )


def build_selector_loop_model(float_dtype: str = "float32", opset: int = 17) -> onnx.ModelProto:
    """The standard-op selector graph (see module docstring for the contract)."""
    inputs = selector_inputs(float_dtype)  # validates float_dtype
    if opset < 17:
        raise ValueError(f"opset must be >= 17, got {opset}")
    n = helper.make_node
    nodes = [
        _const("eps", NORM_EPS, np.float32),
        _const("zero_f", 0.0, np.float32),
        _const("one_f", 1.0, np.float32),
        _const("eps32", EPS32, np.float32),
        _const("max_tie_ulps", 8.0, np.float32),
        _const("neg_inf", -np.inf, np.float32),
        _const("axis0", [0], np.int64),
        _const("axis1", [1], np.int64),
        _const("shape_1", [1], np.int64),
        _const("shape_1_neg", [-1], np.int64),
        _const("shape_row", [1, -1], np.int64),
        _const("shape_col", [-1, 1], np.int64),
        _const("zero_i", 0, np.int64),
        _const("one_i", 1, np.int64),
        _const("true", True, np.bool_),
        # cosine similarity M = Vn Vn^T, utilities A = relu(M - rowmean(M))    [n, n] float32
        n("Cast", ["image_features"], ["v"], to=TensorProto.FLOAT),
        n("Mul", ["v", "v"], ["v_sq"]),
        n("ReduceSum", ["v_sq", "axis1"], ["sq_norm"], keepdims=1),
        n("Sqrt", ["sq_norm"], ["norm_raw"]),
        n("Max", ["norm_raw", "eps"], ["norm"]),
        n("Div", ["v", "norm"], ["vn"]),
        n("Transpose", ["vn"], ["vn_t"], perm=[1, 0]),
        n("MatMul", ["vn", "vn_t"], ["M"]),
        n("ReduceSum", ["M", "axis1"], ["row_sum"], keepdims=1),
        n("Shape", ["v"], ["v_shape"]),
        n("Gather", ["v_shape", "zero_i"], ["n_tokens"], axis=0),  # int64 scalar
        n("Cast", ["n_tokens"], ["n_f"], to=TensorProto.FLOAT),
        n("Div", ["row_sum", "n_f"], ["row_mean"]),
        n("Sub", ["M", "row_mean"], ["centred"]),
        n("Relu", ["centred"], ["A"]),
        # demand weights w = exp(tau * minmax(r)); a constant r gives ones       -> w_col [n, 1]
        n("ReduceMin", ["relevance"], ["r_min"], keepdims=0),
        n("ReduceMax", ["relevance"], ["r_max"], keepdims=0),
        n("Sub", ["r_max", "r_min"], ["span"]),
        n("Greater", ["span", "zero_f"], ["has_span"]),
        n("Where", ["has_span", "span", "one_f"], ["safe_span"]),
        n("Sub", ["relevance", "r_min"], ["r_shift"]),
        n("Div", ["r_shift", "safe_span"], ["r_scaled"]),
        n("Where", ["has_span", "r_scaled", "zero_f"], ["r_unit"]),
        n("Mul", ["r_unit", "tau"], ["logit"]),
        n("Exp", ["logit"], ["w"]),
        n("Reshape", ["w", "shape_col"], ["w_col"]),
        # tie window tie_rtol(n, float32) = min(n + 1, 8) * eps32, relative to each step's best gain
        n("Add", ["n_f", "one_f"], ["n_plus_1"]),
        n("Min", ["n_plus_1", "max_tie_ulps"], ["tie_ulps"]),
        n("Mul", ["tie_ulps", "eps32"], ["tie_rtol"]),
        # loop state and constants the body reads from the outer scope
        n("Range", ["zero_i", "n_tokens", "one_i"], ["index"]),
        n("Reshape", ["index", "shape_row"], ["index_row"]),  # [1, n] int64
        n("Sub", ["n_tokens", "index"], ["rank"]),
        n("Cast", ["rank"], ["rank_f"], to=TensorProto.FLOAT),
        n("Reshape", ["rank_f", "shape_row"], ["rank_row"]),  # n - index, so the lowest index ranks highest
        n("Reshape", ["n_tokens", "shape_1"], ["n_1d"]),
        n("ConstantOfShape", ["n_1d"], ["c0"], value=numpy_helper.from_array(np.zeros(1, np.float32))),
        n("Equal", ["index_row", "n_tokens"], ["taken0"]),  # all false, [1, n]
        n("Min", ["budget", "n_tokens"], ["trip_count"]),
        # exactly min(budget, n) iterations: the condition starts true and the body passes it through unchanged,
        # so TensorRT's "trip limit and termination condition" warning (scan outputs shorter than the trip
        # limit) cannot apply. Its parser rejects an omitted condition ("Node input was not registered").
        n("Loop", ["trip_count", "true", "c0", "taken0"], ["c_final", "taken_final", "picks"],
          body=_loop_body()),
        # sort the picks ascending: TopK on float32 (exact for n < 2^24) sorts where int64 TopK is not portable
        n("Reshape", ["picks", "shape_1_neg"], ["picks_flat"]),
        n("Cast", ["picks_flat"], ["picks_f"], to=TensorProto.FLOAT),
        n("Reshape", ["trip_count", "shape_1"], ["k_1d"]),
        n("TopK", ["picks_f", "k_1d"], ["sorted_f", "sorted_pos"], axis=0, largest=0, sorted=1),
        n("Cast", ["sorted_f"], ["keep"], to=TensorProto.INT64),
    ]
    graph = helper.make_graph(
        nodes,
        "coverage_selector",
        inputs=inputs,
        outputs=selector_outputs(),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="coverpruner")
    model.ir_version = min(model.ir_version, 8 if opset <= 17 else 9)  # loadable by older onnxruntime builds
    onnx.checker.check_model(model)
    return model
