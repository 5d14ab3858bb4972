"""Qwen2.5-VL multimodal rotary (M-RoPE) positions in numpy, torch-free.

Native positions follow HF `Qwen2_5_VLModel.get_rope_index` for one sequence with images:
  * a run of text tokens continues one counter in all three components (t = h = w);
  * an image's gh/2 x gw/2 merged tokens (row-major) get t = start, h = start + row, w = start + col,
    where start is the counter at the image; the counter then advances by max(gh, gw) / merge;
  * text after the image continues from there.
So positions are int64 [3, L] with max < L: an image of k x k tokens occupies k positions, not k*k.

After pruning (the design's rule for Qwen): the kept rows keep their NATIVE positions (no re-packing),
and the t-th generated token (t = 0, 1, ...) sits at max(native) + 1 + t in all three components, where
it would sit without pruning. Pruned generation therefore equals the full model with the dropped visual
columns masked out.
"""

from __future__ import annotations

import numpy as np


def native_positions(input_ids: np.ndarray, image_token_id: int, grids_thw, merge: int) -> np.ndarray:
    """int64 [3, L] for int64 input_ids [L] whose image tokens form one contiguous run per grid in grids_thw.

    Raises ValueError when the runs of image tokens do not match the grids' token counts.
    """
    ids = np.asarray(input_ids).reshape(-1)
    is_image = ids == image_token_id
    grids = [tuple(int(v) for v in g) for g in np.asarray(grids_thw).reshape(-1, 3)]
    # Runs of equal modality, as itertools.groupby over mm_token_type_ids in HF.
    edges = np.flatnonzero(np.diff(is_image.astype(np.int8))) + 1
    starts = np.concatenate([[0], edges]).astype(int)
    ends = np.concatenate([edges, [ids.size]]).astype(int)
    parts, pos, grid_iter = [], 0, iter(grids)
    for a, b in zip(starts, ends):
        if not is_image[a]:
            parts.append(np.broadcast_to(np.arange(pos, pos + b - a), (3, b - a)))
            pos += b - a
            continue
        grid = next(grid_iter, None)
        if grid is None:
            raise ValueError("more runs of image tokens than images")
        t, gh, gw = grid[0], grid[1] // merge, grid[2] // merge
        if t * gh * gw != b - a:
            raise ValueError(f"image run of {b - a} tokens does not match grid {grid} ({t * gh * gw} tokens)")
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
        parts.append(np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]) + pos)
        pos += max(gh, gw)
    if next(grid_iter, None) is not None:
        raise ValueError("fewer runs of image tokens than images")
    return np.concatenate(parts, axis=1).astype(np.int64) if parts else np.zeros((3, 0), np.int64)


def pruned_positions(native: np.ndarray, kept_rows: np.ndarray) -> np.ndarray:
    """int64 [3, L']: the native positions of the kept sequence rows (ascending row indices [L'])."""
    return np.ascontiguousarray(np.asarray(native)[:, np.asarray(kept_rows, dtype=np.int64)])


def decode_position(native: np.ndarray, step: int) -> np.ndarray:
    """int64 [3]: position of the `step`-th generated token (0-based): max(native) + 1 + step, all rows."""
    return np.full(3, int(np.max(native)) + 1 + int(step), dtype=np.int64)
