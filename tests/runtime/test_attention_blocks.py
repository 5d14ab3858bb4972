"""Contract v5's blocks in the runtime (runtime/attention_blocks.py): one id per native row, unique over a
conversation; per request the row ranges one decoder call must hold together, and where a call may end so that it
cuts none (the prefix cache's restore, the scheduler's chunks and the staging calls use these)."""

from __future__ import annotations

import numpy as np

from coverpruner.families.contract import ImageSpan
from coverpruner.runtime.attention_blocks import call_end, native_blocks, splits, whole_ranges
from coverpruner.runtime.prefix_cache import BLOCK_ROWS, BlockChain, PrefixCache, row_identity


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


def test_whole_ranges_of_blocks_of_two_or_more_rows():
    blocks = np.array([-1, -1, 0, 0, 0, -1, 1, 1, -1, 2, -1, 3, 3])  # block 2 kept one row: causal, no range
    assert whole_ranges(blocks) == ((2, 5), (6, 8), (11, 13))
    assert whole_ranges(np.array([-1, 0, 1, 0, 1, -1])) == ((1, 5),)  # interleaved blocks: one merged range
    assert whole_ranges(None) == () and whole_ranges(np.full(4, -1)) == ()


def test_splits_and_call_end():
    whole = ((2, 5), (6, 8))
    assert [c for c in range(10) if splits(whole, c)] == [3, 4, 7]
    # a call whose last row then runs alone (a chunk's, in the decode call) must not end at a range's row either
    assert [c for c in range(10) if splits(whole, c, alone_last=True)] == [3, 4, 5, 7, 8]
    assert call_end(whole, 0, 4) == 2  # back to the range's start
    assert call_end(whole, 2, 4) == 5  # nothing before it after the start: the range whole, past the stop
    assert call_end(whole, 5, 7) == 6 and call_end(whole, 6, 7) == 8
    assert call_end(whole, 0, 5, alone_last=True) == 2 and call_end(whole, 2, 3, alone_last=True) == 6
    assert call_end(((2, 5), (5, 8)), 2, 3, alone_last=True) == 9  # adjacent blocks: past both
    assert call_end((), 3, 4, alone_last=True) == 4


def test_prefix_match_is_cut_back_to_a_cut_that_splits_no_range():
    tokens = np.arange(100, 164, dtype=np.int64)  # 64 rows: 4 cache blocks
    ident = row_identity(tokens, np.arange(64), np.arange(64)[None], {})
    cache = PrefixCache(1 << 20)
    keys = (np.zeros((1, 1, 64, 16), np.float32),)
    held = []
    cache.insert(BlockChain(ident), 64, lambda a, b: (tuple(k[:, :, a:b] for k in keys),
                                                      tuple(k[:, :, a:b] for k in keys)), held)
    for whole, rows in [((), 48), (((40, 50),), 32), (((10, 50),), 0), (((16, 32),), 48), (((20, 30), (40, 60)), 32)]:
        found = cache.match(BlockChain(ident), 63, whole)
        assert len(found) * BLOCK_ROWS == rows, whole
        cache.release(found)


def test_a_prompt_ending_inside_a_block_is_refused_in_one_line():
    """The last prompt row's logits come from a call of its own (the decode call): it cannot be a range's row."""
    from types import SimpleNamespace

    import pytest

    from coverpruner.engine_dir import ATTENTION_BLOCKS
    from coverpruner.runtime.errors import PromptError
    from coverpruner.runtime.inputs import InputProcessor

    native = SimpleNamespace(extras={ATTENTION_BLOCKS: np.array([-1, 0, 0, -1, 1, 1])})
    assert InputProcessor.whole_ranges(None, native, np.arange(4)) == ((1, 3),)  # uses no state of the processor
    assert InputProcessor.whole_ranges(None, native, np.array([0, 1, 3, 5])) == ()  # one kept row a block: causal
    with pytest.raises(PromptError, match=r"^the prompt ends inside an image block \(its rows 3\.\.4 .*text") as err:
        InputProcessor.whole_ranges(None, native, np.array([0, 1, 2, 4, 5]))
    assert "\n" not in str(err.value)
