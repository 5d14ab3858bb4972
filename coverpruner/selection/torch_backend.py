"""Coverage selection in torch: CPU or CUDA tensors, single [n, d] or batched [B, n, d].

Same greedy and tie rule as coverage.py. float64 by default on the CPU (index parity with the reference);
float32 by default on CUDA, where float64 is slow on most GPUs (near-ties may then break differently).
torch is imported lazily so `coverpruner.selection` stays importable without it.
"""

from __future__ import annotations

from .coverage import NORM_EPS, TIE_RTOL
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
    """Incremental greedy on A [B, n, n], w [B, n]; returns picks [B, m] in pick order.

    For B == 1 only the rows whose coverage rose are touched (the CPU fast path); for B > 1 the update runs
    dense over all rows, where clip(a, c, c) - c = 0 leaves unchanged rows out without a gather.
    """
    import torch

    bsz, n, _ = a.shape
    c = torch.zeros(bsz, n, dtype=a.dtype, device=a.device)
    gain = torch.bmm(w.unsqueeze(1), a).squeeze(1)  # [B, n]
    atol = TIE_RTOL * w.sum(dim=1, keepdim=True)
    neg_inf = torch.tensor(float("-inf"), dtype=a.dtype, device=a.device)
    batch = torch.arange(bsz, device=a.device)
    picks = torch.empty(bsz, budget, dtype=torch.int64, device=a.device)
    for step in range(budget):
        best = gain.max(dim=1, keepdim=True).values
        # lowest index within atol of the best: argmax of a boolean mask returns its first True
        k = torch.argmax((gain >= best - atol).to(torch.uint8), dim=1)
        picks[:, step] = k
        col = a[batch, :, k]  # [B, n]: A[:, k*] per batch item
        if bsz == 1:
            rows = torch.nonzero(col[0] > c[0]).squeeze(1)
            if rows.numel():
                lo = c[0, rows].unsqueeze(1)
                hi = col[0, rows].unsqueeze(1)
                gain[0] -= w[0, rows] @ (torch.clamp(a[0, rows], min=lo, max=hi) - lo)
                c[0, rows] = col[0, rows]
        else:
            c_new = torch.maximum(c, col)
            lo = c.unsqueeze(2)
            delta = torch.clamp(a, min=lo, max=c_new.unsqueeze(2)) - lo
            gain -= torch.bmm(w.unsqueeze(1), delta).squeeze(1)
            c = c_new
        gain[batch, k] = neg_inf  # stays -inf: later updates subtract finite amounts
    return picks
