"""The ORT-form decoder's attention inputs beyond causal (contract v5), built on the host (numpy only).

A decoder whose prefill lets the rows of a block (an image crop's kept soft tokens) attend to each other both ways
runs GroupQueryAttention with its causal mask off and one additive mask per distinct sliding window
(engine_dir.attention_bias_name: "attention_bias" for full layers, "attention_bias.<W>"), float [B, 1, S, T]:

    entry b has P_b cached rows and S_b new rows (blocks_b [S_b]: each new row's block, -1 for text); new row s sits
    at q = P_b + s; key k (0 <= k < T) is attended when
        k < P_b + S_b  and  (k <= q  or  block(k) == blocks_b[s] >= 0)  and  (no window  or  k > q - W)
    where block(k) is blocks_b[k - P_b] for a new row and -1 for a cached one (a block is never split between two
    calls), i.e. AND(window, OR(causal, same block)), as transformers composes Gemma 3's masks.

Attended keys get 0, the others the float type's lowest value. Rows past S_b (right padding of a batched first
prompt) attend causally, so no row is all masked. A second rotary base (rotary "tables": Gemma 3's local layers)
has its own cos/sin rows (engines/rotary.py).
"""

from __future__ import annotations

import numpy as np

from coverpruner.engine_dir import ATTENTION_BIAS, rotary_names
from coverpruner.engines.rotary import rotary_rows


def bias_inputs(input_names) -> dict[str, int | None]:
    """{attention bias input name: its window (None: full layers)} of a decoder graph's inputs; {} for a causal
    decoder."""
    out = {}
    for name in input_names:
        if name == ATTENTION_BIAS:
            out[name] = None
        elif name.startswith(ATTENTION_BIAS + "."):
            out[name] = int(name[len(ATTENTION_BIAS) + 1:])
    return out


def attention_bias(starts, lengths, blocks, total: int, window: int | None, dtype) -> np.ndarray:
    """The additive mask [B, 1, S, total] of one call (module docstring): starts int [B] (cached rows P_b),
    lengths int [B] (new rows S_b <= S), blocks: per entry int64 [S_b] or None (all text); S = max(lengths)."""
    starts, lengths = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    s_max = int(lengths.max())
    low = np.finfo(dtype).min
    out = np.empty((len(starts), 1, s_max, total), dtype)
    keys = np.arange(total, dtype=np.int64)[None, :]
    rows = np.arange(s_max, dtype=np.int64)[:, None]
    for b, (p, n) in enumerate(zip(starts.tolist(), lengths.tolist())):
        q = p + rows  # [S, 1] absolute position of each new row
        allowed = keys <= q
        if blocks is not None and blocks[b] is not None and len(blocks[b]):
            own = np.full(s_max, -1, np.int64)
            own[:n] = blocks[b]
            at = np.full(total, -1, np.int64)
            at[p:p + n] = blocks[b]
            allowed = allowed | ((at[None, :] == own[:, None]) & (own[:, None] >= 0))
        allowed &= (keys < p + n) | (rows >= n)  # padding rows (s >= S_b) stay causal: never all masked
        if window is not None:
            allowed &= keys > q - window
        out[b, 0] = np.where(allowed, 0, low)
    return out


class AttentionInputs:
    """The extra inputs one ORT-form decoder session takes: its attention biases (with blocks) and its further
    rotary tables. input_names: the session's inputs; rotary: graphs.decoder.rotary."""

    def __init__(self, input_names, rotary: dict, head_dim: int):
        self.biases = bias_inputs(input_names)
        self.tables = list(rotary.get("tables") or [])
        self.hd = head_dim
        self.section, self.interleaved = rotary.get("mrope_section"), bool(rotary.get("mrope_interleaved", False))
        self.names = tuple(self.biases) + tuple(n for k in range(1, len(self.tables) + 1) for n in rotary_names(k))

    def bias_feeds(self, starts, lengths, blocks, total: int, dtype) -> dict[str, np.ndarray]:
        """{bias input: float [B, 1, S, total]} of one call ({} for a causal decoder)."""
        return {name: attention_bias(starts, lengths, blocks, total, window, dtype)
                for name, window in self.biases.items()}

    def table_rows(self, positions: np.ndarray) -> list[tuple[tuple[str, str], np.ndarray, np.ndarray]]:
        """[((cos name, sin name), cos, sin [S, hd/2])] of the further rotary tables for positions [R, S]."""
        positions = np.asarray(positions)
        positions = positions[0] if positions.ndim == 2 and len(positions) == 1 else positions
        return [(rotary_names(k), *rotary_rows(positions, self.hd, float(t["theta"]), self.section, self.interleaved,
                                              float(t.get("factor", 1.0))))
                for k, t in enumerate(self.tables, start=1)]
