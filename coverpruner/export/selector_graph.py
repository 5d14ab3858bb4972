"""selector.onnx: the coverage selector as a standard-op ONNX graph (a Loop), portable to ONNX Runtime and to
TensorRT's ONNX parser.

Inputs  image_features [n, d] float32|float16, relevance [n] float32, budget int64 scalar, tau float32 scalar
Output  keep [m] int64, ascending, m = min(budget, n)

Written for TensorRT's parser as well as ORT: the Loop runs exactly min(budget, n) iterations (trip count
min(budget, n); its condition is the constant true passed through the body unchanged, so there is no early exit
and the scan output always has the trip count's length), there is no NonZero, TopK's K is a constant (the gain
bounds are carried padded to n + K with -inf; TensorRT-RTX's Myelin rejects a K computed from n inside the loop),
both Ifs have branches of equal output shapes, and no Loop sits inside an If. Ties go to the lowest index without
relying on ArgMax's or TopK's tie order: among gains within tie_rtol(n, float32) * best of the best
(coverpruner.selection's rule with a float32 window of at most 8 ulps), the lowest index is the minimum of the
tied indices (as float32, exact below 2^24).

Similarity (a top-level If on n): A^T[k, i] = relu(M[k, i] - mu_i), M = Vn Vn^T. For SYMMETRIC_MIN_N <= n <=
SYMMETRIC_MAX_N (_symmetric_branch) Vn's rows are split into SYMMETRIC_BLOCKS = B blocks and only the B (B + 1) / 2
block GEMMs on and above the diagonal run; the blocks below are Transposes of those above (M is symmetric), each
block adds its own column means, and Concat assembles A^T. Above SYMMETRIC_MAX_N one GEMM takes -mu as its bias
and ORT fuses the Relu (_single_gemm_branch): the symmetric form holds ~2 [n, n] buffers at once, the single GEMM
one. Either way every entry is one float32 dot product plus its bias.

Each step is the lazy greedy (_loop_body): gains only fall as coverage rises, so last-computed gains bound the
current ones; the K = LAZY_CANDIDATES highest bounds are re-summed from scratch (K x n work) and decide the step
unless the lowest of their bounds (which bounds every gain outside them) could reach the tie window of their best,
in which case every gain is re-summed (the If's other branch, n x n work, as the old graph did at every step).
Everything runs in float32 and every gain that decides a pick is a fresh sum; the numpy reference runs in float64,
so only genuine float32 near-ties (gains within a few float32 roundings) can break differently. Taken tokens are
those whose bound is -inf (no separate mask is carried).

Measured (ORT CPU, the pipeline's non-spinning session, 2-core machine, LLaVA-NeXT's real features at n = 2,880,
d = 4,096, m = 320; docs/performance.md "The select stage"): before this layout 539 ms in the pipeline (one
[n, n] GEMM ~394 ms, Loop ~125 ms, norms ~20 ms); the [n, n] part alone is one GEMM ~395 ms vs the B = 2 / 3 / 4
block forms ~310 / ~275 / ~270 ms, and B = 4 with 20 body nodes (was 29, plus 8 in the decided branch, now 6)
gives the figures in docs/performance.md. At n = 2,880 11 of the 320 steps re-sum every gain with K = 64 (13 with
K = 32, 22 with K = 16): the first ~15 picks each lower thousands of stale bounds below the best, which no
constant K avoids; at 8,192 a smaller K's extra full passes (n^2 each) cost more than it saves per step.
Each body node costs ORT a few microseconds per step whatever its size (MatMul with a 1-D w was 25x slower than
with [n, 1]: kept 2-D).

Memory: A^T [n, n] float32 is the only n x n tensor of the single-GEMM branch (1 GiB + V's normalized copy at
n = 16,384, docs/performance.md); the symmetric branch holds its blocks and A^T (2 x 256 MiB at 8,192). The row
means come from Vn (sum_k Vn_k) / n (no pass over M). The fallback re-sums A^T in FULL_BLOCKS row blocks,
unrolled (TensorRT-RTX 1.7's builder rejects a Loop nested in the If inside the selection Loop). The earlier graph
kept M, A^T and two [n, n] fallback temporaries apart (5.4 GiB at n = 16,384).
"""


from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from coverpruner.export.selector_io import selector_inputs, selector_outputs
from coverpruner.export.selector_nodes import (const, consts, lowest_tied, minmax_relevance, selector_model,
                                               sorted_keep, unit_rows, value)
from coverpruner.selection.coverage import EPS32


#: candidates whose gains each step re-sums (the K highest bounds); the step falls back to every gain only when
#: the K-th bound (>= every bound left out) could still reach the best fresh gain's tie window. 64: at n = 8,192,
#: m = 819, K = 32 took 22 full passes (n^2 each) against 14 and a slower Loop (835 vs 683 ms profiled); at
#: n = 2,880, m = 320 K = 32 saved ~5 ms (13 vs 11 full passes) and K = 16 cost ~30 ms more (22)
LAZY_CANDIDATES = 64
#: float32 bounds stay bounds up to this many ulps (a sum of non-negative terms that only fall, in one reduction
#: order, cannot rise; the slack covers a different order for the fallback's [n, n] reduction)
BOUND_ULPS = 16.0
#: row blocks of Vn for the symmetric similarity (_symmetric_branch): B (B + 1) / 2 block GEMMs instead of one
#: [n, n] GEMM, the blocks below the diagonal transposed from those above
SYMMETRIC_BLOCKS = 4
#: n range of the symmetric similarity: its blocks and their concatenation hold ~2 [n, n] float32 buffers at
#: once (512 MiB at 8,192), so larger n keep the single fused GEMM (one buffer: 1 GiB at 16,384); below the
#: minimum the GEMM takes microseconds and the block nodes would cost more than they save
SYMMETRIC_MIN_N = 64
SYMMETRIC_MAX_N = 8192
#: row blocks of A^T when a step re-sums every gain (ceil(n / 32) rows each: a [512, n] float32 temporary, 32 MiB,
#: at n = 16,384)
FULL_BLOCKS = 32


def _fresh_branch() -> onnx.GraphProto:
    """If-branch taken when the K re-summed gains decide the step: the pick is the lowest index among those
    within the tie window of their best. Outputs: bounds [n + K] (the fresh gains scattered in), k [] int64."""
    n = helper.make_node
    nodes = [
        n("ScatterElements", ["ub_in", "cand_idx", "fresh"], ["ub_fresh"], axis=0),
        # lowest index in the window: ReduceMin of the tied indices as float32, n for the others
        n("Cast", ["cand_idx"], ["cand_idx_f"], to=TensorProto.FLOAT),
        *lowest_tied("cand", "fresh", "threshold", "cand_idx_f", "k_fresh"),
    ]
    return helper.make_graph(nodes, "decided_by_candidates", inputs=[],
                             outputs=[value("ub_fresh", TensorProto.FLOAT, ["n_plus_k"]),
                                      value("k_fresh", TensorProto.INT64, [])])


def _block_sums() -> list:
    """Every gain sum_i w_i relu(A^T[k, i] - c_i), k < n, as FULL_BLOCKS blocks of b = ceil(n / FULL_BLOCKS) rows
    of A^T written one after another into ``gain_all_raw`` [n] (block j's rows ``blk_idx_<j>``, made outside the
    loop; the last blocks overlap when n is not a multiple and write equal values again). [b, n] temporaries
    instead of [n, n] ones: 32 MiB at n = 16,384. Unrolled rather than a Loop: TensorRT-RTX 1.7's builder fails
    its graph-scope analysis on a Loop inside this If inside the selection Loop."""
    n = helper.make_node
    nodes, prev = [], "c0"
    for j in range(FULL_BLOCKS):
        out = "gain_all_raw" if j == FULL_BLOCKS - 1 else f"blk_gains_{j}"
        nodes += [
            n("Gather", ["At", f"blk_idx_{j}"], [f"blk_at_{j}"], axis=0),  # [b, n]
            n("Sub", [f"blk_at_{j}", "c_in"], [f"blk_excess_{j}"]),
            n("Relu", [f"blk_excess_{j}"], [f"blk_uncovered_{j}"]),
            # [b, n] x [n, 1]: ORT's MatMul with a 1-D w is ~25x slower here (measured)
            n("MatMul", [f"blk_uncovered_{j}", "w_col"], [f"blk_gain_col_{j}"]),  # [b, 1]
            n("Reshape", [f"blk_gain_col_{j}", "shape_1_neg"], [f"blk_gain_{j}"]),
            n("ScatterElements", [prev, f"blk_idx_{j}", f"blk_gain_{j}"], [out], axis=0),
        ]
        prev = out
    return nodes


def _full_branch() -> onnx.GraphProto:
    """If-branch when a stale bound outside the K could still reach the tie window: every gain re-summed, as the
    literal greedy does, and the lowest index within the window of the best. Taken tokens are those whose bound
    is -inf. Outputs as _fresh_branch."""
    n = helper.make_node
    nodes = [
        *_block_sums(),  # gain_all_raw [n]: every gain, FULL_BLOCKS row blocks of A^T one after another
        n("Concat", ["gain_all_raw", "neg_inf_k"], ["gain_all_pad"], axis=0),  # [n + K], padded like ub
        n("Equal", ["ub_in", "neg_inf"], ["ub_dead"]),  # taken or padding
        n("Where", ["ub_dead", "neg_inf", "gain_all_pad"], ["ub_full"]),
        n("ReduceMax", ["ub_full"], ["best_all"], keepdims=0),  # [] >= 0: an untaken token is left
        n("Mul", ["best_all", "tie_rtol"], ["window_all"]),
        n("Sub", ["best_all", "window_all"], ["threshold_all"]),
        *lowest_tied("all", "ub_full", "threshold_all", "index_pad_f", "k_full"),  # the lowest tied index
    ]
    return helper.make_graph(nodes, "decided_by_all_gains", inputs=[],
                             outputs=[value("ub_full", TensorProto.FLOAT, ["n_plus_k"]),
                                      value("k_full", TensorProto.INT64, [])])


def _symmetric_branch() -> onnx.GraphProto:
    """If-branch for SYMMETRIC_MIN_N <= n <= SYMMETRIC_MAX_N: A^T [n, n] float32 from the GEMMs of the blocks on
    and above the diagonal only. M = Vn Vn^T is symmetric, so with Vn's rows split into B blocks (block j: rows
    floor(j n / B) .. floor((j + 1) n / B), none empty for n >= B) the block (q, p) below the diagonal is the
    transpose of the product Vn_p Vn_q^T above it; each block then gets its own column means (-mu of its column
    block) and Relu, and Concat assembles the rows. Every entry is still one float32 dot product plus its bias.
    Outer scope: vn [n, d], neg_mean_row [1, n], n_tokens. Output: at_sym [n, n] float32."""
    n = helper.make_node
    blocks = SYMMETRIC_BLOCKS
    nodes = [const("sym_blocks", [blocks], np.int64), const("sym_axis1", [1], np.int64),
             n("Reshape", ["n_tokens", "shape_1"], ["sym_n_1d"])]
    for j in range(blocks + 1):
        # block boundary floor(j n / B) as a [1] tensor for Slice
        nodes += [const(f"sym_j_{j}", [j], np.int64),
                  n("Mul", [f"sym_j_{j}", "sym_n_1d"], [f"sym_jn_{j}"]),
                  n("Div", [f"sym_jn_{j}", "sym_blocks"], [f"sym_start_{j}"])]
    for j in range(blocks):
        nodes += [n("Slice", ["vn", f"sym_start_{j}", f"sym_start_{j + 1}", "axis0"], [f"sym_vn_{j}"]),  # [b_j, d]
                  n("Slice", ["neg_mean_row", f"sym_start_{j}", f"sym_start_{j + 1}", "sym_axis1"],
                    [f"sym_nm_{j}"])]  # [1, b_j]
    for p in range(blocks):
        # the diagonal block: one GEMM with its bias (ORT fuses the Relu)
        nodes += [n("Gemm", [f"sym_vn_{p}", f"sym_vn_{p}", f"sym_nm_{p}"], [f"sym_x_{p}_{p}"], transB=1),
                  n("Relu", [f"sym_x_{p}_{p}"], [f"sym_a_{p}_{p}"])]
        for q in range(p + 1, blocks):
            # M_pq = Vn_p Vn_q^T without a bias: block (p, q) subtracts mu of the columns q, its transpose
            # (q, p) mu of the columns p
            nodes += [n("Gemm", [f"sym_vn_{p}", f"sym_vn_{q}"], [f"sym_m_{p}_{q}"], transB=1),  # [b_p, b_q]
                      n("Add", [f"sym_m_{p}_{q}", f"sym_nm_{q}"], [f"sym_x_{p}_{q}"]),
                      n("Relu", [f"sym_x_{p}_{q}"], [f"sym_a_{p}_{q}"]),
                      n("Transpose", [f"sym_m_{p}_{q}"], [f"sym_m_{q}_{p}"], perm=[1, 0]),  # [b_q, b_p]
                      n("Add", [f"sym_m_{q}_{p}", f"sym_nm_{p}"], [f"sym_x_{q}_{p}"]),
                      n("Relu", [f"sym_x_{q}_{p}"], [f"sym_a_{q}_{p}"])]
    nodes += [n("Concat", [f"sym_a_{p}_{q}" for q in range(blocks)], [f"sym_row_{p}"], axis=1)  # [b_p, n]
              for p in range(blocks)]
    nodes.append(n("Concat", [f"sym_row_{p}" for p in range(blocks)], ["at_sym"], axis=0))
    return helper.make_graph(nodes, "symmetric_blocks", inputs=[],
                             outputs=[value("at_sym", TensorProto.FLOAT, ["n", "n"])])


def _single_gemm_branch() -> onnx.GraphProto:
    """If-branch for other n: A^T [n, n] float32 as one GEMM with -mu as its bias C, the only [n, n] tensor
    (ORT fuses the Relu into the Gemm). Outer scope: vn [n, d], neg_mean_row [1, n]. Output: at_gemm [n, n]."""
    n = helper.make_node
    nodes = [n("Gemm", ["vn", "vn", "neg_mean_row"], ["centred"], transB=1),  # [n, n]: M[k, i] - mu_i
             n("Relu", ["centred"], ["at_gemm"])]
    return helper.make_graph(nodes, "single_gemm", inputs=[],
                             outputs=[value("at_gemm", TensorProto.FLOAT, ["n", "n"])])


def _loop_body() -> onnx.GraphProto:
    """One lazy greedy step. Carried: c [n] float32 coverage, ub [n + K] float32 upper bounds of the gains (stale
    fresh sums; -inf once taken, and for the K padding entries). Scan output: the pick k [1] int64.

    Gains only fall as coverage rises (the objective is monotone submodular), so a gain summed at an earlier
    step bounds it now. The K highest bounds are re-summed; the lowest of them bounds every gain outside the K,
    so if it cannot reach the tie window of the best fresh gain, the pick is among the K (lowest index in the
    window), else every gain is re-summed (the If's other branch). Vectors are 1-D: TensorRT-RTX 1.7's Myelin
    rejects a loop-carried [n, 1] tensor broadcast against A (CHECK(dim_count == stride_order.size())). Every
    node here runs m times (ORT: a few microseconds each whatever its size), hence the few of them.
    """
    n = helper.make_node
    nodes = [
        # ub is carried padded to [n + K] with -inf, so TopK's K is a constant (TensorRT-RTX's Myelin rejects a
        # K computed from n inside the loop) and always <= the axis; taken and padding entries hold -inf
        n("TopK", ["ub_in", "lazy_k_1"], ["top_ub", "cand_idx"], axis=0, largest=1, sorted=1),  # [K]
        # every bound outside the K is <= the lowest bound inside (-inf if a dead one is inside: all are dead)
        n("ReduceMin", ["top_ub"], ["next_ub"], keepdims=0),  # []
        n("Equal", ["top_ub", "neg_inf"], ["cand_dead"]),  # taken or padding
        n("Min", ["cand_idx", "n_minus_1"], ["cand_row"]),  # a valid row for padding entries
        # fresh gains of the K: sum_i w_i relu(A^T[k, i] - c_i)
        n("Gather", ["At", "cand_row"], ["cand_rows"], axis=0),  # [K, n]
        n("Sub", ["cand_rows", "c_in"], ["excess"]),
        n("Relu", ["excess"], ["uncovered"]),
        # [K, n] x [n, 1] and a Reshape: ORT's MatMul with a 1-D w instead took 1.3 ms a step at n = 2,880
        n("MatMul", ["uncovered", "w_col"], ["fresh_col"]),  # [K, 1]
        n("Reshape", ["fresh_col", "shape_1_neg"], ["fresh_raw"]),  # [K]
        n("Where", ["cand_dead", "neg_inf", "fresh_raw"], ["fresh"]),
        n("ReduceMax", ["fresh"], ["best"], keepdims=0),  # [] >= 0: an untaken token is among the K
        n("Mul", ["best", "tie_rtol"], ["window"]),
        n("Sub", ["best", "window"], ["threshold"]),
        n("Mul", ["next_ub", "bound_grow"], ["next_bound"]),
        n("Less", ["next_bound", "threshold"], ["decided"]),  # [] bool
        n("If", ["decided"], ["ub_step", "k"], then_branch=_fresh_branch(), else_branch=_full_branch()),
        # c <- max(c, A[:, k]) = max(c, A^T[k]); k's bound -inf (taken)
        n("Gather", ["At", "k"], ["a_k"], axis=0),  # [n]
        n("Max", ["c_in", "a_k"], ["c_out"]),
        n("Reshape", ["k", "shape_1"], ["k_out"]),  # [1]
        n("ScatterElements", ["ub_step", "k_out", "neg_inf_1"], ["ub_out"], axis=0),
        n("Identity", ["cond_in"], ["cond_out"]),  # never false: no early exit
    ]
    return helper.make_graph(
        nodes,
        "lazy_greedy_step",
        inputs=[
            value("iter", TensorProto.INT64, []),
            value("cond_in", TensorProto.BOOL, []),
            value("c_in", TensorProto.FLOAT, ["n"]),
            value("ub_in", TensorProto.FLOAT, ["n_plus_k"]),
        ],
        outputs=[
            value("cond_out", TensorProto.BOOL, []),
            value("c_out", TensorProto.FLOAT, ["n"]),
            value("ub_out", TensorProto.FLOAT, ["n_plus_k"]),
            value("k_out", TensorProto.INT64, [1]),
        ],
    )


def build_selector_loop_model(float_dtype: str = "float32", opset: int = 17) -> onnx.ModelProto:
    """The standard-op selector graph (see module docstring for the contract)."""
    inputs = selector_inputs(float_dtype)  # validates float_dtype
    if opset < 17:
        raise ValueError(f"opset must be >= 17, got {opset}")
    n = helper.make_node
    nodes = [
        *consts(*(("axis1",) if opset >= 18 else ()), "eps", "zero_f", "one_f", "eps32", "neg_inf", "axis0", "shape_1",
                "shape_1_neg", "shape_col", "zero_i", "one_i", "true"),
        const("max_tie_ulps", 8.0, np.float32),
        const("lazy_k_1", [LAZY_CANDIDATES], np.int64),
        const("lazy_k", LAZY_CANDIDATES, np.int64),
        const("neg_inf_k", np.full(LAZY_CANDIDATES, -np.inf), np.float32),
        const("bound_grow", 1.0 + BOUND_ULPS * EPS32, np.float32),
        # utilities A^T[k, i] = relu(M[k, i] - mu_i), M = Vn Vn^T the cosine similarity, mu_i its row mean
        # (M symmetric: row k = candidate k's utilities, so the loop gathers a candidate's utilities as one
        # contiguous row). mu = Vn (sum_k Vn_k) / n needs no [n, n] pass, and the Gemm adds -mu as its bias C,
        # so the GEMM's output is the only [n, n] tensor (ORT fuses the Relu into the Gemm; measured: one buffer).
        *unit_rows(opset),  # vn [n, d], n_tokens, n_f
        n("ReduceSum", ["vn", "axis0"], ["vn_sum"], keepdims=1),  # [1, d]
        n("Gemm", ["vn_sum", "vn"], ["row_sum"], transB=1),  # [1, n]: sum_k M[i, k] = Vn_i . sum_k Vn_k
        n("Div", ["row_sum", "n_f"], ["mean_row"]),  # [1, n]: mu_i
        n("Neg", ["mean_row"], ["neg_mean_row"]),
        const("sym_min_n", SYMMETRIC_MIN_N, np.int64),
        const("sym_max_n", SYMMETRIC_MAX_N, np.int64),
        n("GreaterOrEqual", ["n_tokens", "sym_min_n"], ["sym_above_min"]),
        n("LessOrEqual", ["n_tokens", "sym_max_n"], ["sym_below_max"]),
        n("And", ["sym_above_min", "sym_below_max"], ["sym_fits"]),
        n("If", ["sym_fits"], ["At"], then_branch=_symmetric_branch(), else_branch=_single_gemm_branch()),
        # demand weights w = exp(tau * minmax(r)); a constant r gives ones       -> w_col [n, 1]
        *minmax_relevance("r_unit", "zero_f"),
        n("Mul", ["r_unit", "tau"], ["logit"]),
        n("Exp", ["logit"], ["w"]),
        n("Reshape", ["w", "shape_col"], ["w_col"]),
        # tie window tie_rtol(n, float32) = min(n + 1, 8) * eps32, relative to each step's best gain
        n("Add", ["n_f", "one_f"], ["n_plus_1"]),
        n("Min", ["n_plus_1", "max_tie_ulps"], ["tie_ulps"]),
        n("Mul", ["tie_ulps", "eps32"], ["tie_rtol"]),
        # loop state and constants the body reads from the outer scope
        n("Sub", ["n_tokens", "one_i"], ["n_minus_1"]),
        n("Add", ["n_tokens", "lazy_k"], ["n_plus_k"]),
        n("Range", ["zero_i", "n_plus_k", "one_i"], ["index_pad"]),  # [n + K] int64
        n("Cast", ["index_pad"], ["index_pad_f"], to=TensorProto.FLOAT),  # exact below 2^24
        n("Reshape", ["n_tokens", "shape_1"], ["n_1d"]),
        n("Reshape", ["neg_inf", "shape_1"], ["neg_inf_1"]),
        n("ConstantOfShape", ["n_1d"], ["c0"], value=numpy_helper.from_array(np.zeros(1, np.float32))),
        n("MatMul", ["At", "w_col"], ["gain0_col"]),  # c = 0: the first gains, exact bounds
        n("Reshape", ["gain0_col", "shape_1_neg"], ["gain0"]),
        n("Concat", ["gain0", "neg_inf_k"], ["ub0"], axis=0),  # [n + K]
        # the fallback's row blocks of A^T (_block_sums): b = ceil(n / FULL_BLOCKS) rows, block j starts at
        # min(j * b, n - b)
        const("blk_count_minus_1", FULL_BLOCKS - 1, np.int64),
        const("blk_count", FULL_BLOCKS, np.int64),
        n("Add", ["n_tokens", "blk_count_minus_1"], ["blk_n_up"]),
        n("Div", ["blk_n_up", "blk_count"], ["blk_rows"]),
        n("Range", ["zero_i", "blk_rows", "one_i"], ["blk_offsets"]),  # [b]
        n("Sub", ["n_tokens", "blk_rows"], ["blk_last_start"]),
        *[node for j in range(FULL_BLOCKS) for node in (
            const(f"blk_j_{j}", j, np.int64),
            n("Mul", [f"blk_j_{j}", "blk_rows"], [f"blk_start_raw_{j}"]),
            n("Min", [f"blk_start_raw_{j}", "blk_last_start"], [f"blk_start_{j}"]),
            n("Add", ["blk_offsets", f"blk_start_{j}"], [f"blk_idx_{j}"]))],
        n("Min", ["budget", "n_tokens"], ["trip_count"]),
        # exactly min(budget, n) iterations: the condition starts true and the body passes it through unchanged,
        # so TensorRT's "trip limit and termination condition" warning (scan outputs shorter than the trip
        # limit) cannot apply. Its parser rejects an omitted condition ("Node input was not registered").
        n("Loop", ["trip_count", "true", "c0", "ub0"], ["c_final", "ub_final", "picks"],
          body=_loop_body()),
        *sorted_keep(),  # keep [m] ascending
    ]
    return selector_model(nodes, "coverage_selector", inputs, selector_outputs(), opset)
