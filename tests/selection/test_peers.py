"""DART and CDPruner (the peers' pruners) against their literal references (tests/literal_peers.py), their
registry declarations and their option checks."""

import numpy as np
import pytest

from coverpruner.selection import METHODS, cdpruner_select, dart_select, get_selector, method_options, uses_relevance
from tests.literal_peers import cdpruner_kernel, cdpruner_reference, dart_reference


def peer_case(kind: str, seed: int):
    """(features [n, d] float32, relevance [n], budget) with n in 20..70, d in 4..40, budget in 1..n + 4."""
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(20, 70)), int(rng.integers(4, 40))
    budget = int(rng.integers(1, n + 5))
    if kind == "random":
        v = rng.standard_normal((n, d))
    elif kind == "clustered":
        centres = rng.standard_normal((max(2, n // 10), d))
        v = centres[rng.integers(0, len(centres), n)] + 0.05 * rng.standard_normal((n, d))
    elif kind == "near_duplicate":
        base = rng.standard_normal((max(2, n // 4), d))
        v = base[rng.integers(0, len(base), n)] + 1e-6 * rng.standard_normal((n, d))
    elif kind == "duplicated":  # exact copies: exact ties, lowest index
        base = rng.standard_normal((max(2, n // 4), d))
        v = base[rng.integers(0, len(base), n)]
    else:
        raise ValueError(kind)
    return v.astype(np.float32), rng.random(n), budget


KINDS = ["random", "clustered", "near_duplicate", "duplicated"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_dart_equals_the_literal_reference(kind, seed):
    v, r, budget = peer_case(kind, seed)
    for pivots in (8, 3):
        np.testing.assert_array_equal(dart_select(v, r, budget, pivots=pivots), dart_reference(v, budget, pivots))
    np.testing.assert_array_equal(get_selector("dart")(v, None, budget), dart_reference(v, budget))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_cdpruner_equals_the_literal_reference(kind, seed):
    v, r, budget = peer_case(kind, seed)
    for weight in (1.0, 0.5, 0.0):
        np.testing.assert_array_equal(cdpruner_select(v, r, budget, relevance_weight=weight),
                                      cdpruner_reference(v, r, budget, weight))
    np.testing.assert_array_equal(cdpruner_select(v, None, budget), cdpruner_reference(v, None, budget))


def test_dart_keeps_the_largest_norm_pivots_and_their_least_duplicated_tokens():
    # token 0 the one pivot (largest L1 norm); 1, 2 near-copies of it; 3 orthogonal; 4 opposite
    v = np.array([[3, 0, 0], [1, 0.01, 0], [1, 0, 0.01], [0, 1, 0], [-1, 0, 0]], dtype=np.float32)
    assert list(dart_select(v, None, 1, pivots=1)) == [0]
    assert list(dart_select(v, None, 2, pivots=1)) == [0, 4]  # cos -1: the least duplicated
    assert list(dart_select(v, None, 3, pivots=1)) == [0, 3, 4]
    assert list(dart_select(v, None, 2, pivots=8)) == [0, 1]  # budget <= pivots: the largest norms (1.01 > 1)


def test_cdpruner_trades_relevance_against_duplication():
    # 0 and 1 duplicates and the most relevant; 2 orthogonal to them, half as relevant; 3 the least relevant
    v = np.array([[1, 0], [1, 0], [0, 1], [0.6, 0.8]], dtype=np.float32)
    r = np.array([1.0, 1.0, 0.5, 0.0])
    np.testing.assert_allclose(np.diag(cdpruner_kernel(v, r)), [1, 1, 0.25, 0])  # q = minmax(r), L_ii = q_i^2
    assert list(cdpruner_select(v, r, 2)) == [0, 2]  # the copy of 0 adds no volume (det 0)
    assert list(cdpruner_select(v, r, 3)) == [0, 1, 2]  # no volume left: the largest quality L_ii next
    # w = 0: L = S, relevance plays no part
    for order in (r, r[::-1], None):
        assert list(cdpruner_select(v, order, 2, relevance_weight=0.0)) == [0, 2]


def test_methods_declare_whether_they_read_the_probe_and_their_options():
    assert {name for name in METHODS if uses_relevance(name)} == {"coverpruner", "attention", "cdpruner"}
    assert method_options("cdpruner", {}) == {"relevance_weight": 1.0}
    assert method_options("cdpruner", {"relevance_weight": 0.25}) == {"relevance_weight": 0.25}
    assert method_options("dart", {"pivots": 4}) == {"pivots": 4}
    assert method_options("coverpruner", {}) == {}
    assert method_options("dart", {"relevance_weight": None}) == {"pivots": 8}  # None: not given


@pytest.mark.parametrize("method, given, message", [
    ("cdpruner", {"relevance_weight": 1.5}, r"relevance_weight must be a finite number in \[0, 1\], got 1.5"),
    ("cdpruner", {"relevance_weight": float("nan")}, "relevance_weight must be a finite number in .*got nan"),
    ("cdpruner", {"relevance_weight": True}, "relevance_weight must be .*got True"),
    ("cdpruner", {"relevance_weight": "0.5"}, "relevance_weight must be .*got '0.5'"),
    ("dart", {"pivots": 0}, r"pivots must be an integer in 1..4096, got 0"),
    ("dart", {"relevance_weight": 0.5}, "option relevance_weight is not taken by method 'dart' \\(it takes pivots\\); "
                                         "relevance_weight is an option of 'cdpruner'"),
    ("coverpruner", {"pivots": 2}, "option pivots is not taken by method 'coverpruner' \\(it takes no method options\\)"),
])
def test_bad_method_options_are_refused_in_one_line(method, given, message):
    with pytest.raises(ValueError, match=message) as info:
        method_options(method, given)
    assert "\n" not in str(info.value)


def test_selectors_check_their_own_options():
    with pytest.raises(ValueError, match="relevance_weight must be a finite number in"):
        cdpruner_select(np.eye(4), np.ones(4), 2, relevance_weight=float("inf"))
    with pytest.raises(ValueError, match="pivots must be an integer"):
        dart_select(np.eye(4), None, 2, pivots=2.5)


def test_video_windows_run_each_window_with_the_methods_options():
    """select_in_windows (the pipeline's video_window path) passes the method's options to every window: three
    windows of 20 tokens, budget 15 -> 5 per window, each the literal reference on that window's rows."""
    from coverpruner.selection import select_in_windows

    v, r, _ = peer_case("random", 3)
    v, r = v[:60], r[:60]
    windows = np.repeat(np.arange(3), 20)
    got = select_in_windows(get_selector("cdpruner"), v, r, 15, windows, relevance_weight=0.5)
    want = np.concatenate([20 * w + cdpruner_reference(v[20 * w:20 * w + 20], r[20 * w:20 * w + 20], 5, 0.5)
                           for w in range(3)])
    np.testing.assert_array_equal(got, want)
    got = select_in_windows(get_selector("dart"), v, None, 15, windows, pivots=2)
    want = np.concatenate([20 * w + dart_reference(v[20 * w:20 * w + 20], 5, 2) for w in range(3)])
    np.testing.assert_array_equal(got, want)
