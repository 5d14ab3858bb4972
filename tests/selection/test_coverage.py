"""The coverage selector: definitions, a hand-computed example, backend parity, approximation guarantee."""

import itertools
import math

import numpy as np
import pytest

from coverpruner.selection import coverage_select, coverage_utilities, demand_weights, greedy_reference

from ..literal_selection import coverage_reference
from .conftest import KINDS, make_case


def objective(a, w, subset):
    """f(S) = sum_i w_i max_{j in S} A_ij (paper Eq. 6); 0 for the empty set."""
    if len(subset) == 0:
        return 0.0
    return float(w @ a[:, list(subset)].max(axis=1))


# --- definitions -------------------------------------------------------------------------------------------

def test_utilities_are_clipped_mean_centred_cosine():
    rng = np.random.default_rng(0)
    v = rng.standard_normal((7, 5))
    a = coverage_utilities(v)
    m = np.array([[x @ y / np.linalg.norm(x) / np.linalg.norm(y) for y in v] for x in v])
    expected = np.maximum(m - m.mean(axis=1, keepdims=True), 0)
    np.testing.assert_allclose(a, expected, atol=1e-12)
    assert a.dtype == np.float64 and (a >= 0).all()


def test_zero_norm_token_has_no_coverage_and_no_nan():
    v = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    a = coverage_utilities(v)
    assert np.isfinite(a).all()
    assert (a[0] == 0).all()


def test_demand_weights_minmax_exp():
    w = demand_weights(np.array([2.0, 4.0, 3.0]), tau=0.3)
    np.testing.assert_allclose(w, np.exp(0.3 * np.array([0.0, 1.0, 0.5])))


def test_constant_relevance_gives_uniform_weights():
    np.testing.assert_array_equal(demand_weights(np.full(5, 3.25), tau=0.3), np.ones(5))


# --- a hand-computed example -------------------------------------------------------------------------------
# v0=(1,0) v1=(.8,.6) v2=(0,1) v3=(-1,0), unit vectors, so M = dot products:
#   row means .2 .4 .4 -.2 ->  A = [[.8 .6  0  0 ]
#                                   [.4 .6 .2  0 ]
#                                   [ 0 .2 .6  0 ]
#                                   [ 0  0 .2 1.2]]
# Uniform demand: column sums 1.2 1.4 1.0 1.2 -> pick 1; c=(.6 .6 .2 0): gains .2 . .6 1.2 -> pick 3;
#   c=(.6 .6 .2 1.2): gains .2 . .4 . -> pick 2.
# Relevance (1,0,0,0) with tau=1: w=(e,1,1,1): gains .8e+.4=2.57 .6e+.8=2.43 1.0 1.2 -> pick 0;
#   c=(.8 .4 0 0): gains . .4 .8 1.2 -> pick 3.
HAND = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-1.0, 0.0]])


def test_hand_computed_utilities():
    expected = np.array([[.8, .6, 0, 0], [.4, .6, .2, 0], [0, .2, .6, 0], [0, 0, .2, 1.2]])
    np.testing.assert_allclose(coverage_utilities(HAND), expected, atol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "numpy", "lazy", "torch"])
def test_hand_computed_picks(backend):
    if backend == "torch":
        pytest.importorskip("torch")
    assert list(greedy_reference(coverage_utilities(HAND), np.ones(4), 3)) == [1, 3, 2]
    assert list(coverage_select(HAND, None, 1, backend=backend)) == [1]
    assert list(coverage_select(HAND, None, 2, backend=backend)) == [1, 3]
    assert list(coverage_select(HAND, None, 3, backend=backend)) == [1, 2, 3]
    relevance = np.array([1.0, 0.0, 0.0, 0.0])
    assert list(coverage_select(HAND, relevance, 1, tau=1.0, backend=backend)) == [0]
    assert list(coverage_select(HAND, relevance, 2, tau=1.0, backend=backend)) == [0, 3]


# --- backend parity ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(8))
def test_numpy_and_torch_match_reference(kind, seed):
    torch = pytest.importorskip("torch")
    v, r, budget, tau = make_case(kind, seed)
    ref = coverage_select(v, r, budget, tau, backend="reference")
    assert ref.dtype == np.int64 and len(ref) == min(budget, len(v))
    assert np.all(np.diff(ref) > 0), "indices must be sorted ascending and distinct"
    np.testing.assert_array_equal(ref, coverage_reference(v, r, budget, tau))  # the test's own literal greedy
    np.testing.assert_array_equal(coverage_select(v, r, budget, tau, backend="numpy"), ref)
    np.testing.assert_array_equal(coverage_select(v, r, budget, tau, backend="lazy"), ref)
    rt = None if r is None else torch.from_numpy(r)
    out = coverage_select(torch.from_numpy(v), rt, budget, tau)  # auto -> torch
    assert isinstance(out, torch.Tensor) and out.dtype == torch.int64
    np.testing.assert_array_equal(out.numpy(), ref)


def test_auto_backend_for_numpy_is_numpy_result():
    v, r, budget, tau = make_case("random", 123)
    np.testing.assert_array_equal(coverage_select(v, r, budget, tau), coverage_select(v, r, budget, tau,
                                                                                         backend="reference"))


def test_torch_batched_equals_per_item():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    v = rng.standard_normal((3, 40, 16))
    r = rng.random((3, 40))
    out = coverage_select(torch.from_numpy(v), torch.from_numpy(r), 12, 0.5, backend="torch")
    assert tuple(out.shape) == (3, 12)
    for b in range(3):
        np.testing.assert_array_equal(out[b].numpy(), coverage_select(v[b], r[b], 12, 0.5, backend="reference"))


# --- greedy guarantee --------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_greedy_within_1_minus_1_over_e_of_brute_force_optimum(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(5, 11))
    v = rng.standard_normal((n, 3))
    w = demand_weights(rng.random(n), 0.3 * seed)
    a = coverage_utilities(v)
    previous = 0.0
    for m in range(1, n + 1):
        picks = greedy_reference(a, w, m)
        value = objective(a, w, picks)
        best = max(objective(a, w, s) for s in itertools.combinations(range(n), m))
        assert value >= (1 - 1 / math.e) * best - 1e-12
        assert value <= best + 1e-12
        assert value >= previous - 1e-12, "the objective must never decrease with the budget"
        previous = value


# --- ties and determinism ----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["reference", "numpy", "lazy", "torch"])
def test_ties_go_to_the_lowest_index(backend):
    if backend == "torch":
        pytest.importorskip("torch")
    same = np.ones((9, 4))  # every token identical: all utilities 0, every gain ties at 0
    assert list(coverage_select(same, None, 4, backend=backend)) == [0, 1, 2, 3]
    rng = np.random.default_rng(3)
    base = rng.standard_normal((5, 6))
    v = np.concatenate([base, base])  # token i and i+5 are copies with equal gains: the copy is never preferred
    assert list(coverage_select(v, None, 5, backend=backend)) == [0, 1, 2, 3, 4]
    v = np.concatenate([base[::-1], base])  # the copies now come first: they win
    relevance = np.r_[rng.random(5), rng.random(5)]
    assert list(coverage_select(v, relevance, 5, backend=backend)) == [0, 1, 2, 3, 4]


def test_budget_at_least_n_keeps_every_token():
    v = np.random.default_rng(0).standard_normal((6, 3))
    for backend in ("reference", "numpy"):
        np.testing.assert_array_equal(coverage_select(v, None, 6, backend=backend), np.arange(6))
        np.testing.assert_array_equal(coverage_select(v, None, 50, backend=backend), np.arange(6))
