"""Qwen3-VL multimodal rotary (M-RoPE) positions in numpy, torch-free: HF `Qwen3VLModel.get_rope_index` for one
sequence. A run of text tokens continues one counter in t, h and w; an image's gh/2 x gw/2 merged tokens (row-major)
get t = start, h = start + row, w = start + col, and the counter advances by max(gh, gw) / 2. (A video is split
into one grid of t = 1 per temporal patch, each its own run between timestamp texts, so the same rule holds.)

After pruning, kept rows keep their native positions and the t-th generated token sits at max(native) + 1 + t, as
without pruning (pruning == masking the dropped columns). The interleaving of the t/h/w frequencies
(mrope_interleaved) happens inside the decoder's rotary, not here.
"""

from __future__ import annotations

import numpy as np


def native_positions(input_ids: np.ndarray, visual_ids, grids_thw, merge: int) -> np.ndarray:
    """int64 [3, L] for input_ids int64 [L] whose visual tokens (ids in ``visual_ids``) form one contiguous run
    per grid (t, gh, gw) of ``grids_thw`` (in order; t = 1 each). ValueError when runs and grids disagree."""
    ids = np.asarray(input_ids).reshape(-1)
    is_visual = np.isin(ids, np.atleast_1d(np.asarray(visual_ids, dtype=np.int64)))
    grids = [tuple(int(v) for v in g) for g in np.asarray(grids_thw).reshape(-1, 3)]
    edges = np.flatnonzero(np.diff(is_visual.astype(np.int8))) + 1
    starts = np.concatenate([[0], edges]).astype(int)
    ends = np.concatenate([edges, [ids.size]]).astype(int)
    parts, pos, grid_iter = [], 0, iter(grids)
    for a, b in zip(starts, ends):
        if a == b:
            continue
        if not is_visual[a]:
            parts.append(np.broadcast_to(np.arange(pos, pos + b - a), (3, b - a)))
            pos += b - a
            continue
        grid = next(grid_iter, None)
        if grid is None:
            raise ValueError("more runs of visual tokens than images")
        t, gh, gw = grid[0], grid[1] // merge, grid[2] // merge
        if t * gh * gw != b - a:
            raise ValueError(f"visual run of {b - a} tokens does not match grid {grid} ({t * gh * gw} tokens)")
        tt, hh, ww = np.meshgrid(np.zeros(t, np.int64), np.arange(gh), np.arange(gw), indexing="ij")
        parts.append(np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]) + pos)
        pos += max(gh, gw)
    if next(grid_iter, None) is not None:
        raise ValueError("fewer runs of visual tokens than images")
    return np.concatenate(parts, axis=1).astype(np.int64) if parts else np.zeros((3, 0), np.int64)


def decode_position(native: np.ndarray, step: int) -> np.ndarray:
    """int64 [3]: the step-th generated token (0-based) at max(native) + 1 + step in all rows."""
    return np.full(3, int(np.max(native)) + 1 + int(step), dtype=np.int64)
