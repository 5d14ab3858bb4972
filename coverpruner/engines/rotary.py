"""Host-side rotary rows for the ORT-form decoder (numpy only).

GroupQueryAttention (do_rotary=1) rotates query row s of batch entry b with row `position_ids[b, 0] + s` of
its cos/sin cache (in a first prompt, with row s whatever position_ids say: KVSlots.run_prompts). We feed,
instead of a cache indexed by position, the rows of exactly the tokens of the call, so any position layout
works: 1-D (LLaVA, re-packed), M-RoPE 3-D (Qwen2.5-VL: each half-dim section takes its frequencies from the T,
H or W position; Qwen3-VL: T/H/W interleaved slot by slot), gaps left by pruning.
"""

from __future__ import annotations

import numpy as np


def inv_freq(head_dim: int, theta: float, factor: float = 1.0) -> np.ndarray:
    """[head_dim/2] float32 inverse frequencies, computed in float32 as transformers' default rope does; a linear
    rope scaling ``factor`` divides them (transformers' "linear" rope_type: inv_freq / factor, in float32)."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    freq = (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(np.float32)
    return freq if factor == 1.0 else (freq / np.float32(factor)).astype(np.float32)


def mrope_axes(mrope_section: list[int], half: int, interleaved: bool = False) -> np.ndarray:
    """int64 [half]: which position row (0 = T, 1 = H, 2 = W) feeds each half-dim frequency slot.

    Blocks (Qwen2.5-VL's apply_multimodal_rotary_pos_emb): slot j is T for j < s0, H for s0 <= j < s0+s1, W after.
    Interleaved (Qwen3-VL's apply_interleaved_mrope): slot j is H for j = 1, 4, .. < 3*s1, W for j = 2, 5, .. < 3*s2,
    T elsewhere. ValueError (one line) unless the sections sum to ``half``.
    """
    if mrope_section is None or len(mrope_section) != 3 or sum(mrope_section) != half:
        raise ValueError(f"mrope_section must be 3 sizes summing to head_dim/2={half}, got {mrope_section}")
    if not interleaved:
        return np.repeat(np.arange(3), mrope_section)
    axis = np.zeros(half, dtype=np.int64)
    for row, offset in ((1, 1), (2, 2)):
        axis[offset:3 * mrope_section[row]:3] = row
    return axis


def rotary_rows(positions: np.ndarray, head_dim: int, theta: float,
                mrope_section: list[int] | None = None, interleaved: bool = False,
                factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [L, head_dim/2] float32 for positions [L] (1-D) or [3, L] (T/H/W, with `mrope_section`; the
    layout of `mrope_axes`: blocks, or interleaved). The full-dim duplicate half repeats the same slots. factor:
    linear rope scaling (inv_freq)."""
    freq = inv_freq(head_dim, theta, factor)
    pos = np.asarray(positions).astype(np.float32)
    if pos.ndim == 1:
        angles = pos[:, None] * freq[None, :]
    else:
        axis = mrope_axes(mrope_section, head_dim // 2, interleaved)  # [head_dim/2]: which of T/H/W feeds a slot
        angles = pos[axis, :].T * freq[None, :]
    # float32 angles (one correctly rounded product, as torch's float32 matmul of a rank-1 outer product).
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
