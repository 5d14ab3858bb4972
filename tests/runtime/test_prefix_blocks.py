"""runtime/prefix_cache.py without a model: KV prefixes in blocks of BLOCK_ROWS rows keyed by chained hashes of the
rows' identities, stored once whoever writes them, held (reference-counted) by the requests that use them, evicted
leaves first and least recently used first within one byte budget that counts the index too."""

from __future__ import annotations

import numpy as np

from coverpruner.runtime.prefix_cache import (BLOCK_OVERHEAD, BLOCK_ROWS, BlockChain, PrefixCache, join_blocks,
                                             row_identity, token_identity)

LAYERS, HEADS, HD = 2, 2, 4


def _ident(tokens) -> np.ndarray:
    """Text rows' identities at positions 0.. (one position axis)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    return row_identity(tokens, np.arange(len(tokens)), np.arange(len(tokens))[None], {})


class _Slot:
    """A request's KV rows as a slot holds them: row r of layer l holds the value 1000 * tag + 10 * r + l (keys)
    and its negative (values); ``asked`` records the rows read."""

    def __init__(self, tag: int, rows: int):
        r = np.arange(rows, dtype=np.float32)[None, None, :, None]
        self.keys = [np.broadcast_to(1000 * tag + 10 * r + layer, (1, HEADS, rows, HD)).copy() for layer in range(LAYERS)]
        self.asked = []

    def read(self, start, stop):
        self.asked.append((start, stop))
        return tuple(k[:, :, start:stop] for k in self.keys), tuple(-k[:, :, start:stop] for k in self.keys)


def _found(cache: PrefixCache, tokens, max_rows: int) -> int:
    """How many blocks a lookup finds (released again)."""
    blocks = cache.match(BlockChain(_ident(tokens)), max_rows)
    cache.release(blocks)
    return len(blocks)


def test_blocks_restore_the_longest_full_block_prefix():
    tokens = list(range(7, 47))  # 40 rows: two full blocks and a part
    chain, slot, held = BlockChain(_ident(tokens)), _Slot(1, 40), []
    assert chain.rows == 40 and len(chain.keys) == 2
    cache = PrefixCache(1 << 20)
    cache.insert(chain, 40, slot.read, held)
    assert slot.asked == [(0, 2 * BLOCK_ROWS)] and [b.refs for b in held] == [1, 1]
    found = cache.match(BlockChain(_ident(tokens)), 39)
    assert found == held and [b.refs for b in held] == [2, 2]  # the lookup holds them too
    snap = join_blocks(found)
    np.testing.assert_array_equal(snap.keys[1], slot.keys[1][:, :, :32])
    np.testing.assert_array_equal(snap.values[0], -slot.keys[0][:, :, :32])
    cache.release(found)
    assert _found(cache, tokens, 31) == 1  # at most max_rows rows (the last row is always prefilled)
    other = list(tokens)
    other[20] = 3  # block 1 differs
    assert _found(cache, other, 39) == 1
    other[3] = 3
    assert _found(cache, other, 39) == 0
    assert [b.refs for b in held] == [1, 1]
    # a chain grows with the answer's tokens: block keys appear as blocks fill
    grown = BlockChain(_ident(tokens))
    grown.extend(token_identity(list(range(8)), np.arange(40, 48)[:, None]))
    assert len(grown.keys) == 3 and grown.keys[:2] == chain.keys


def test_a_shared_prefix_is_stored_once():
    """Two requests agreeing on 32 rows (a system prompt and an image, say): the second stores only its own block,
    reads only its rows from its slot, and both hold the shared blocks."""
    first, second = list(range(100, 148)), list(range(100, 132)) + list(range(500, 516))
    cache = PrefixCache(1 << 20)
    held_a, held_b = [], []
    cache.insert(BlockChain(_ident(first)), 48, _Slot(1, 48).read, held_a)
    slot_b = _Slot(2, 48)
    cache.insert(BlockChain(_ident(second)), 48, slot_b.read, held_b)
    assert len(cache.kv.items) == 4 and held_b[:2] == held_a[:2] and held_b[2] is not held_a[2]
    assert slot_b.asked == [(0, 48)]  # one read; the shared rows' copies are not kept
    assert [b.refs for b in held_a] == [2, 2, 1] and held_b[2].refs == 1
    assert float(held_b[2].keys[0][0, 0, 0, 0]) == 2000 + 10 * 32  # its own rows
    assert float(held_b[0].keys[0][0, 0, 0, 0]) == 1000  # the shared block is the first writer's
    # a request that matched a prefix inserts only what follows it
    more = BlockChain(_ident(second + list(range(900, 916))))
    held_c = cache.match(more, 63)
    slot_c = _Slot(3, 64)
    cache.insert(more, 64, slot_c.read, held_c)
    assert slot_c.asked == [(48, 64)] and len(held_c) == 4 and len(cache.kv.items) == 5


def test_eviction_takes_unheld_leaves_least_recent_first_within_one_budget():
    probe = PrefixCache(1 << 20)
    held = []
    probe.insert(BlockChain(_ident(range(16))), 16, _Slot(0, 16).read, held)
    one = held[0].nbytes
    assert one == 2 * LAYERS * HEADS * BLOCK_ROWS * HD * 4 + BLOCK_ROWS * 3 * 8 + BLOCK_OVERHEAD  # the index counts
    cache = PrefixCache(3 * one)
    held_a, held_b = [], []
    a, b = list(range(32)), list(range(1000, 1032))
    cache.insert(BlockChain(_ident(a)), 32, _Slot(1, 32).read, held_a)
    cache.insert(BlockChain(_ident(b)), 32, _Slot(2, 32).read, held_b)
    assert len(cache.kv.items) == 4 and cache.nbytes == 4 * one  # held blocks are never evicted: over until released
    cache.release(held_a)  # a's blocks may go now: its leaf first
    assert cache.nbytes <= cache.max_bytes and _found(cache, a, 31) == 1
    cache.release(held_b)
    cache.put_vision(b"v", {"x": np.zeros(one // 4, np.float32)})  # the least recent unheld leaf makes way
    assert cache.nbytes <= cache.max_bytes and cache.get_vision(b"v") is not None
    assert _found(cache, b, 31) == 1  # b's leaf went (a's block was just touched)
    small, off = PrefixCache(100), PrefixCache(0)
    small.insert(BlockChain(_ident(a)), 32, _Slot(1, 32).read, [])
    off.insert(BlockChain(_ident(a)), 32, _Slot(1, 32).read, [])
    assert small.nbytes == 0 and not off.enabled and off.nbytes == 0
    cache.clear()
    assert cache.nbytes == 0
