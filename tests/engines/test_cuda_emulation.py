"""The CUDA selector's real kernels and C API (coverage_select.cu, greedy_core.cuh, similarity_gemm.cpp), built by
g++ against the CPU emulation of csrc/tests/cuda_cpu/ (CUDA threads as fibers, barriers and warp operations that
detect deadlock, a literal column-major GEMM for cuBLAS) and driven through the ctypes signatures of
coverpruner.engines.cuda_selector.

Each run checks: status; guard bytes after the workspace and the outputs untouched; keep sorted, distinct, in range;
keep == the literal float64 greedy (tests/literal_selection.py) on the kernel's own utilities and weights, read back
from the workspace; those utilities within float32 (fp16) rounding of the literal float64 ones; and the same keep and
the same workspace bytes in forward, reverse and random thread order. Mutant copies of the sources (a barrier
removed, a shuffle loop one step short, a block that is not a whole number of warps) must fail these checks."""

from __future__ import annotations

import ctypes
import shutil
from dataclasses import dataclass

import numpy as np
import pytest

from coverpruner.engines.cuda_selector import load_selector_library

from ..literal_selection import assert_same_or_not_worse, literal_greedy, utilities, weights
from .cuda_emulation import build_runtime, build_selector

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found on PATH")

ALIGN = 256  # coverage_workspace.h: every region starts on a 256-byte boundary
GUARD = 0xA5
SENTINEL = -7
ORDERS = {"forward": (0, 0), "reverse": (1, 0), "random": (2, 1234)}
U32 = 2.0 ** -24  # float32 unit roundoff
U16 = 2.0 ** -11  # float16 unit roundoff


def _align(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


class Emulated:
    """The emulated libcoverpruner_selector: the C API plus the emulator's hooks."""

    def __init__(self, path):
        self.lib = load_selector_library(path)
        self.lib.cp_emu_fault.restype = ctypes.c_char_p
        self.lib.cp_emu_set_order.argtypes = [ctypes.c_int, ctypes.c_uint]
        self.lib.cp_emu_live_cublas_handles.restype = ctypes.c_long
        self.lib.cp_emu_synchronizations.restype = ctypes.c_long
        self.lib.cp_emu_launches.restype = ctypes.c_long

    def run(self, v: np.ndarray, r: np.ndarray | None, budget: int, *, device_budget: bool = False,
            tau: float = 0.3, fill: int = 0x00, order: str = "forward", stream: int | None = None,
            cublas: int | None = None, capturing: bool = False, pending_error: int = 0) -> RunResult:
        """v: [B, n, d] float32 / float16; r: [B, n] float32 or None. Runs cp_coverage_select with guard bytes
        after the workspace and each output, and checks they are untouched. stream / cublas: the pointers passed
        (any non-NULL value names a stream here); capturing: every stream reports an active graph capture;
        pending_error: a cudaError_t left pending before the call."""
        self.lib.cp_emu_reset()
        self.lib.cp_emu_set_order(*ORDERS[order])
        self.lib.cp_emu_set_capturing(int(capturing))
        self.lib.cp_emu_set_pending_error(pending_error)
        v = np.ascontiguousarray(v)
        batch, n, d = v.shape
        dtype = 1 if v.dtype == np.float16 else 0
        ws_bytes = self.lib.cp_coverage_workspace_size(batch, n, d, dtype)
        ws = np.full(ws_bytes + ALIGN, GUARD, np.uint8)
        ws[:ws_bytes] = fill
        cap = batch * n if device_budget else batch * max(min(budget, n), 0)
        keep = np.full(cap + 16, SENTINEL, np.int64)
        keep_length = np.array([SENTINEL, SENTINEL], np.int32)
        budget_dev = np.array([budget, SENTINEL], np.int64)
        rr = None if r is None else np.ascontiguousarray(r, np.float32)
        status = self.lib.cp_coverage_select(
            v.ctypes.data, dtype, None if rr is None else rr.ctypes.data, batch, n, d, budget,
            budget_dev.ctypes.data if device_budget else None, tau, None, keep.ctypes.data,
            keep_length.ctypes.data, ws.ctypes.data, ws_bytes, stream, cublas)
        fault = self.lib.cp_emu_fault().decode()
        assert fault == "", f"emulation fault: {fault}"
        assert np.all(ws[ws_bytes:] == GUARD), "the kernels wrote past the end of the workspace"
        assert np.all(keep[cap:] == SENTINEL), f"keep written past its {cap} entries"
        assert keep_length[1] == SENTINEL and budget_dev[1] == SENTINEL, "keep_length written past its scalar"
        return RunResult(status, self.lib.cp_last_error().decode(), keep[:cap], int(keep_length[0]), ws[:ws_bytes],
                         batch, n, d, dtype)


@dataclass
class RunResult:
    status: int
    error: str
    keep: np.ndarray
    keep_length: int
    ws: np.ndarray
    batch: int
    n: int
    d: int
    dtype: int

    def region(self, offset: int, count: int, dtype) -> np.ndarray:
        return self.ws[offset:offset + count * np.dtype(dtype).itemsize].view(dtype)

    def utilities_and_weights(self) -> tuple[np.ndarray, np.ndarray]:
        """A [B, n, n] and w [B, n] as the kernels left them (coverage_workspace.h's layout, recomputed here)."""
        b, n, d = self.batch, self.n, self.d
        sim = _align(b * n * d * (2 if self.dtype else 4))
        w = sim + _align(b * n * n * 4)
        return (self.region(sim, b * n * n, np.float32).reshape(b, n, n),
                self.region(w, b * n, np.float32).reshape(b, n))


@pytest.fixture(scope="module")
def emu_objs(tmp_path_factory):
    return build_runtime(tmp_path_factory.mktemp("cuda_cpu_runtime"))


@pytest.fixture(scope="module")
def emu(emu_objs, tmp_path_factory):
    return Emulated(build_selector(tmp_path_factory.mktemp("cuda_cpu"), emu_objs))


def make_features(kind: str, batch: int, n: int, d: int, seed: int, fp16: bool = False):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((batch, n, d))
    if kind == "duplicates":  # exact copies: exact ties (lowest index wins) and exhausted coverage
        base = rng.standard_normal((batch, max(1, n // 4), d))
        v = np.stack([base[b][rng.integers(0, base.shape[1], n)] for b in range(batch)])
    elif kind == "clustered":
        centres = rng.standard_normal((batch, max(2, n // 12), d))
        v = np.stack([centres[b][rng.integers(0, centres.shape[1], n)] for b in range(batch)])
        v = v + 0.3 * rng.standard_normal(v.shape) + 0.2
    return v.astype(np.float16 if fp16 else np.float32)


def make_relevance(kind: str, batch: int, n: int, seed: int):
    rng = np.random.default_rng(seed + 99)
    if kind == "none":
        return None
    if kind == "constant":
        return np.full((batch, n), 0.7, np.float32)
    r = rng.random((batch, n)).astype(np.float32)
    if kind == "nan":
        r[:, n // 2] = np.nan
    return r


def check_picks(res: RunResult, v, r, budget: int, tau: float = 0.3):
    """keep against the literal greedy on the kernel's own A and w, and A against the float64 utilities."""
    assert res.status == 0, f"status {res.status}: {res.error}"
    b, n = res.batch, res.n
    m = max(0, min(budget, n))
    assert res.keep_length == m, f"keep_length {res.keep_length}, expected m = {m}"
    keep = res.keep[:b * m].reshape(b, m)
    assert np.all((keep >= 0) & (keep < n)) and np.all(np.diff(keep, axis=1) > 0), f"keep not sorted/distinct: {keep}"
    if m in (0, n) and res.ws.size and not np.any(res.ws):
        return keep  # a trivial host budget computes nothing
    a_all, w_all = res.utilities_and_weights()
    for p in range(b):
        a, w = a_all[p].astype(np.float64), w_all[p].astype(np.float64)
        if m == n:
            np.testing.assert_array_equal(keep[p], np.arange(n), err_msg=f"problem {p}: budget >= n keeps all")
            continue
        vd = v[p].astype(np.float64)
        # float32: normalisation and a d-term dot product round by about (d + 4) u, the row mean by n u; fp16
        # inputs are normalised into fp16 (2 u16 per entry of the product)
        tol = (res.d + n + 8) * U32 * 4 + (4 * U16 if res.dtype else 0.0)
        err = np.max(np.abs(a - utilities(vd)))
        assert err <= tol, f"problem {p}: utilities off by {err:.3g} > {tol:.3g} (GEMM or centring wrong)"
        if r is None or not np.all(np.isfinite(r[p])):
            want_w = None
        else:
            want_w = weights(r[p], tau, n)
        if want_w is not None:
            np.testing.assert_allclose(w, want_w, rtol=8 * U32, err_msg=f"problem {p}: demand weights")
        if r is not None and not np.all(np.isfinite(r[p])):
            continue  # NaN relevance: only a defined, in-range, distinct result is promised (checked above)
        want = np.sort(literal_greedy(a, w, m))
        np.testing.assert_array_equal(keep[p], want,
                                      err_msg=f"problem {p}: picks differ from the literal greedy on the kernel's "
                                              "own utilities")
        if res.dtype == 0:
            assert_same_or_not_worse(keep[p], vd, None if r is None else r[p], m, tau)
    return keep


def check_orders(emu: Emulated, v, r, budget: int, **kw):
    """The checks in every thread order, and the same keep and workspace bytes in all of them."""
    first = None
    for order in ORDERS:
        res = emu.run(v, r, budget, order=order, **kw)
        keep = check_picks(res, v, r, budget)
        if first is None:
            first = (keep, res.ws.copy())
        else:
            np.testing.assert_array_equal(keep, first[0], err_msg=f"{order} thread order changes the picks")
            assert np.array_equal(res.ws, first[1]), f"{order} thread order changes the workspace: a race"
    return first[0]


# n, d, budget: every size of the issue; budget < n so the greedy runs
SIZES = [(1, 8, 1), (2, 8, 1), (31, 16, 9), (33, 16, 12), (100, 24, 30), (513, 16, 10), (576, 16, 12),
         (577, 16, 10)]


@pytest.mark.parametrize("n,d,budget", SIZES, ids=[f"n{s[0]}" for s in SIZES])
def test_sizes_in_three_thread_orders(emu, n, d, budget):
    v = make_features("clustered", 1, n, d, seed=n)
    r = make_relevance("random", 1, n, seed=n)
    check_orders(emu, v, r, budget, device_budget=True)  # device budget: even n = 1, 2 run the kernels


@pytest.mark.parametrize("relevance", ["none", "constant", "nan", "random"])
@pytest.mark.parametrize("kind", ["duplicates", "random"])
def test_relevance_kinds_and_duplicate_tokens(emu, kind, relevance):
    n, d, budget = 70, 12, 50  # large budget on duplicates: coverage exhausts, exact-zero gains tie
    v = make_features(kind, 1, n, d, seed=5)
    r = make_relevance(relevance, 1, n, seed=5)
    keep = check_orders(emu, v, r, budget)
    if kind == "duplicates" and relevance == "none":
        # an exact copy of an earlier kept token is never preferred over the original (lowest index wins ties)
        rows = v[0]
        for k in keep[0]:
            assert not any(np.array_equal(rows[j], rows[k]) for j in range(k) if j not in set(keep[0])), k


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_batch_of_three_equals_each_alone(emu, fp16):
    n, d, budget = 90, 20, 25
    v = make_features("clustered", 3, n, d, seed=11, fp16=fp16)
    r = make_relevance("random", 3, n, seed=11)
    batched = check_orders(emu, v, r, budget)
    for p in range(3):
        alone = check_picks(emu.run(v[p:p + 1], r[p:p + 1], budget), v[p:p + 1], r[p:p + 1], budget)
        np.testing.assert_array_equal(batched[p], alone[0], err_msg=f"batch row {p} != the same problem alone")


@pytest.mark.parametrize("device_budget", [False, True], ids=["host", "device"])
def test_budgets_negative_zero_m_n_and_above(emu, device_budget):
    n, d = 40, 12
    v = make_features("random", 2, n, d, seed=3)
    r = make_relevance("random", 2, n, seed=3)
    for budget in (-1, 0, 13, n, n + 7):
        res = emu.run(v, r, budget, device_budget=device_budget)
        if budget < 0 and not device_budget:
            assert res.status == 1 and "budget" in res.error, (res.status, res.error)  # CP_ERR_INVALID_ARGUMENT
            continue
        check_picks(res, v, r, budget)


@pytest.mark.parametrize("fill", [0x00, 0xFF], ids=["zeros", "ones"])
def test_workspace_contents_do_not_matter(emu, fill):
    """0xFF bytes are NaN floats and doubles: a region read before the kernels write it would show."""
    n, d, budget = 60, 10, 20
    v = make_features("clustered", 2, n, d, seed=8)
    r = make_relevance("random", 2, n, seed=8)
    res = emu.run(v, r, budget, fill=fill, order="reverse")
    keep = check_picks(res, v, r, budget)
    ref = emu.run(v, r, budget, fill=0x5C, order="random")
    np.testing.assert_array_equal(keep, check_picks(ref, v, r, budget))


# --- cuBLAS handles, CUDA-graph capture, checked mode, error attribution ---------------------------------------
def test_cublas_handles_one_per_stream_released_at_teardown(emu):
    lib = emu.lib
    lib.cp_release_handles()
    assert lib.cp_emu_live_cublas_handles() == 0
    v = make_features("random", 1, 40, 8, seed=1)
    for stream in (None, None, 0x1000, 0x1000, 0x2000):
        check_picks(emu.run(v, None, 10, stream=stream), v, None, 10)
    assert lib.cp_emu_live_cublas_handles() == 3, "one handle per (device, stream), reused across calls"
    assert lib.cp_release_handles() == 3 and lib.cp_emu_live_cublas_handles() == 0
    # a caller's own handle is used as given: the library creates none
    own = ctypes.c_void_p()
    assert lib.cublasCreate(ctypes.byref(own)) == 0
    check_picks(emu.run(v, None, 10, cublas=own.value), v, None, 10)
    assert lib.cp_emu_live_cublas_handles() == 1
    assert lib.cublasDestroy(own) == 0


def test_graph_capture_never_creates_a_handle_or_synchronises(emu):
    lib = emu.lib
    lib.cp_release_handles()
    v = make_features("random", 1, 40, 8, seed=2)
    lib.cp_set_checked_mode(1)
    try:
        res = emu.run(v, None, 10, stream=0x3000, capturing=True)
        assert res.status == 4 and "captured into a CUDA graph" in res.error, (res.status, res.error)
        assert lib.cp_emu_live_cublas_handles() == 0
        check_picks(emu.run(v, None, 10, stream=0x3000), v, None, 10)  # warm-up outside capture makes the handle
        res = emu.run(v, None, 10, stream=0x3000, capturing=True)
        check_picks(res, v, None, 10)
        assert lib.cp_emu_synchronizations() == 0, "checked mode synchronised a capturing stream"
    finally:
        lib.cp_set_checked_mode(0)
        lib.cp_release_handles()


def test_checked_mode_synchronises_after_every_launch(emu):
    lib = emu.lib
    v = make_features("random", 1, 40, 8, seed=3)
    check_picks(emu.run(v, None, 10), v, None, 10)
    assert lib.cp_emu_synchronizations() == 0  # off by default
    lib.cp_set_checked_mode(1)
    try:
        check_picks(emu.run(v, None, 10), v, None, 10)
        # normalize, GEMM, centre, prepare, initial gains, greedy: every kernel launch and the GEMM
        assert lib.cp_emu_synchronizations() == lib.cp_emu_launches() + 1 == 6
    finally:
        lib.cp_set_checked_mode(0)


def test_an_earlier_pending_error_is_not_blamed_on_a_kernel(emu):
    v = make_features("random", 1, 40, 8, seed=4)
    res = emu.run(v, None, 10, pending_error=1)  # cudaErrorInvalidValue from someone's earlier call
    assert res.status == 3 and "pending before cp_coverage_select" in res.error, res.error
    assert "normalize_rows" not in res.error and emu.lib.cp_emu_launches() == 0
    res = emu.run(v, None, 10)  # the error was consumed: the next call runs
    check_picks(res, v, None, 10)


# --- mutants: each must be caught ---------------------------------------------------------------------------------
MUTANTS = {
    # the barrier between listing the rows whose cover rose and the gain update that reads that list
    "greedy_barrier_removed": {"greedy_core.cuh": [(
        "            n_changed += chunk_total;\n        }\n        blk.sync();\n",
        "            n_changed += chunk_total;\n        }\n")]},
    # block_reduce's warp stage stops one step short: lanes 16-31 never reach lane 0
    "shuffle_loop_short": {"coverage_select.cu": [(
        "    for (int off = 16; off > 0; off >>= 1)\n        v = op(v, __shfl_down_sync(kFullMask, v, off));",
        "    for (int off = 16; off > 1; off >>= 1)\n        v = op(v, __shfl_down_sync(kFullMask, v, off));")]},
    # the greedy's block size no longer rounded up to whole warps
    "partial_warp": {"coverage_select.cu": [(
        "int threads = static_cast<int>(((n + 31) / 32) * 32);", "int threads = static_cast<int>(n);")]},
}
# what each mutant is caught by (the first failing assertion of the battery below)
CAUGHT_BY = {
    "greedy_barrier_removed": "picks differ from the literal greedy",
    "shuffle_loop_short": "picks differ from the literal greedy",
    "partial_warp": "partial warp",
}


def mutant_battery(emu: Emulated):
    v = make_features("clustered", 1, 100, 24, seed=100)
    r = make_relevance("random", 1, 100, seed=100)
    check_orders(emu, v, r, 30, device_budget=True)
    v = make_features("duplicates", 1, 70, 12, seed=5)
    check_orders(emu, v, None, 50)


def test_the_mutant_battery_passes_on_the_real_sources(emu):
    mutant_battery(emu)


@pytest.mark.parametrize("name", list(MUTANTS))
def test_each_mutant_is_caught(emu_objs, tmp_path, name):
    mutant = Emulated(build_selector(tmp_path, emu_objs, mutations=MUTANTS[name]))
    with pytest.raises(AssertionError, match=CAUGHT_BY[name]):
        mutant_battery(mutant)
