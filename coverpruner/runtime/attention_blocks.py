"""Bidirectional prefill blocks (contract v5, graphs.decoder.attention "blocks") over a conversation (numpy only).

A family that declares blocks gives each image span's rows a block (ImageSpan.blocks: Gemma 3's crops); here they
become one id per native row (-1 at text rows and rows without a block), carried beside the decoder extras under
engine_dir.ATTENTION_BLOCKS so the kept rows' ids reach the decoder with the same gather as the embeddings. A
prefill call always holds a block's kept rows together, so a cached prefix is restored only up to a block boundary:
a row of a block saw the block's later rows, so its KV is only reusable with the whole block.
"""

from __future__ import annotations

import numpy as np

from coverpruner.engines.interfaces import KVSnapshot
from coverpruner.runtime.prefix_cache import truncate


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


def whole_blocks(blocks: np.ndarray | None, cached: int, prefix: KVSnapshot | None) -> tuple[int, KVSnapshot | None]:
    """The longest part of a cached prefix of ``cached`` rows that splits no block: (rows, its snapshot). blocks:
    int64 [L'] of the pruned rows (None: no blocks, the prefix is kept)."""
    if blocks is None or cached == 0 or prefix is None:
        return cached, prefix
    cut = cached
    while cut:
        head, tail = blocks[:cut], blocks[cut:]
        split = np.intersect1d(head[head >= 0], tail)
        if not split.size:
            break
        cut = int(np.flatnonzero(np.isin(blocks, split))[0])  # before the first row of a split block
    return (cut, truncate(prefix, cut)) if cut else (0, None)
