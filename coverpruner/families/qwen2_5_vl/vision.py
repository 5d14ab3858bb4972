"""Host-side (numpy) data-dependent parts of the Qwen2.5-VL vision tower, fed to vision.onnx as inputs.

HF computes these in Python per request from grid_thw (transformers.vision_utils): the 2-D rotary
position of every 14-px patch, the window order (merged tokens grouped window by window) and the
cumulative sequence lengths of the windows and of whole images. The graph takes them as tensors, so it
has no Loop over windows and no data-dependent Python:

    vision_position_ids int64 [N, 2]  (row, col) of each patch in processor (native) order
    window_index        int64 [n]     merged-token order of window attention (native index per slot)
    window_inverse      int64 [n]     argsort(window_index): puts merger outputs back in native order
    window_gather       int64 [W, S]  window-ordered patch row of each slot of W windows padded to S slots
                                      (padding slots repeat the window's first row)
    window_lengths      int64 [W]     real slots of each window (the rest are masked as keys)
    window_scatter      int64 [N]     flat slot (w*S + j) of each window-ordered patch row
    full_segments       int64 [N]     image id of each patch, in window order (full-attention blocks)

N = t*gh*gw patches, n = N / merge^2 merged tokens (the visual tokens), W windows of at most S patches.
Window blocks attend within a window as a batch of W small attentions (cost W*S^2, not N^2); full blocks
attend within an image through a block-diagonal mask built from full_segments (the dense form of
cu_seqlens: two patches attend to each other iff their segment ids are equal).
"""

from __future__ import annotations

import numpy as np

VISION_INPUTS = ("pixel_values", "vision_position_ids", "window_index", "window_inverse", "window_gather",
                 "window_lengths", "window_scatter", "full_segments")


def vision_position_ids(grid_thw, merge: int) -> np.ndarray:
    """int64 [N, 2]: (row, col) of each patch, merge-block-major like the processor's patch order."""
    out = []
    for t, h, w in np.asarray(grid_thw).reshape(-1, 3).tolist():
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        shape = (h // merge, merge, w // merge, merge)
        rows = rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
        cols = cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
        out.append(np.tile(np.stack([rows, cols], -1), (t, 1)))
    return np.concatenate(out).astype(np.int64)


def window_index(grid_thw, merge: int, window_size: int, patch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(window_index int64 [n], cu_window_seqlens int64 [W+1] in patches) for window attention.

    Windows tile the merged-token grid in squares of window_size / (merge*patch) tokens from the top-left;
    edge windows are smaller. Tokens are listed window by window, row-major inside a window.
    """
    side = window_size // merge // patch_size
    unit = merge * merge
    index, cu, offset = [], [0], 0
    for t, h, w in np.asarray(grid_thw).reshape(-1, 3).tolist():
        gh, gw = h // merge, w // merge
        ids = np.arange(t * gh * gw).reshape(t, gh, gw)
        for frame in range(t):
            for r0 in range(0, gh, side):
                for c0 in range(0, gw, side):
                    win = ids[frame, r0:r0 + side, c0:c0 + side].reshape(-1)
                    index.append(win + offset)
                    cu.append(cu[-1] + win.size * unit)
        offset += t * gh * gw
    return np.concatenate(index).astype(np.int64), np.asarray(cu, dtype=np.int64)


def image_cu_seqlens(grid_thw) -> np.ndarray:
    """int64 [F+1]: patch boundaries of every frame (full attention within a frame, as HF)."""
    sizes = [h * w for t, h, w in np.asarray(grid_thw).reshape(-1, 3).tolist() for _ in range(t)]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def segments(cu_seqlens: np.ndarray) -> np.ndarray:
    """int64 [cu[-1]]: segment id of each position (the dense form of cu_seqlens)."""
    lengths = np.diff(np.asarray(cu_seqlens, dtype=np.int64))
    return np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)


def padded_windows(cu_seqlens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gather int64 [W, S], lengths int64 [W], scatter int64 [N]) for windows given by cu_seqlens (see the
    module doc); S = the longest window."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    starts, lengths = cu[:-1], np.diff(cu)
    slots = int(lengths.max())
    j = np.arange(slots, dtype=np.int64)
    gather = np.where(j[None, :] < lengths[:, None], starts[:, None] + j[None, :], starts[:, None])
    row_window = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    scatter = row_window * slots + (np.arange(cu[-1], dtype=np.int64) - starts[row_window])
    return gather.astype(np.int64), lengths, scatter


def vision_inputs(pixel_values: np.ndarray, grid_thw, merge: int, window_size: int, patch_size: int) -> dict:
    """All inputs of vision.onnx for one preprocessed image (names in VISION_INPUTS)."""
    win, cu_win = window_index(grid_thw, merge, window_size, patch_size)
    gather, lengths, scatter = padded_windows(cu_win)
    return {
        "pixel_values": pixel_values,
        "vision_position_ids": vision_position_ids(grid_thw, merge),
        "window_index": win,
        "window_inverse": np.argsort(win).astype(np.int64),
        "window_gather": gather,
        "window_lengths": lengths,
        "window_scatter": scatter,
        "full_segments": segments(image_cu_seqlens(grid_thw)),
    }


def temporal_chunks(pixel_values: np.ndarray, grid_thw, merge: int, window_size: int, patch_size: int,
                    per_chunk: int = 1) -> tuple[dict, ...]:
    """vision.onnx feeds of a video in chunks of ``per_chunk`` temporal patches (the last may be shorter).

    Every attention of the tower stays inside one temporal patch (windows and full-attention segments are per
    frame pair), so the merged tokens of chunk c are rows [c*per_chunk*gh*gw/merge^2, ...) of the whole video's
    output, in order: concatenating the chunks' outputs gives the unchunked output while one run holds the
    activations of per_chunk*gh*gw patches instead of t*gh*gw (the full-attention scores grow with the square of
    the patches of one run). pixel_values: [t*gh*gw, K] (a view per chunk, no copy)."""
    t, gh, gw = (int(x) for x in np.asarray(grid_thw).reshape(3))
    if per_chunk < 1:
        raise ValueError(f"per_chunk must be >= 1, got {per_chunk}")
    patches = gh * gw
    chunks, shared = [], {}
    for start in range(0, t, per_chunk):
        size = min(per_chunk, t - start)
        if size not in shared:  # index feeds depend on the chunk's grid only
            full = vision_inputs(pixel_values[:0], (size, gh, gw), merge, window_size, patch_size)
            shared[size] = {k: v for k, v in full.items() if k != "pixel_values"}
        chunks.append({"pixel_values": pixel_values[start * patches:(start + size) * patches], **shared[size]})
    return tuple(chunks)
