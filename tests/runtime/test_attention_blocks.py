"""Contract v5's blocks in the runtime (runtime/attention_blocks.py): one id per native row, unique over a
conversation, and a cached prefix cut back so that no block is split between the restore and the prefill."""

from __future__ import annotations

import numpy as np

from coverpruner.engines.interfaces import KVSnapshot
from coverpruner.families.contract import ImageSpan
from coverpruner.runtime.attention_blocks import native_blocks, whole_blocks


def _span(blocks):
    n = len(blocks) if blocks is not None else 3
    return ImageSpan(np.zeros((n, 4), np.float32), np.arange(n), blocks=None if blocks is None else np.array(blocks))


def test_native_blocks_are_unique_per_image_and_crop():
    spans = [_span([0, 0, 1, 1]), _span(None), _span([5, 5, 2])]  # any values: renumbered per image, in order
    where = (np.array([1, 2, 4, 5]), np.array([7, 8, 9]), np.array([11, 12, 13]))
    got = native_blocks(spans, where, 15)
    want = np.full(15, -1)
    want[[1, 2, 4, 5]] = [0, 0, 1, 1]
    want[[11, 12, 13]] = [3, 3, 2]
    np.testing.assert_array_equal(got, want)


def _snap(length):
    keys = (np.arange(length, dtype=np.float32).reshape(1, 1, length, 1),)
    return KVSnapshot(length, keys, keys)


def test_cut_before_a_split_block():
    blocks = np.array([-1, -1, 0, 0, 0, -1, 1, 1, -1])
    assert whole_blocks(blocks, 4, _snap(4))[0] == 2  # inside block 0: back to its first row
    cut, snap = whole_blocks(blocks, 7, _snap(7))  # inside block 1, block 0 whole
    assert cut == 6 and snap.length == 6 and snap.keys[0].shape[2] == 6
    assert whole_blocks(blocks, 5, _snap(5))[0] == 5  # at a boundary: kept
    assert whole_blocks(blocks, 3, _snap(3))[0] == 2
    assert whole_blocks(np.array([0, 0, -1]), 1, _snap(1)) == (0, None)  # nothing before the block
    snap = _snap(4)
    assert whole_blocks(None, 4, snap) == (4, snap)  # no blocks: unchanged


def test_interleaved_blocks_cut_until_none_is_split():
    blocks = np.array([-1, 0, 1, 0, 1, -1])  # blocks need not be contiguous
    assert whole_blocks(blocks, 4, _snap(4))[0] == 1
