"""Coverage selection in torch: CPU or CUDA tensors, single [n, d] or batched [B, n, d].

Same greedy and tie rule as coverage.py. float64 by default on the CPU (the reference's indices); float32 by
default on CUDA, where float64 is slow on most GPUs: genuine float32 near-ties may then break differently, with a
float32-sized tie window (`tie_rtol(n, float32)`), never a wider one.
torch is imported lazily so `coverpruner.selection` stays importable without it.
"""

from __future__ import annotations

from .coverage import EPS64, NORM_EPS, ZERO_ULPS, incremental_margin, tie_rtol
from ._inputs import check_budget, check_features, check_relevance, check_tau


def coverage_select_torch(features, relevance=None, budget: int = 64, tau: float = 0.3, dtype=None):
    """features: torch.Tensor [n, d] or [B, n, d]; relevance: [n] / [B, n] tensor or None.

    Returns int64 indices [m] (or [B, m]) sorted ascending, on the features' device.
    """
    import torch

    if not isinstance(features, torch.Tensor):
        features = torch.as_tensor(check_features(features, allow_batch=True))
    check_features(features, allow_batch=True)  # shape + finiteness, one clear message
    budget = check_budget(budget)
    tau = check_tau(tau)
    batched = features.dim() == 3
    v = features if batched else features.unsqueeze(0)
    bsz, n, _ = v.shape
    check_relevance(relevance, n, batch=bsz if batched else None)
    device = v.device
    if dtype is None:
        dtype = torch.float32 if device.type == "cuda" else torch.float64
    if budget >= n:
        idx = torch.arange(n, device=device).expand(bsz, n).clone()
        return idx if batched else idx[0]

    a = _utilities(v.to(dtype))
    w = _weights(relevance, bsz, n, tau, dtype, device)
    picks = _greedy(a, w, budget)
    picks, _ = torch.sort(picks, dim=1)
    return picks if batched else picks[0]


def _utilities(v):
    """v [B, n, d] -> A [B, n, n] = max(0, M - rowmean(M)), M = cosine."""
    import torch

    v = v / torch.clamp(torch.linalg.vector_norm(v, dim=-1, keepdim=True), min=NORM_EPS)
    m = torch.bmm(v, v.transpose(1, 2))
    m -= m.mean(dim=-1, keepdim=True)
    return m.clamp_(min=0.0)


def _weights(relevance, bsz, n, tau, dtype, device):
    """[B, n] demand weights exp(tau * minmax(r)); None or constant relevance -> ones."""
    import torch

    if relevance is None:
        return torch.ones(bsz, n, dtype=dtype, device=device)
    r = torch.as_tensor(relevance, device=device).to(dtype).reshape(-1, n).expand(bsz, n)
    lo = r.min(dim=1, keepdim=True).values
    span = r.max(dim=1, keepdim=True).values - lo
    scaled = torch.where(span > 0, (r - lo) / torch.where(span > 0, span, 1.0), torch.zeros_like(r))
    return torch.exp(tau * scaled)


def _greedy(a, w, budget):
    """Greedy on A [B, n, n], w [B, n]; returns picks [B, m] in pick order.

    float64 with B == 1 (the CPU path): the incremental update touching only the rows whose coverage rose, with
    coverage.py's fresh recomputation of the near-best candidates before each pick. Otherwise (batches, float32)
    the gains are recomputed from scratch every step, sum_i w_i max(0, A_ik - c_i) as one batched product: the
    same O(B n^2) per step a dense incremental update costs, and float32 gains then carry only their own sum's
    rounding, not the rounding of m subtractions from the much larger first-step gains.
    """
    import torch

    if a.dtype == torch.float64 and a.shape[0] == 1:
        return _greedy_incremental_single(a, w, budget)
    bsz, n, _ = a.shape
    rtol = tie_rtol(n, _numpy_dtype(a.dtype))
    # coverage.zero_level for float64 gains; float32 gains get no absolute part (exhausted columns are exact
    # zeros there: the gains are recomputed from utilities that c was taken from)
    atol = ZERO_ULPS * EPS64 * w.sum(dim=1, keepdim=True) if a.dtype == torch.float64 else 0.0
    c = torch.zeros(bsz, n, 1, dtype=a.dtype, device=a.device)
    selected = torch.zeros(bsz, n, dtype=torch.bool, device=a.device)
    batch = torch.arange(bsz, device=a.device)
    picks = torch.empty(bsz, budget, dtype=torch.int64, device=a.device)
    w_row = w.unsqueeze(1)  # [B, 1, n]
    for step in range(budget):
        gain = torch.bmm(w_row, torch.clamp(a - c, min=0.0)).squeeze(1)  # [B, n]
        gain.masked_fill_(selected, float("-inf"))
        k = _lowest_tied(gain, rtol, atol)
        picks[:, step] = k
        selected[batch, k] = True
        c = torch.maximum(c, a[batch, :, k].unsqueeze(2))
    return picks


def _lowest_tied(gain, rtol, atol):
    """[B, n] gains -> [B] index of the lowest gain within rtol * |best| + atol of each row's best."""
    import torch

    best = gain.max(dim=1, keepdim=True).values
    # argmax of a boolean mask returns its first True: the lowest tied index
    return torch.argmax((gain >= best - (rtol * best.abs() + atol)).to(torch.uint8), dim=1)


def _numpy_dtype(dtype):
    import numpy as np
    import torch

    return {torch.float64: np.float64, torch.float32: np.float32}.get(dtype, dtype)


def _greedy_incremental_single(a, w, budget):
    """coverage.greedy_incremental in torch, float64, A [1, n, n], w [1, n] -> picks [1, m]."""
    import torch

    a0, w0 = a[0], w[0]
    n = a0.shape[0]
    c = torch.zeros(n, dtype=a.dtype, device=a.device)
    gain = w0 @ a0  # [n]
    rtol, atol = tie_rtol(n), ZERO_ULPS * EPS64 * float(w0.sum())
    margin = incremental_margin(n, budget, float(gain.max()), atol)
    picks = torch.empty(1, budget, dtype=torch.int64, device=a.device)
    for step in range(budget):
        cand = torch.nonzero(gain >= gain.max() - margin).squeeze(1)
        if cand.numel() > 1:  # near-tie or exhausted coverage: decide on fresh sums, as the reference does
            fresh = w0 @ torch.clamp(a0[:, cand] - c.unsqueeze(1), min=0.0)
            gain[cand] = fresh
            k = cand[_lowest_tied(fresh.unsqueeze(0), rtol, atol)[0]]
        else:
            k = cand[0]
        picks[0, step] = k
        col = a0[:, k]
        rows = torch.nonzero(col > c).squeeze(1)
        if rows.numel():
            lo = c[rows].unsqueeze(1)
            hi = col[rows].unsqueeze(1)
            gain -= w0[rows] @ (torch.clamp(a0[rows], min=lo, max=hi) - lo)
            c[rows] = col[rows]
        gain[k] = float("-inf")  # stays -inf: later updates subtract finite amounts
    return picks
