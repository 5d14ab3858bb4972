"""The CUDA selector's greedy code (kernels/greedy_core.cuh: weights, initial gains, incremental update, fresh
recomputation of near-best gains, tie rule, sorted compaction) compiled for the host with a one-thread block and
checked against the literal float64 greedy of tests/literal_selection.py. Same source as the GPU kernels, so the
algorithm is verified on every machine with g++.

On the same utilities the kernel's picks (float32 gains with error bounds, candidates re-summed in float64) are the
literal greedy's. From features, its float32 utilities may move genuine near-ties: then the set's float64 coverage
objective must not be worse than the literal's x (1 - 1e-7)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from coverpruner.engines.native_build import CSRC_DIR

from ..literal_selection import assert_same_or_not_worse, literal_greedy, near_tie_case, weights

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found on PATH")


def build_harness(out_dir, mutations: tuple[tuple[str, str], ...] = ()):
    """The host harness (greedy_host_harness.cpp + kernels/greedy_core.cuh) built by g++ into out_dir; mutations:
    (old text -> new text) patches of greedy_core.cuh, each old text occurring exactly once (the mutant tests).
    Returns run(a32, relevance, budget, tau, threads=1) -> kept indices."""
    header = (CSRC_DIR / "kernels" / "greedy_core.cuh").read_text()
    for old, new in mutations:
        assert header.count(old) == 1, f"mutation target occurs {header.count(old)} times: {old!r}"
        header = header.replace(old, new)
    (out_dir / "kernels").mkdir(parents=True)
    (out_dir / "tests").mkdir()
    (out_dir / "kernels" / "greedy_core.cuh").write_text(header)
    shutil.copy(CSRC_DIR / "tests" / "greedy_host_harness.cpp", out_dir / "tests")
    lib = out_dir / "libgreedy_host.so"
    cmd = ["g++", "-std=c++20", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-pthread",
           str(out_dir / "tests" / "greedy_host_harness.cpp"), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    so = ctypes.CDLL(str(lib))
    so.cp_greedy_host.restype = ctypes.c_int
    so.cp_greedy_host.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float,
                                  ctypes.c_void_p]
    so.cp_greedy_host_threads.restype = ctypes.c_int
    so.cp_greedy_host_threads.argtypes = so.cp_greedy_host.argtypes + [ctypes.c_int]

    def run(a32: np.ndarray, relevance, budget: int, tau: float, threads: int = 1) -> np.ndarray:
        """Indices from a one-thread block, or from a block of `threads` host threads."""
        a32 = np.ascontiguousarray(a32, np.float32)
        n = a32.shape[0]
        r = None if relevance is None else np.ascontiguousarray(relevance, np.float32)
        keep = np.full(max(n, 1), -1, np.int64)
        args = (a32.ctypes.data, None if r is None else r.ctypes.data, n, budget, tau, keep.ctypes.data)
        m = so.cp_greedy_host(*args) if threads == 1 else so.cp_greedy_host_threads(*args, threads)
        return keep[:m]

    return run


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return build_harness(tmp_path_factory.mktemp("greedy_host"))


def gpu_utilities(features: np.ndarray) -> np.ndarray:
    """A as the kernels compute it: float32 normalize (eps 1e-12), float32 GEMM, float32 centre and clip."""
    v = features.astype(np.float32)
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), np.float32(1e-12))
    m = v @ v.T
    return np.maximum(m - m.mean(axis=1, keepdims=True), np.float32(0))


def make_case(kind: str, seed: int):
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(16, 160)), int(rng.integers(8, 64))
    budget, r, tau = int(rng.integers(1, n + 4)), rng.random(n), 0.3
    v = rng.standard_normal((n, d))
    if kind == "clustered":
        centres = rng.standard_normal((max(2, n // 10), d))
        v = centres[rng.integers(0, len(centres), n)] + 0.05 * rng.standard_normal((n, d))
    elif kind == "duplicated":  # exact copies: exact ties, and exhausted coverage for large budgets
        base = rng.standard_normal((max(2, n // 4), d))
        v = base[rng.integers(0, len(base), n)]
    elif kind == "constant_relevance":
        r = np.full(n, 0.7)
    elif kind == "no_relevance":
        r = None
    elif kind == "tau1":
        tau = 1.0
    return v, r, budget, tau


KINDS = ["random", "clustered", "duplicated", "constant_relevance", "no_relevance", "tau1"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(4))
def test_greedy_equals_reference_on_the_same_utilities(harness, kind, seed):
    v, r, budget, tau = make_case(kind, seed)
    a32 = gpu_utilities(v)
    n = len(v)
    w = weights(None if r is None else np.asarray(r, np.float32), tau, n)
    want = np.arange(n) if budget >= n else np.sort(literal_greedy(a32.astype(np.float64), w, budget))
    np.testing.assert_array_equal(harness(a32, r, budget, tau), want)


@pytest.mark.parametrize("kind", KINDS)
def test_float32_pipeline_equals_float64_reference(harness, kind):
    """End to end with float32 utilities (what the GPU computes) vs the float64 reference selector."""
    for seed in range(10, 14):
        v, r, budget, tau = make_case(kind, seed)
        assert_same_or_not_worse(harness(gpu_utilities(v), r, budget, tau), v, r, budget, tau)


def test_paper_shape(harness):
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((24, 1024))
    v = centres[rng.integers(0, 24, 576)] + 0.6 * rng.standard_normal((576, 1024)) + 0.3
    r = rng.random(576)
    for m in (64, 192):
        assert_same_or_not_worse(harness(gpu_utilities(v), r, m, 0.3), v, r, m)


@pytest.mark.parametrize("n", [576, pytest.param(2880, marks=pytest.mark.slow)])
def test_a_higher_index_wins_a_1e4_near_tie_late_in_the_greedy(harness, n):
    """The old window (1e-6 * sum(w)) tied this 1e-4 relative gap and kept the lower index."""
    v, r, budget, hi, lo, gap = near_tie_case(n)
    keep = harness(gpu_utilities(v), r, budget, 0.3)
    assert hi in keep and lo not in keep, f"token {lo} kept over {hi}, whose gain is {gap:.2e} higher"
    assert_same_or_not_worse(keep, v, r, budget)


def test_edge_budgets_and_nan_relevance(harness):
    v, r, _, _ = make_case("random", 1)
    a32, n = gpu_utilities(v), len(v)
    assert harness(a32, r, 0, 0.3).size == 0
    np.testing.assert_array_equal(harness(a32, r, n, 0.3), np.arange(n))
    np.testing.assert_array_equal(harness(a32, r, n + 10, 0.3), np.arange(n))
    bad = np.array(r, np.float32)
    bad[3] = np.nan  # NaN demand makes NaN gains: the greedy must still write m distinct in-range indices
    keep = harness(a32, bad, 10, 0.3)
    assert keep.shape == (10,) and np.all(np.diff(keep) > 0) and keep[0] >= 0 and keep[-1] < n


@pytest.mark.parametrize("threads", [3, 8])
@pytest.mark.parametrize("kind", ["random", "duplicated", "no_relevance"])
def test_multithread_block_gives_the_same_indices(harness, kind, threads):
    """A block of several threads (strided loops, block reductions, compaction ranks across threads, as on the
    GPU) picks exactly what the one-thread block and the reference pick."""
    for seed in range(2):
        v, r, budget, tau = make_case(kind, 20 + seed)
        a32 = gpu_utilities(v)
        one = harness(a32, r, budget, tau)
        np.testing.assert_array_equal(harness(a32, r, budget, tau, threads=threads), one)
        assert_same_or_not_worse(one, v, r, budget, tau)


# --- the exact re-check of the candidates, and mutants of it ------------------------------------------------------
def ulp_near_tie(n: int = 64, seed: int = 3):
    """Utilities [n, n] float32 where columns 9 and 5 are the two best first picks and differ in one entry by one
    float32 ulp: column 9's exact gain exceeds column 5's by ~6e-8 (far outside the float64 tie window, ~1e-12),
    while every float32 sum of them (the kernel's running gains) is the same float. Only the exact float64
    re-check of the candidates tells them apart; without it the tie rule hands the pick to the lower index 5."""
    rng = np.random.default_rng(seed)
    a = (0.5 * rng.random((n, n))).astype(np.float32)
    a[:, 5] = (0.9 + 0.05 * rng.random(n)).astype(np.float32)
    a[:, 9] = a[:, 5]
    a[n - 1, 9] = np.nextafter(a[n - 1, 5], np.float32(1))  # last term: absorbed by the float32 partial sum
    f32 = [np.cumsum(a[:, k], dtype=np.float32)[-1] for k in (5, 9)]
    assert f32[0] == f32[1], "construction: the float32 sums of columns 5 and 9 must be equal"
    exact = a[:, 9].astype(np.float64).sum() - a[:, 5].astype(np.float64).sum()
    assert exact > 1e-8, exact
    return a


def test_an_ulp_near_tie_is_decided_by_the_exact_recheck(harness):
    a = ulp_near_tie()
    want = np.sort(literal_greedy(a.astype(np.float64), np.ones(len(a)), 4))
    assert 9 in want and 5 not in want
    np.testing.assert_array_equal(harness(a, None, 4, 0.3), want)
    np.testing.assert_array_equal(harness(a, None, 4, 0.3, threads=3), want)


# Each breaks the re-check of the candidates that the float32 scan admits; the near-tie above catches each.
RECHECK_MUTANTS = {
    # the candidates' gains re-summed in float32 instead of float64
    "recheck_in_float32": (("            double part = 0.0;\n", "            float part = 0.f;\n"),
                           ("                const double excess = static_cast<double>(p.A[static_cast<size_t>(i) * n "
                            "+ k]) - p.c[i];",
                            "                const float excess = p.A[static_cast<size_t>(i) * n + k] - p.c[i];")),
    # no re-sum: the pick is made on the running float32 gains
    "recheck_skipped": (("                p.fresh[k] = fresh;\n",
                         "                p.fresh[k] = static_cast<double>(p.gain[k]) + 0.0 * fresh;\n"),),
}


@pytest.mark.parametrize("name", list(RECHECK_MUTANTS))
def test_each_recheck_mutant_is_caught(tmp_path, name):
    mutant = build_harness(tmp_path, RECHECK_MUTANTS[name])
    a = ulp_near_tie()
    assert literal_greedy(a.astype(np.float64), np.ones(len(a)), 1).tolist() == [9]
    assert mutant(a, None, 1, 0.3).tolist() == [5], f"mutant {name} was not caught"
