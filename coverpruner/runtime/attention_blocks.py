"""Bidirectional prefill blocks (contract v5, graphs.decoder.attention "blocks") over a conversation (numpy only).

A family that declares blocks gives each image span's rows a block (ImageSpan.blocks: Gemma 3's crops); here they
become one id per native row (-1 at text rows and rows without a block), carried beside the decoder extras under
engine_dir.ATTENTION_BLOCKS so the kept rows' ids reach the decoder with the same gather as the embeddings.

A row of a block sees the block's later rows, so a block's kept rows must run in ONE decoder call: no prefill chunk,
staging call or restored prefix may end inside it. Per request that is a tuple of "whole" ranges [a, b) of pruned
rows (``whole_ranges``: each block of two or more kept rows, from its first to its last row; a block of one kept row
attends exactly as a causal row does) that the engine's cuts respect:

    splits(whole, c)            a cut between rows c-1 and c falls inside a range (a < c < b)
    call_end(whole, start, stop) where a call of rows start..stop-1 may end instead (an earlier cut that splits
                                nothing, else the first later one: a block longer than the call is run whole)

The prefix cache restores whole 16-row blocks, cut back to the last one that splits no range (a block split across a
cache boundary is prefilled again, whole); the scheduler's chunks end at call_end with ``alone_last`` (a chunk's last
row runs by itself in the decode call, so it must not be a range's row); the admission worker's staging calls end
at call_end. A prompt whose last row is inside a range cannot be run this way (its last row's logits come from a
call of its own) and is refused at admission (chat templates end with the generation prompt's text).
"""

from __future__ import annotations

import numpy as np


def native_blocks(spans: list, image_spans: tuple, length: int) -> np.ndarray:
    """int64 [L]: each native row's block (unique over the conversation: image j's block v is one id), -1 for text
    rows and rows of images without blocks. spans: the images' contract.ImageSpan; image_spans: their rows' sequence
    indices (ConversationLayout.image_spans)."""
    out = np.full(length, -1, np.int64)
    next_id = 0
    for span, where in zip(spans, image_spans):
        if span.blocks is None:
            continue
        values, local = np.unique(np.asarray(span.blocks, np.int64), return_inverse=True)
        out[where] = next_id + local.reshape(-1)
        next_id += len(values)
    return out


def whole_ranges(blocks: np.ndarray | None) -> tuple[tuple[int, int], ...]:
    """The ranges [a, b) of rows one decoder call must hold together, ascending and disjoint: per block of two or more
    rows of ``blocks`` (int64 [L'], the pruned rows' ids, -1 for rows without a block; None: no blocks) its first to
    its last row, overlapping ranges merged (a block's rows need not be contiguous)."""
    if blocks is None:
        return ()
    blocks = np.asarray(blocks, np.int64)
    ids, first, counts = np.unique(blocks, return_index=True, return_counts=True)
    last = len(blocks) - 1 - np.unique(blocks[::-1], return_index=True)[1]
    spans = sorted((int(a), int(z) + 1) for i, a, z, n in zip(ids, first, last, counts) if i >= 0 and n > 1)
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and a < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return tuple((a, b) for a, b in merged)


def splits(whole, at: int, alone_last: bool = False) -> bool:
    """True when a call ending before row ``at`` cuts one of the ``whole`` ranges (a < at < b); with ``alone_last``
    (the call's last row runs by itself afterwards) also when row at-1 is a range's row (a < at <= b)."""
    return any(a < at < b + alone_last for a, b in whole)


def call_end(whole, start: int, stop: int, alone_last: bool = False) -> int:
    """Where a call of rows start..stop-1 (start < stop) may end: ``stop`` when it splits none of the ``whole``
    ranges (``splits``), else the latest earlier end after ``start`` that splits none, else the first later one (the
    range is run whole, past ``stop``)."""
    end = stop
    while end > start and splits(whole, end, alone_last):
        end = min(a for a, b in whole if a < end < b + alone_last)
    if end > start:
        return end
    end = stop
    while splits(whole, end, alone_last):
        end = max(b + alone_last for a, b in whole if a < end < b + alone_last)
    return end
