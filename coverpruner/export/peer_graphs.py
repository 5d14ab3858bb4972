"""selector_dart.onnx / selector_cdpruner.onnx: the peers' selectors (coverpruner.selection.dart / .cdpruner) as
standard-op ONNX graphs for ONNX Runtime and TensorRT-RTX's parser, written like selector.onnx (selector_graph.py):
one Loop of exactly m = min(budget, n) iterations whose condition is a constant true, ties to the lowest index as
the minimum of the tied indices in float32 (exact below 2^24), the picks sorted by a TopK on float32 outside the
loop, no NonZero, both branches of an If of equal shapes.

Inputs  image_features [n, d] float32|float16, budget int64 scalar, and
        dart:      pivots int64 scalar (1 ..; min(pivots, m) pivots)
        cdpruner:  relevance [n] float32, relevance_weight float32 scalar in [0, 1]
Output  keep [m] int64, ascending

Everything runs in float32 (numpy: float64), so only float32 near-ties (values within TIE_ULPS float32 ulps of the
best, relative to the value's scale) can break differently. CDPruner's "no volume left" line is the numpy
backend's (cdpruner.EXHAUSTED_RTOL, chosen above float32's rounding of the incremental gains).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from coverpruner.export.selector_io import FLOAT_TYPES, selector_outputs
from coverpruner.export.selector_nodes import (const, consts, lowest_tied, minmax_relevance, selector_model,
                                               sorted_keep, unit_rows, value)
from coverpruner.selection.cdpruner import EXHAUSTED_RTOL
from coverpruner.selection.ties import EPS32

#: float32 ulps (relative to the scale: the largest L1 norm, 1 for cosines, the largest L_ii) within which values
#: tie; the float32 selector.onnx uses 8 too (selection.ties.tie_rtol)
TIE_ULPS = 8.0
METHODS = ("dart", "cdpruner")


def _lowest_best(prefix: str, score: str, window: str) -> list:
    """Nodes: int64 scalar f"{prefix}_k" = the lowest index whose `score` is within `window` of the max (reads the
    outer index_f [n] and n_f)."""
    n = helper.make_node
    return [
        n("ReduceMax", [score], [f"{prefix}_best"], keepdims=0),
        n("Sub", [f"{prefix}_best", window], [f"{prefix}_floor"]),
        *lowest_tied(prefix, score, f"{prefix}_floor", "index_f", f"{prefix}_k"),
    ]


def _common(opset: int) -> list:
    """Unit rows vn [n, d] float32 (selector_nodes.unit_rows), n_tokens / n_f / index_f [n] / trip_count, shared
    constants."""
    n = helper.make_node
    return [
        *consts("eps", "zero_i", "one_i", "zero_f", "one_f", "neg_inf", "true", "axis1", "shape_1", "shape_1_neg",
                "shape_col"),
        const("neg_inf_1", [-np.inf], np.float32),
        const("tie_rtol", TIE_ULPS * EPS32, np.float32),
        *unit_rows(opset),
        n("Range", ["zero_i", "n_tokens", "one_i"], ["index"]),
        n("Cast", ["index"], ["index_f"], to=TensorProto.FLOAT),
        n("Reshape", ["n_tokens", "shape_1"], ["n_1d"]),
        n("Min", ["budget", "n_tokens"], ["trip_count"]),
    ]


def _mask(prefix: str, vec: str, k: str, out: str) -> list:
    """out = vec with entry k set to -inf."""
    n = helper.make_node
    return [n("Reshape", [k, "shape_1"], [f"{prefix}_k1"]),
            n("ScatterElements", [vec, f"{prefix}_k1", "neg_inf_1"], [out], axis=0)]


def _cdpruner_body() -> onnx.GraphProto:
    """State: c [m, n] (row t = e of step t, zeros before), gain [n] (d_i^2, -inf when picked), quality [n]
    (L_ii, -inf when picked). Scan output: the pick."""
    n = helper.make_node
    nodes = [
        n("ReduceMax", ["gain_in"], ["g_best"], keepdims=0),
        n("LessOrEqual", ["g_best", "exhausted_at"], ["exhausted"]),
        n("Where", ["exhausted", "quality_in", "gain_in"], ["score"]),  # no volume left: largest L_ii next
        *_lowest_best("s", "score", "window"),
        # row j of L: S_j * (w q_j q + (1 - w))
        n("Gather", ["sim", "s_k"], ["s_row"], axis=0),  # [n]
        n("Gather", ["mix", "s_k"], ["mix_j"], axis=0),
        n("Mul", ["q", "mix_j"], ["row_scale_q"]),
        n("Add", ["row_scale_q", "one_minus_w"], ["row_scale"]),
        n("Mul", ["s_row", "row_scale"], ["l_row"]),
        # e = (L_j - c_j^T C) / d_j; rows of C not yet written are zero
        n("Gather", ["c_in", "s_k"], ["c_j"], axis=1),  # [m]
        n("Reshape", ["c_j", "shape_row"], ["c_j_row"]),  # [1, m]
        n("MatMul", ["c_j_row", "c_in"], ["proj_row"]),  # [1, n]
        n("Reshape", ["proj_row", "shape_1_neg"], ["proj"]),
        n("Sub", ["l_row", "proj"], ["resid"]),
        n("Gather", ["gain_in", "s_k"], ["g_j"], axis=0),
        n("Max", ["g_j", "tiny"], ["g_j_pos"]),
        n("Sqrt", ["g_j_pos"], ["d_j"]),
        n("Div", ["resid", "d_j"], ["e_raw"]),
        n("Where", ["exhausted", "zeros_n", "e_raw"], ["e"]),
        n("Reshape", ["iter", "shape_11"], ["iter_11"]),
        n("Reshape", ["e", "shape_row"], ["e_row"]),
        n("ScatterND", ["c_in", "iter_11", "e_row"], ["c_out"]),
        n("Mul", ["e", "e"], ["e_sq"]),
        n("Sub", ["gain_in", "e_sq"], ["gain_sub"]),
        *_mask("g", "gain_sub", "s_k", "gain_out"),
        *_mask("q", "quality_in", "s_k", "quality_out"),
        n("Identity", ["cond_in"], ["cond_out"]),
        n("Identity", ["s_k"], ["pick"]),
    ]
    return helper.make_graph(
        nodes, "cdpruner_step",
        inputs=[value("iter", TensorProto.INT64, []), value("cond_in", TensorProto.BOOL, []),
                value("c_in", TensorProto.FLOAT, ["m", "n"]), value("gain_in", TensorProto.FLOAT, ["n"]),
                value("quality_in", TensorProto.FLOAT, ["n"])],
        outputs=[value("cond_out", TensorProto.BOOL, []), value("c_out", TensorProto.FLOAT, ["m", "n"]),
                 value("gain_out", TensorProto.FLOAT, ["n"]), value("quality_out", TensorProto.FLOAT, ["n"]),
                 value("pick", TensorProto.INT64, [])])


def build_cdpruner_model(float_dtype: str = "float32", opset: int = 17) -> onnx.ModelProto:
    """selector_cdpruner.onnx: conditional-DPP fast greedy MAP (coverpruner.selection.cdpruner) in float32."""
    n = helper.make_node
    nodes = [
        *_common(opset),
        const("shape_row", [1, -1], np.int64),
        const("shape_11", [1, 1], np.int64),
        const("tiny", np.finfo(np.float32).tiny, np.float32),
        const("exhausted_rtol", EXHAUSTED_RTOL, np.float32),
        *minmax_relevance("q", "one_f"),  # q = minmax(relevance), ones for a constant relevance
        n("Mul", ["q", "relevance_weight"], ["mix"]),  # L_ji = S_ji (mix_j q_i + (1 - w))
        n("Sub", ["one_f", "relevance_weight"], ["one_minus_w"]),
        # L_ii = S_ii (mix_i q_i + 1 - w), S_ii = 1 exactly (0 for an all-zero row), as the numpy backend
        n("Greater", ["norm_raw", "zero_f"], ["nonzero_col"]),
        n("Cast", ["nonzero_col"], ["nonzero_f"], to=TensorProto.FLOAT),
        n("Reshape", ["nonzero_f", "shape_1_neg"], ["vn_sq_n"]),
        n("Mul", ["mix", "q"], ["mix_q"]),
        n("Add", ["mix_q", "one_minus_w"], ["diag_scale"]),
        n("Mul", ["vn_sq_n", "diag_scale"], ["diag"]),
        n("ReduceMax", ["diag"], ["top"], keepdims=0),
        # S = Vn Vn^T once ([n, n] float32, the coverage selector's size): faster than a [n, d] pass per pick, which
        # is memory-bound (measured at n = 576 and 2,880, benchmarks/bench_peer_selectors.py)
        n("Gemm", ["vn", "vn"], ["sim"], transB=1),  # Gemm: ORT's FusedMatMul of a Transpose was 2x slower
        n("Mul", ["top", "exhausted_rtol"], ["exhausted_at"]),
        n("Mul", ["top", "tie_rtol"], ["window"]),
        n("ConstantOfShape", ["n_1d"], ["zeros_n"], value=numpy_helper.from_array(np.zeros(1, np.float32))),
        n("Reshape", ["trip_count", "shape_1"], ["m_1d"]),
        n("Concat", ["m_1d", "n_1d"], ["c_shape"], axis=0),
        n("ConstantOfShape", ["c_shape"], ["c0"], value=numpy_helper.from_array(np.zeros(1, np.float32))),
        n("Loop", ["trip_count", "true", "c0", "diag", "diag"], ["c_final", "gain_final", "quality_final", "picks"],
          body=_cdpruner_body()),
        *sorted_keep(),
    ]
    inputs = [value("image_features", FLOAT_TYPES[float_dtype], ["n", "d"]),
              value("relevance", TensorProto.FLOAT, ["n"]), value("budget", TensorProto.INT64, []),
              value("relevance_weight", TensorProto.FLOAT, [])]
    return selector_model(nodes, "cdpruner_selector", inputs, selector_outputs(), opset)


def _dart_body() -> onnx.GraphProto:
    """State: kept [n] float32 (1 when kept), dup [n] (cosines to the current pivot), owner int64 (the pivot
    position dup belongs to). Step t < p: the largest L1 norm; after: pivot position o(t) of the quota split, its
    cosines recomputed when o changes (If), the lowest one among the unkept. Scan output: the pick."""
    n = helper.make_node
    recompute = helper.make_graph(
        [n("Gather", ["picks_so_far", "o_t"], ["pivot"], axis=0),
         n("Gather", ["vn", "pivot"], ["u_p"], axis=0),
         n("Reshape", ["u_p", "shape_col"], ["u_p_col"]),
         n("MatMul", ["vn", "u_p_col"], ["dup_col"]),
         n("Reshape", ["dup_col", "shape_1_neg"], ["dup_new"])],
        "pivot_cosines", inputs=[], outputs=[value("dup_new", TensorProto.FLOAT, ["n"])])
    keep_dup = helper.make_graph([n("Identity", ["dup_in"], ["dup_same"])], "same_pivot", inputs=[],
                                 outputs=[value("dup_same", TensorProto.FLOAT, ["n"])])
    nodes = [
        n("Identity", ["picks_so_far_in"], ["picks_so_far"]),  # before the If whose branch reads it
        n("Less", ["iter", "p"], ["is_pivot"]),
        # pivot position of step t >= p: t' = t - p; the first `extra` pivots own base + 1 picks each
        n("Sub", ["iter", "p"], ["t_rest"]),
        n("Div", ["t_rest", "base_plus_1"], ["o_big"]),
        n("Sub", ["t_rest", "big_span"], ["t_small"]),
        n("Div", ["t_small", "base_safe"], ["o_small_rel"]),
        n("Add", ["o_small_rel", "extra"], ["o_small"]),
        n("Less", ["t_rest", "big_span"], ["in_big"]),
        n("Where", ["in_big", "o_big", "o_small"], ["o_rest"]),
        n("Where", ["is_pivot", "minus_one", "o_rest"], ["o_t"]),
        n("Equal", ["o_t", "owner_in"], ["same_owner"]),
        n("Or", ["same_owner", "is_pivot"], ["no_recompute"]),
        n("If", ["no_recompute"], ["dup"], then_branch=keep_dup, else_branch=recompute),
        n("Neg", ["dup"], ["neg_dup"]),
        n("Where", ["is_pivot", "l1", "neg_dup"], ["score_raw"]),  # pivots: largest norm; then: lowest cosine
        n("Where", ["is_pivot", "l1_window", "cos_window"], ["window"]),
        n("Greater", ["kept_in", "zero_f"], ["taken"]),
        n("Where", ["taken", "neg_inf", "score_raw"], ["score"]),
        *_lowest_best("s", "score", "window"),
        n("Reshape", ["s_k", "shape_1"], ["s_k1"]),
        n("ScatterElements", ["kept_in", "s_k1", "one_f_1"], ["kept_out"], axis=0),
        n("Reshape", ["iter", "shape_1"], ["iter_1"]),
        n("ScatterElements", ["picks_so_far_in", "iter_1", "s_k1"], ["picks_so_far_out"], axis=0),
        n("Identity", ["dup"], ["dup_out"]),
        n("Identity", ["o_t"], ["owner_out"]),
        n("Identity", ["cond_in"], ["cond_out"]),
        n("Identity", ["s_k"], ["pick"]),
    ]
    return helper.make_graph(
        nodes, "dart_step",
        inputs=[value("iter", TensorProto.INT64, []), value("cond_in", TensorProto.BOOL, []),
                value("kept_in", TensorProto.FLOAT, ["n"]), value("dup_in", TensorProto.FLOAT, ["n"]),
                value("owner_in", TensorProto.INT64, []), value("picks_so_far_in", TensorProto.INT64, ["m"])],
        outputs=[value("cond_out", TensorProto.BOOL, []), value("kept_out", TensorProto.FLOAT, ["n"]),
                 value("dup_out", TensorProto.FLOAT, ["n"]), value("owner_out", TensorProto.INT64, []),
                 value("picks_so_far_out", TensorProto.INT64, ["m"]), value("pick", TensorProto.INT64, [])])


def build_dart_model(float_dtype: str = "float32", opset: int = 17) -> onnx.ModelProto:
    """selector_dart.onnx: DART's pivots and duplication picks (coverpruner.selection.dart) in float32."""
    n = helper.make_node
    nodes = [
        *_common(opset),
        const("minus_one", -1, np.int64),
        const("one_f_1", [1.0], np.float32),
        n("Abs", ["v"], ["v_abs"]),
        n("ReduceSum", ["v_abs", "axis1"], ["l1_col"], keepdims=1),
        n("Reshape", ["l1_col", "shape_1_neg"], ["l1"]),
        n("ReduceMax", ["l1"], ["l1_max"], keepdims=0),
        n("Mul", ["l1_max", "tie_rtol"], ["l1_window"]),
        n("Identity", ["tie_rtol"], ["cos_window"]),
        # p = min(pivots, m); quotas: base = (m - p) // p, the first extra = (m - p) % p pivots one more
        n("Min", ["pivots", "trip_count"], ["p"]),
        n("Sub", ["trip_count", "p"], ["rest"]),
        n("Div", ["rest", "p"], ["base"]),
        n("Mod", ["rest", "p"], ["extra"]),
        n("Add", ["base", "one_i"], ["base_plus_1"]),
        n("Mul", ["extra", "base_plus_1"], ["big_span"]),
        n("Max", ["base", "one_i"], ["base_safe"]),  # base 0: every rest pick falls in the big span
        n("ConstantOfShape", ["n_1d"], ["kept0"], value=numpy_helper.from_array(np.zeros(1, np.float32))),
        n("Reshape", ["trip_count", "shape_1"], ["m_1d"]),
        n("ConstantOfShape", ["m_1d"], ["picks0"], value=numpy_helper.from_array(np.zeros(1, np.int64))),
        n("Loop", ["trip_count", "true", "kept0", "kept0", "minus_one", "picks0"],
          ["kept_final", "dup_final", "owner_final", "picks_final", "picks"], body=_dart_body()),
        *sorted_keep(),
    ]
    inputs = [value("image_features", FLOAT_TYPES[float_dtype], ["n", "d"]),
              value("budget", TensorProto.INT64, []), value("pivots", TensorProto.INT64, [])]
    return selector_model(nodes, "dart_selector", inputs, selector_outputs(), opset)


def build_peer_selector_model(method: str, float_dtype: str = "float32", opset: int = 17) -> onnx.ModelProto:
    """The selector graph of peer method `method` ("dart" or "cdpruner")."""
    if float_dtype not in FLOAT_TYPES:
        raise ValueError(f"float_dtype must be one of {sorted(FLOAT_TYPES)}, got {float_dtype!r}")
    if method == "dart":
        return build_dart_model(float_dtype, opset)
    if method == "cdpruner":
        return build_cdpruner_model(float_dtype, opset)
    raise ValueError(f"no selector graph for method {method!r}; peer graphs exist for {list(METHODS)}")
