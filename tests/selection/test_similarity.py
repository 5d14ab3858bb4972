"""selection.blocked.similarity: the one [n, n] buffer the numpy backend keeps. The greedy reads A's columns as
rows of M, so M must be symmetric bit for bit; its values are the cosine similarity (tests/literal_selection.py's
own, in float64) within the rounding of the dtype's GEMM."""

import numpy as np
import pytest

from coverpruner.selection import coverage_select
from coverpruner.selection.blocked import FLOAT64_MAX_N, similarity, utilities_dtype

from ..literal_selection import assert_same_or_not_worse, coverage_reference


def _features(n: int, d: int = 64, seed: int = 0) -> np.ndarray:
    """Rows of very different norms (1e-3 .. 1e3), so an unsymmetric scaling would show."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d)) * np.logspace(-3, 3, n)[:, None]).astype(np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_similarity_is_symmetric_bit_for_bit_and_the_cosine(dtype):
    v = _features(300)
    m, mu = similarity(v, dtype)
    assert m.dtype == dtype and mu.dtype == dtype and m.shape == (300, 300)
    np.testing.assert_array_equal(m, m.T)
    x = v.astype(np.float64)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = unit @ unit.T
    # float32: a 64-term float32 dot product of unit vectors and the two scalings, <= (d + 3) u32 ~ 4e-6
    tol = 4e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(m, cos, rtol=0, atol=tol)
    np.testing.assert_allclose(mu, m.astype(np.float64).mean(axis=1), rtol=0, atol=tol)


def test_float32_above_float64_max_n():
    assert utilities_dtype(FLOAT64_MAX_N) == np.float64 and utilities_dtype(FLOAT64_MAX_N + 1) == np.float32


def test_numpy_backend_just_above_the_float64_range_keeps_the_literal_greedy_set():
    """n = FLOAT64_MAX_N + 52 clustered tokens (float32 similarity): the literal float64 greedy's indices, or by
    the float32 rule a set whose float64 objective is not worse than the literal's x (1 - 1e-7)."""
    n = FLOAT64_MAX_N + 52
    rng = np.random.default_rng(2100)
    centres = rng.standard_normal((n // 16, 48))
    v = (centres[rng.integers(0, len(centres), n)] + 0.5 * rng.standard_normal((n, 48))).astype(np.float32)
    r = rng.random(n).astype(np.float32)
    keep = coverage_select(v, r, 40, 0.3, backend="numpy")
    assert_same_or_not_worse(keep, v, r, 40, want=coverage_reference(v, r, 40))
