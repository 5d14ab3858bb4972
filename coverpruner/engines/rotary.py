"""Host-side rotary rows for the ORT-form decoder (numpy only).

GroupQueryAttention (do_rotary=1) rotates query row s of batch entry b with row `position_ids[b, 0] + s` of
its cos/sin cache. We feed, instead of a cache indexed by position, the rows of exactly the tokens of the
call, so any position layout works: 1-D (LLaVA, re-packed), M-RoPE 3-D (Qwen2.5-VL: each half-dim section
takes its frequencies from the T, H or W position), gaps left by pruning.
"""

from __future__ import annotations

import numpy as np


def inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """[head_dim/2] float32 inverse frequencies, computed in float32 as transformers' default rope does."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    return (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(np.float32)


def rotary_rows(positions: np.ndarray, head_dim: int, theta: float,
                mrope_section: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [L, head_dim/2] float32 for positions [L] (1-D) or [3, L] (T/H/W, with `mrope_section`).

    M-RoPE (transformers' Qwen2.5-VL apply_multimodal_rotary_pos_emb): half-dim slot j uses the T position
    for j < s0, H for s0 <= j < s0+s1, W after; the full-dim duplicate half repeats the same sections.
    """
    freq = inv_freq(head_dim, theta)
    pos = np.asarray(positions).astype(np.float32)
    if pos.ndim == 1:
        angles = pos[:, None] * freq[None, :]
    else:
        if mrope_section is None or sum(mrope_section) != head_dim // 2:
            raise ValueError(f"mrope_section must sum to head_dim/2={head_dim // 2}, got {mrope_section}")
        axis = np.repeat(np.arange(3), mrope_section)  # [head_dim/2]: which of T/H/W feeds each slot
        angles = pos[axis, :].T * freq[None, :]
    # float32 angles (one correctly rounded product, as torch's float32 matmul of a rank-1 outer product).
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
