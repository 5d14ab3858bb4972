"""Host-side (numpy) data-dependent inputs of the Qwen3-VL / Qwen3.5 vision graph (one tower), which HF computes
per request from grid_thw (transformers.vision_utils); the graph takes them as tensors, so it has no data-dependent Python:

    vision_position_ids int64   [N, 2]  (row, col) of each 16-px patch, merge-block-major (the 2-D rotary)
    interp_indices      int64   [N, 4]  the four learned-position-grid cells each patch interpolates
    interp_weights      float32 [N, 4]  their bilinear weights (align_corners=True, as HF)
    full_segments       int64   [N]     frame id of each patch (attention stays within a frame)

N = t*gh*gw patches. Every vision block attends over the whole frame (Qwen3-VL has no window attention).
"""

from __future__ import annotations

import numpy as np

VISION_INPUTS = ("pixel_values", "vision_position_ids", "interp_indices", "interp_weights", "full_segments")


def _rows_cols(t: int, h: int, w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    rows = rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    cols = cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    return np.tile(rows, t), np.tile(cols, t)


def _taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear taps [n, 2] into a side-long axis and weights [n, 2] for target index on a size-long axis, in
    float32 as HF (src = index * (side - 1) / max(size - 1, 1))."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    offsets = np.arange(2)
    taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
    weights = np.clip(np.float32(1) - np.abs(src[:, None] - floor[:, None] - offsets.astype(np.float32)), 0, None)
    return taps, weights.astype(np.float32)


def vision_inputs(pixel_values: np.ndarray, grid_thw, merge: int, num_position_embeddings: int) -> dict:
    """All inputs of vision.onnx for one image or video (names in VISION_INPUTS)."""
    t, h, w = (int(v) for v in grid_thw)
    side = int(num_position_embeddings ** 0.5)
    rows, cols = _rows_cols(t, h, w, merge)
    (ht, hw), (wt, ww) = _taps(rows, h, side), _taps(cols, w, side)
    return {
        "pixel_values": pixel_values,
        "vision_position_ids": np.stack([rows, cols], -1).astype(np.int64),
        "interp_indices": (ht[:, :, None] * side + wt[:, None, :]).reshape(-1, 4).astype(np.int64),
        "interp_weights": (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4).astype(np.float32),
        "full_segments": np.repeat(np.arange(t, dtype=np.int64), h * w),
    }
