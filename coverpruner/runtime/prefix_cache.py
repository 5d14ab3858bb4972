"""Prefix reuse across requests: pruned-prefix KV in fixed-size row blocks, vision outputs and selections, in three
typed stores that share one byte budget (least recently used evicted first).

Why it is exact. The decoder KV of the first P rows of a pruned sequence is a function of those rows' inputs and
positions only (causal attention). A row's *identity* (`row_identity`) is what determines its input and position:
a text row's token id, an image row's (image hash, row index in its span), and its positions [R]. Two requests
whose identities agree on the first P rows therefore have the same KV there, and restoring a copy of it (a
bit-identical copy of what a prefill wrote) is the same as computing it again. The last prompt row is always
prefilled (its logits start the answer), so at most L' - 1 rows are restored. With contract v5's bidirectional
blocks a row's KV also depends on its block's later rows: a prefix is restored only up to a cut that splits no block
(``match``'s whole ranges), so every restored block is whole, and all of its rows are in the matched identities.

Blocks (vLLM's block hashing). A request's rows are cut into blocks of BLOCK_ROWS rows; block k's key chains the
previous one's, h_k = blake2b(h_{k-1} || identity rows of block k), so h_k names the whole prefix up to the block's
end, and a request keeps its chain (``BlockChain``) as it grows: the prompt's rows, then each answer token fed back.
A block is stored once, whoever wrote it: two concurrent conversations with the same system prompt and image share
the blocks of that prefix, which the first inserts as soon as its prefill is done (runtime/engine.py), before it
finishes. A lookup (``match``) walks the request's own chain while the keys are known (one dict lookup per block)
and checks the stored identity rows against the request's (a 128-bit collision never restores a wrong prefix).
Blocks are reference-counted: a request holds the blocks it matched or inserted until it ends (``release``), and
only a block no request holds and no stored block extends (a leaf) is evicted. The KV rows live in the decoder's
slots while a request runs; a block is their host copy (engines.interfaces.KVSnapshot arrays, [1, H_kv, B, hd]
per layer and kind), written back into a slot on restore.

With demand="turn" an image's selection reads only the rows up to the end of its own message (layer 0 is
causal), so it is cached too, keyed by that native prefix and the selection options: a later turn neither
re-runs an earlier image's probe nor its selection. Vision outputs are cached by a hash of the vision graph's
feeds (the preprocessed pixels), so an image seen before skips the vision graph.

A decoder with state that is not KV (contract v5: a hybrid decoder's Gated DeltaNet layers carry a conv and a
recurrent state per layer) cannot be cut back to a block's end: its state holds the effect of every row so far, and
KV blocks without the state at the same row are useless. For it the cache keeps no blocks but whole snapshots
(``Boundary``: the KV rows and the states after them) at turn boundaries only, the rows before the chat template's
generation prompt (Prepared.turn_end), which a later turn of the conversation renders the same way; a lookup
(``match_boundary``) restores the longest stored boundary that the request's rows reach exactly (a partial match
falls back to the longest boundary below it), never a row in between. Boundaries count in the same budget.

`max_bytes` bounds the four stores together, index included (a block counts its KV, its identity rows and
BLOCK_OVERHEAD bytes of index; 0 disables the cache); an entry larger than it is not stored. Thread-safe: the
admission worker (vision, selections) and the engine loop (KV blocks) share one cache under one lock.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from coverpruner.engines.interfaces import KVSnapshot
from coverpruner.runtime.attention_blocks import splits

TEXT_ROW = -1  # the first identity column of a text row (an image row holds its image's 63-bit hash there)
#: rows per KV block (vLLM's default page): a finer block finds longer prefixes, a coarser one keeps fewer entries
BLOCK_ROWS = 16
#: bytes one block's index costs beside its arrays (its dict slot, key, Block object, tuples), counted in the budget
BLOCK_OVERHEAD = 512


def feeds_hash(feeds: dict[str, np.ndarray]) -> bytes:
    """sha256 over the vision feeds (names, dtypes, shapes, bytes): the identity of a preprocessed image."""
    h = hashlib.sha256()
    for name in sorted(feeds):
        a = np.ascontiguousarray(feeds[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.data)
    return h.digest()


def hash63(digest: bytes) -> int:
    """A non-negative int64 from a digest (an image row's identity column)."""
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def row_identity(input_ids: np.ndarray, rows: np.ndarray, positions: np.ndarray, image_rows: dict) -> np.ndarray:
    """int64 [L', 2 + R]: per kept sequence row (``rows`` int64 [L'] ascending native indices) its identity
    (TEXT_ROW, token id) or (image hash63, row in its span), then its positions (``positions`` int64 [R, L']).
    image_rows: native index -> (hash63, row in span) for every image row."""
    ident = np.empty((len(rows), 2 + positions.shape[0]), dtype=np.int64)
    ident[:, 0] = TEXT_ROW
    ident[:, 1] = input_ids[rows]
    for k, r in enumerate(rows.tolist()):
        if r in image_rows:
            ident[k, :2] = image_rows[r]
    ident[:, 2:] = positions.T
    return ident


def token_identity(tokens, positions: np.ndarray) -> np.ndarray:
    """int64 [k, 2 + R]: the identities of k answer tokens fed back (TEXT_ROW, id) at positions int64 [k, R]."""
    ident = np.empty((len(tokens), 2 + positions.shape[1]), dtype=np.int64)
    ident[:, 0] = TEXT_ROW
    ident[:, 1] = tokens
    ident[:, 2:] = positions
    return ident


class BlockChain:
    """The chained block keys of one request's rows, kept as it grows: ``extend`` appends rows' identities (int64
    [k, C]: the prompt's, then each answer token fed back), and every block of BLOCK_ROWS rows that fills gets its
    key h_k = blake2b(h_{k-1} || its identity rows) (16 bytes)."""

    def __init__(self, ident: np.ndarray | None = None):
        self._parts: list[np.ndarray] = []
        self._ident: np.ndarray | None = None  # the rows so far, int64 [rows, C] (joined lazily)
        self.rows = 0
        self.keys: list[bytes] = []
        if ident is not None:
            self.extend(ident)

    @property
    def ident(self) -> np.ndarray:
        """int64 [rows, C]: every row's identity so far."""
        if self._parts:
            self._ident = np.concatenate(([self._ident] if self._ident is not None else []) + self._parts)
            self._parts = []
        return self._ident

    def extend(self, ident: np.ndarray) -> None:
        ident = np.ascontiguousarray(ident, dtype=np.int64)
        self._parts.append(ident)
        self.rows += len(ident)
        full = self.rows // BLOCK_ROWS
        if full > len(self.keys):
            rows = self.ident
            prev = self.keys[-1] if self.keys else b""
            for k in range(len(self.keys), full):
                prev = hashlib.blake2b(prev + rows[k * BLOCK_ROWS:(k + 1) * BLOCK_ROWS].tobytes(),
                                       digest_size=16).digest()
                self.keys.append(prev)

    def copy(self) -> "BlockChain":
        """An independent chain with the same rows (a forked answer's, which then grows with its own tokens)."""
        out = BlockChain()
        out._ident, out.rows, out.keys = self.ident, self.rows, list(self.keys)
        return out

    def block(self, k: int) -> np.ndarray:
        """int64 [BLOCK_ROWS, C]: the identity rows of block k."""
        return self.ident[k * BLOCK_ROWS:(k + 1) * BLOCK_ROWS]


@dataclass(eq=False)
class Block:
    """One stored block: ``key`` (its chain key), ``parent`` (the block before it, None for the first), ``ident``
    int64 [BLOCK_ROWS, C], per layer ``keys`` / ``values`` [1, H_kv, BLOCK_ROWS, hd] (the cache's float dtype);
    ``refs``: requests holding it; ``children``: stored blocks that extend it."""

    key: bytes
    parent: "Block | None"
    ident: np.ndarray
    keys: tuple
    values: tuple
    refs: int = 0
    children: int = 0

    @property
    def nbytes(self) -> int:
        return (sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values) + self.ident.nbytes
                + BLOCK_OVERHEAD)


def join_blocks(blocks: list[Block]) -> KVSnapshot:
    """The prefix the blocks hold, as one KVSnapshot (per layer [1, H_kv, len(blocks) * BLOCK_ROWS, hd])."""
    layers = range(len(blocks[0].keys))
    cat = lambda kind: tuple(np.concatenate([getattr(b, kind)[i] for b in blocks], axis=2)  # noqa: E731
                             for i in layers)
    return KVSnapshot(len(blocks) * BLOCK_ROWS, cat("keys"), cat("values"))


class _Budget:
    """The byte budget the stores share: (store, key) in least-recently-used order with their sizes."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max(0, int(max_bytes))
        self.order: OrderedDict = OrderedDict()
        self.nbytes = 0

    def touch(self, store, key) -> None:
        self.order.move_to_end((id(store), key))

    def add(self, store, key, size: int) -> None:
        """Account a new entry, then trim."""
        self.order[(id(store), key)] = (store, key, size)
        self.nbytes += size
        self.trim()

    def trim(self) -> None:
        """Evict least recently used entries (from any store) that their store lets go, until under budget."""
        while self.nbytes > self.max_bytes:
            victim = next(((s, k) for s, k, _ in self.order.values() if s.evictable(k)), None)
            if victim is None:  # everything left is held by running requests: trimmed again when they end
                return
            victim[0].remove(victim[1])

    def drop(self, store, key) -> None:
        _, _, size = self.order.pop((id(store), key))
        self.nbytes -= size


class _Store:
    """A typed store: key -> value, sized in the shared budget."""

    def __init__(self, budget: _Budget):
        self.budget, self.items = budget, {}

    def get(self, key):
        value = self.items.get(key)
        if value is not None:
            self.budget.touch(self, key)
        return value

    def put(self, key, value, size: int) -> None:
        if self.budget.max_bytes == 0 or size > self.budget.max_bytes:
            return
        if key in self.items:
            self.remove(key)
        self.items[key] = value
        self.budget.add(self, key, size)

    def evictable(self, key) -> bool:
        return True

    def remove(self, key) -> None:
        del self.items[key]
        self.budget.drop(self, key)


class VisionStore(_Store):
    """feeds_hash digest -> the vision graph's outputs {name: array}."""

    def put_outputs(self, digest: bytes, outputs: dict) -> None:
        self.put(digest, outputs, sum(a.nbytes for a in outputs.values()))


class SelectionStore(_Store):
    """selection key digest -> (keep int64 [m], relevance float32 [n] or None)."""

    def put_selection(self, digest: bytes, keep: np.ndarray, relevance) -> None:
        self.put(digest, (keep, relevance), keep.nbytes + (0 if relevance is None else relevance.nbytes))


class KVBlocks(_Store):
    """chain key -> Block (see the module docstring)."""

    def evictable(self, key) -> bool:
        block = self.items[key]
        return block.refs == 0 and block.children == 0

    def remove(self, key) -> None:
        block = self.items[key]
        if block.parent is not None:
            block.parent.children -= 1
        super().remove(key)

    def match(self, chain: BlockChain, max_rows: int, whole=()) -> list[Block]:
        """The stored blocks that begin ``chain``, at most max_rows // BLOCK_ROWS of them, in order (touched), cut
        back to the last one whose end splits none of the ``whole`` ranges [a, b) (rows one decoder call holds
        together: contract v5's bidirectional blocks, runtime/attention_blocks.py)."""
        found = []
        for k, key in enumerate(chain.keys[:max(0, max_rows) // BLOCK_ROWS]):
            block = self.items.get(key)
            if block is None or not np.array_equal(block.ident, chain.block(k)):
                break
            found.append(block)
        while found and splits(whole, len(found) * BLOCK_ROWS):
            found.pop()
        for block in found:
            self.budget.touch(self, block.key)
        return found

    def insert(self, chain: BlockChain, rows: int, read, held: list[Block]) -> None:
        """Store the blocks of ``chain`` within its first ``rows`` rows that are not stored yet. read(start, stop)
        -> (keys, values): per layer [1, H_kv, stop-start, hd] host copies of those rows of the request's slot,
        read once for all the new blocks. held: the blocks the request holds (matched or inserted before), in
        chain order: the new ones are appended (and held)."""
        if self.budget.max_bytes == 0:
            return
        count = min(rows, chain.rows) // BLOCK_ROWS
        first = len(held)
        if count <= first:
            return
        if any(held[k].key != chain.keys[k] for k in range(first)):
            raise ValueError("held blocks do not begin the request's chain")
        keys, values = read(first * BLOCK_ROWS, count * BLOCK_ROWS)
        parent = held[-1] if held else None
        for k in range(first, count):
            block = self.items.get(chain.keys[k])
            if block is None or not np.array_equal(block.ident, chain.block(k)):
                cut = slice((k - first) * BLOCK_ROWS, (k - first + 1) * BLOCK_ROWS)
                block = Block(chain.keys[k], parent, chain.block(k).copy(),
                              tuple(np.ascontiguousarray(a[:, :, cut]) for a in keys),
                              tuple(np.ascontiguousarray(a[:, :, cut]) for a in values))
                if block.nbytes > self.budget.max_bytes:
                    return
                if chain.keys[k] in self.items:  # a collision's older block makes way
                    if not self.evictable(chain.keys[k]):
                        return
                    self.remove(chain.keys[k])
                if parent is not None:
                    parent.children += 1
                block.refs = 1  # held before it is accounted: the trim below must not evict it
                self.items[block.key] = block
                self.budget.add(self, block.key, block.nbytes)
            else:
                block.refs += 1
                self.budget.touch(self, block.key)
            held.append(block)
            parent = block


def boundary_key(chain: BlockChain, rows: int) -> bytes:
    """The key of the chain's first ``rows`` rows (rows <= chain.rows): its last full block's key, then the rows
    after that block and the row count (a Boundary ends anywhere, not only at a block's end)."""
    full = rows // BLOCK_ROWS
    prev = chain.keys[full - 1] if full else b""
    tail = chain.ident[full * BLOCK_ROWS:rows]
    return hashlib.blake2b(prev + tail.tobytes() + rows.to_bytes(8, "little"), digest_size=16,
                           person=b"turn-boundary").digest()


@dataclass(eq=False)
class Boundary:
    """A decoder-with-states snapshot at a turn boundary: ``ident`` int64 [P, C], the identities of the rows it holds,
    and ``snap``: the KVSnapshot of those P rows with the decoder states after them (restored whole)."""

    ident: np.ndarray
    snap: KVSnapshot

    @property
    def nbytes(self) -> int:
        return self.snap.nbytes + self.ident.nbytes + BLOCK_OVERHEAD


class BoundaryStore(_Store):
    """boundary_key -> Boundary, and how many are stored per length (the lengths a lookup tries, longest first)."""

    def __init__(self, budget: _Budget):
        super().__init__(budget)
        self.lengths: dict[int, int] = {}

    def put_boundary(self, chain: BlockChain, rows: int, snap: KVSnapshot) -> None:
        if not 0 < rows <= chain.rows or snap.length != rows:
            raise ValueError(f"a boundary of {rows} rows needs a chain of at least as many and a snapshot of exactly "
                             f"as many (chain {chain.rows}, snapshot {snap.length})")
        key = boundary_key(chain, rows)
        if key in self.items:
            self.remove(key)
        entry = Boundary(np.ascontiguousarray(chain.ident[:rows]), snap)
        if self.budget.max_bytes == 0 or entry.nbytes > self.budget.max_bytes:
            return  # larger than the budget: not stored
        self.lengths[rows] = self.lengths.get(rows, 0) + 1  # counted first: the trim may evict it at once
        self.put(key, entry, entry.nbytes)

    def remove(self, key) -> None:
        rows = len(self.items[key].ident)
        super().remove(key)
        self.lengths[rows] -= 1
        if not self.lengths[rows]:
            del self.lengths[rows]

    def match(self, chain: BlockChain, max_rows: int) -> Boundary | None:
        """The longest stored boundary the chain's rows reach exactly, at most max_rows rows (touched), or None."""
        for rows in sorted((r for r in self.lengths if r <= min(max_rows, chain.rows)), reverse=True):
            found = self.get(boundary_key(chain, rows))
            if found is not None and np.array_equal(found.ident, chain.ident[:rows]):  # never a collision's
                return found
        return None


class PrefixCache:
    """The four stores (see the module docstring): ``kv`` (KVBlocks), ``boundaries`` (BoundaryStore, a decoder with
    states), ``vision`` (VisionStore), ``selections`` (SelectionStore), all within ``max_bytes``, behind one lock."""

    def __init__(self, max_bytes: int):
        self._budget = _Budget(max_bytes)
        self._lock = threading.RLock()
        self.kv, self.vision, self.selections = KVBlocks(self._budget), VisionStore(self._budget), \
            SelectionStore(self._budget)
        self.boundaries = BoundaryStore(self._budget)

    @property
    def max_bytes(self) -> int:
        return self._budget.max_bytes

    @property
    def nbytes(self) -> int:
        return self._budget.nbytes

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def clear(self) -> None:
        """Forget every entry (blocks held by running requests stay until they end)."""
        with self._lock:
            for store in (self.kv, self.boundaries, self.vision, self.selections):
                for key in sorted(store.items, key=lambda k: -self._depth(store, k)):  # leaves first
                    if store.evictable(key):
                        store.remove(key)

    def _depth(self, store, key) -> int:
        if store is not self.kv:
            return 0
        depth, block = 0, self.kv.items[key]
        while block.parent is not None:
            depth, block = depth + 1, block.parent
        return depth

    # -- the stores' operations under the names the stages and the engine use ---------------------
    def get_vision(self, digest: bytes):
        with self._lock:
            return self.vision.get(digest)

    def put_vision(self, digest: bytes, outputs: dict) -> None:
        with self._lock:
            self.vision.put_outputs(digest, outputs)

    def get_selection(self, digest: bytes):
        with self._lock:
            return self.selections.get(digest)

    def put_selection(self, digest: bytes, keep: np.ndarray, relevance) -> None:
        with self._lock:
            self.selections.put_selection(digest, keep, relevance)

    def match(self, chain: BlockChain, max_rows: int, whole=()) -> list[Block]:
        """KVBlocks.match: the stored blocks that begin ``chain`` (at most max_rows rows, splitting none of the
        ``whole`` ranges), held for the request from here (none is evicted while held) until it calls ``release``."""
        with self._lock:
            blocks = self.kv.match(chain, max_rows, whole)
            for block in blocks:
                block.refs += 1
            return blocks

    def hold(self, blocks: list[Block]) -> None:
        """Hold ``blocks`` once more (another request or answer uses the same prefix)."""
        with self._lock:
            for block in blocks:
                block.refs += 1

    def release(self, blocks: list[Block]) -> None:
        """A request ends: let go of its blocks (then trim the budget, which held ones may have kept over)."""
        with self._lock:
            for block in blocks:
                block.refs -= 1
            self._budget.trim()

    def insert(self, chain: BlockChain, rows: int, read, held: list[Block]) -> None:
        """KVBlocks.insert: store the not yet stored blocks of the chain's first ``rows`` rows (held from then on)."""
        with self._lock:
            self.kv.insert(chain, rows, read, held)

    def match_boundary(self, chain: BlockChain, max_rows: int) -> Boundary | None:
        """BoundaryStore.match: the longest stored turn boundary of a decoder with states that ``chain`` reaches
        exactly (at most max_rows rows), or None. The entry may be evicted later; its snapshot stays the caller's."""
        with self._lock:
            return self.boundaries.match(chain, max_rows)

    def insert_boundary(self, chain: BlockChain, rows: int, snap: KVSnapshot) -> None:
        """Store a decoder-with-states snapshot of the chain's first ``rows`` rows (KV rows and the states after
        them), taken at a turn boundary (a larger one than the budget is not stored)."""
        with self._lock:
            self.boundaries.put_boundary(chain, rows, snap)
