"""Baselines and the selector registry."""

import numpy as np
import pytest

from coverpruner.selection import SELECTORS, coverage_select, get_selector


def test_registry_names_and_unknown_name():
    assert set(SELECTORS) == {"coverpruner", "divprune", "attention", "uniform", "random", "dart", "cdpruner"}
    assert get_selector("coverpruner") is coverage_select
    with pytest.raises(ValueError, match="unknown selection method 'fastv'.*divprune"):
        get_selector("fastv")


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_contract_sorted_unique_int64_and_full_budget(name):
    rng = np.random.default_rng(1)
    v, r = rng.standard_normal((30, 8)), rng.random(30)
    out = get_selector(name)(v, r, 10, tau=0.3, seed=4)
    assert out.dtype == np.int64 and len(out) == 10 and np.all(np.diff(out) > 0)
    assert out.min() >= 0 and out.max() < 30
    np.testing.assert_array_equal(get_selector(name)(v, r, 30, seed=4), np.arange(30))


def test_divprune_first_pick_is_the_most_isolated_token_then_max_min():
    # three near-identical tokens and two far ones in different directions
    v = np.array([[1, 0, 0], [1, 0.01, 0], [1, 0, 0.01], [0, 1, 0], [-1, -1, 0.2]], dtype=float)
    sel = get_selector("divprune")
    assert list(sel(v, None, 1)) == [4]  # its nearest neighbour is farthest of all
    vn = v / np.linalg.norm(v, axis=1, keepdims=True)
    dist = 1 - vn @ vn.T
    second = int(np.argmax(np.where(np.arange(5) == 4, -np.inf, dist[:, 4])))
    assert list(sel(v, None, 2)) == sorted([4, second])
    assert len(set(sel(v, None, 3)) & {0, 1, 2}) == 1  # one of the redundant cluster, not two


def test_attention_is_top_m_by_relevance_with_lowest_index_on_ties():
    v = np.eye(6)
    r = np.array([0.1, 0.9, 0.5, 0.9, 0.2, 0.5])
    assert list(get_selector("attention")(v, r, 3)) == [1, 2, 3]
    with pytest.raises(ValueError, match="relevance is required"):
        get_selector("attention")(v, None, 3)


def test_uniform_is_evenly_spaced():
    v = np.zeros((576, 2))
    out = get_selector("uniform")(v, None, 64)
    assert len(np.unique(np.diff(out))) == 1 and np.diff(out)[0] == 9
    assert list(get_selector("uniform")(np.zeros((10, 2)), None, 3)) == [1, 5, 8]


def test_random_is_seeded():
    v = np.zeros((100, 2))
    sel = get_selector("random")
    np.testing.assert_array_equal(sel(v, None, 20, seed=7), sel(v, None, 20, seed=7))
    assert not np.array_equal(sel(v, None, 20, seed=7), sel(v, None, 20, seed=8))
