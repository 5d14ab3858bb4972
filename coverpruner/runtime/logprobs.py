"""Log-probabilities of generated tokens (OpenAI's ``logprobs`` / ``top_logprobs``), torch-free.

What is reported is the model's own distribution: log_softmax of the decoder's raw logits at that step, before
the sampling adjustments (frequency / presence penalties, logit_bias) and before temperature / top-p, as OpenAI
documents its logprobs. Computed in float64 from the float32 logits, so the only rounding is float64's (~1e-12
relative on these magnitudes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its id, its log-probability, and the ``top`` most likely ids at that step with
    theirs, most likely first (ties: lower id first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """logits float [V] -> float64 [V] log-probabilities (max-shifted, so no overflow)."""
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """logits float [V] of the step that produced ``token`` -> its TokenLogprob with the ``top`` (0..V) best."""
    lp = log_softmax(logits)
    best: tuple = ()
    if top:
        k = min(int(top), lp.size)
        ids = np.argpartition(-lp, k - 1)[:k]
        ids = ids[np.lexsort((ids, -lp[ids]))]  # by logprob descending, then id ascending
        best = tuple((int(i), float(lp[i])) for i in ids)
    return TokenLogprob(int(token), float(lp[int(token)]), best)
