"""Every bad input gives a ValueError naming the argument and the value."""

import numpy as np
import pytest

from coverpruner.selection import SELECTORS, coverage_select, demand_weights, get_selector

GOOD = np.random.default_rng(0).standard_normal((10, 4))


@pytest.mark.parametrize("name", sorted(SELECTORS))
@pytest.mark.parametrize("budget", [0, -3, 2.5, "8", None, True])
def test_budget_must_be_a_positive_integer(name, budget):
    with pytest.raises(ValueError, match=r"budget must be a positive integer, got " + repr(budget).replace(".", r"\.")):
        get_selector(name)(GOOD, np.ones(10), budget)


def test_numpy_integer_budget_is_accepted():
    assert len(coverage_select(GOOD, None, np.int64(3))) == 3


@pytest.mark.parametrize("name", sorted(SELECTORS))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features(name, bad):
    v = GOOD.copy()
    v[2, 1] = bad
    with pytest.raises(ValueError, match="features contain 1 NaN/inf"):
        get_selector(name)(v, np.ones(10), 3)


@pytest.mark.parametrize("backend", ["reference", "numpy"])
@pytest.mark.parametrize("shape", [(10,), (2, 10, 4), ()])
def test_features_wrong_ndim(backend, shape):
    with pytest.raises(ValueError, match=r"features must have shape \[n, d\], got ndim=%d" % len(shape)):
        coverage_select(np.zeros(shape), None, 3, backend=backend)


def test_torch_backend_features_wrong_ndim():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"features must have shape \[n, d\] or \[B, n, d\], got ndim=4"):
        coverage_select(torch.zeros(1, 2, 3, 4), None, 3)


def test_empty_features():
    with pytest.raises(ValueError, match="at least one token"):
        coverage_select(np.zeros((0, 4)), None, 3)


@pytest.mark.parametrize("name", ["coverpruner", "attention", "divprune"])
def test_relevance_length_mismatch(name):
    with pytest.raises(ValueError, match="relevance length must equal the number of tokens n=10, got 9"):
        get_selector(name)(GOOD, np.ones(9), 3)


def test_relevance_non_finite_and_wrong_ndim():
    r = np.ones(10)
    r[0] = np.nan
    with pytest.raises(ValueError, match="relevance contains NaN/inf"):
        coverage_select(GOOD, r, 3)
    with pytest.raises(ValueError, match=r"relevance must have shape \[n\], got shape \(2, 5\)"):
        coverage_select(GOOD, np.ones((2, 5)), 3)
    with pytest.raises(ValueError, match="relevance contains NaN/inf"):
        demand_weights(r)


@pytest.mark.parametrize("tau", [np.nan, np.inf, "0.3"])
def test_tau_must_be_finite(tau):
    with pytest.raises(ValueError, match="tau must be a finite number"):
        coverage_select(GOOD, np.ones(10), 3, tau=tau)


def test_unknown_backend():
    with pytest.raises(ValueError, match=r"backend must be one of .* got 'cuda'"):
        coverage_select(GOOD, None, 3, backend="cuda")
