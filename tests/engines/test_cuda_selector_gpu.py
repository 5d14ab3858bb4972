"""The CUDA kernel against the numpy reference on the paper's shapes (needs a CUDA GPU; skipped otherwise).

Shapes: LLaVA-1.5 7B/13B (n = 576, d = 4096/5120, m = 64/128/192) and LLaVA-NeXT (n = 2880, m = 320).
The kernel computes A in float32 (its gains in double) and the literal reference (tests/literal_selection.py) in
float64: the same indices, or where a genuine float32 near-tie moves the greedy, a set whose float64 coverage
objective is not worse than the reference's x (1 - 1e-7).
"""

from __future__ import annotations

import numpy as np
import pytest

from ..literal_selection import assert_same_or_not_worse, coverage_reference, objective, utilities, weights
from .conftest import requires_gpu, requires_torch_cuda

pytestmark = [pytest.mark.gpu, requires_gpu, requires_torch_cuda]  # CUDA tensors in

PAPER_CASES = [(576, 4096, 64), (576, 4096, 128), (576, 4096, 192), (576, 5120, 64), (2880, 4096, 320)]


def _features(n, d, seed):
    """Projector-like features: clustered (image regions) plus per-token noise, with a common offset."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(4, n // 24), d))
    v = centres[rng.integers(0, len(centres), n)] + 0.6 * rng.standard_normal((n, d)) + 0.3
    return v.astype(np.float32), rng.random(n).astype(np.float32)


def _coverage(features, relevance, keep):
    return objective(utilities(features), weights(relevance, 0.3, len(features)), keep)


@pytest.fixture(scope="module")
def selector(native_libs):
    from coverpruner.engines.cuda_selector import CudaCoverageSelector

    return CudaCoverageSelector(native_libs.selector)


@pytest.mark.parametrize("n,d,m", PAPER_CASES)
def test_float32_indices_equal_reference(selector, n, d, m):
    import torch

    v, r = _features(n, d, seed=n + d + m)
    got = selector(torch.from_numpy(v).cuda(), torch.from_numpy(r).cuda(), budget=m, tau=0.3)
    torch.cuda.synchronize()
    assert_same_or_not_worse(got.cpu().numpy(), v, r, m)


@pytest.mark.parametrize("n,d,m", PAPER_CASES[:2])
def test_float16_features_keep_coverage(selector, n, d, m):
    """fp16 inputs (fp32 accumulation) may break near-ties differently; the coverage objective must hold."""
    import torch

    v, r = _features(n, d, seed=7 * n + m)
    want = coverage_reference(v, r, m)
    got = selector(torch.from_numpy(v).half().cuda(), torch.from_numpy(r).cuda(), budget=m).cpu().numpy()
    assert got.shape == (m,) and np.all(np.diff(got) > 0)
    assert len(np.intersect1d(got, want)) >= 0.9 * m
    assert _coverage(v, r, got) >= (1 - 1e-3) * _coverage(v, r, want)


def test_batch_equals_single(selector):
    import torch

    feats, rels = zip(*[_features(576, 1024, seed=s) for s in range(3)])
    v = torch.from_numpy(np.stack(feats)).cuda()
    r = torch.from_numpy(np.stack(rels)).cuda()
    batched = selector(v, r, budget=64).cpu().numpy()
    for b in range(3):
        np.testing.assert_array_equal(batched[b], selector(v[b], r[b], budget=64).cpu().numpy())
        assert_same_or_not_worse(batched[b], feats[b], rels[b], 64)


def test_edge_budgets_ties_and_uniform_weights(selector):
    import torch

    v, r = _features(100, 64, seed=3)
    tv, tr = torch.from_numpy(v).cuda(), torch.from_numpy(r).cuda()
    np.testing.assert_array_equal(selector(tv, tr, budget=100).cpu().numpy(), np.arange(100))
    np.testing.assert_array_equal(selector(tv, tr, budget=500).cpu().numpy(), np.arange(100))
    assert selector(tv, tr, budget=0).numel() == 0
    # no relevance and constant relevance both mean uniform weights
    uniform = selector(tv, None, budget=20).cpu().numpy()
    assert_same_or_not_worse(uniform, v, None, 20)
    np.testing.assert_array_equal(selector(tv, torch.full_like(tr, 0.5), budget=20).cpu().numpy(), uniform)
    # exact duplicates (identical rows, so identical float32 utility columns): tied gains go to the lowest index
    dup = np.repeat(v[:10], 5, axis=0)
    for m in (5, 10):
        got = selector(torch.from_numpy(dup).cuda(), None, budget=m).cpu().numpy()
        assert np.all(got % 5 == 0), got  # always the first of each group of 5 copies
        assert_same_or_not_worse(got, dup, None, m)


def test_bad_input_is_named(selector):
    import torch

    with pytest.raises(ValueError, match="float32 or float16"):
        selector(torch.zeros(4, 4, dtype=torch.float64, device="cuda"), budget=2)
    with pytest.raises(ValueError, match="relevance must be"):
        selector(torch.zeros(4, 4, device="cuda"), torch.zeros(5, device="cuda"), budget=2)
    with pytest.raises(TypeError, match="CUDA tensor"):
        selector(torch.zeros(4, 4), budget=2)
