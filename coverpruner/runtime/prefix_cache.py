"""Prefix reuse across requests: pruned-prefix KV snapshots, vision outputs and selections in three typed stores
that share one byte budget (least recently used evicted first).

Why it is exact. The decoder KV of the first P rows of a pruned sequence is a function of those rows' inputs and
positions only (causal attention). A row's *identity* (`row_identity`) is what determines its input and position:
a text row's token id, an image row's (image hash, row index in its span), and its positions [R]. Two requests
whose identities agree on the first P rows therefore have the same KV there, and restoring a snapshot of it
(engines.interfaces.KVSnapshot, a bit-identical copy of what a prefill wrote) is the same as computing it again.
The last row is always prefilled (its logits start the answer), so at most L' - 1 rows are restored.

How a prefix is found (vLLM's block hashing, with blocks of one row). Row i's key is a chained hash
h_i = blake2b(h_{i-1} || identity row i), so h_i names the whole prefix 0..i. An inserted snapshot registers the
key of every row it holds; a lookup walks the request's own chain while the keys are known (one dict lookup per
row, no scan of the entries) and restores the longest. vLLM hashes blocks of 16 tokens because its KV lives in
16-token pages; here a snapshot is a plain copy, so one-row blocks cost only an index entry (~100 bytes a row, not
counted: a row's KV is layers x 2 x H_kv x hd floats, 64 KiB at LLaVA-1.5-7B widths with 2 layers) and find the
same longest prefix a row-by-row comparison would.

A decoder with state that is not KV (contract v5: a hybrid decoder's Gated DeltaNet layers) cannot be cut back: its
snapshots (KVSnapshot.states) are taken at turn boundaries (runtime/state_boundaries.py) and restored only whole, at
exactly the row they were taken at; a longer match falls back to the longest such boundary below it, and such an
entry is kept beside longer ones that extend it (each is a boundary a later request may end at).

With demand="turn" an image's selection reads only the rows up to the end of its own message (layer 0 is
causal), so it is cached too, keyed by that native prefix and the selection options: a later turn neither
re-runs an earlier image's probe nor its selection. Vision outputs are cached by a hash of the vision graph's
feeds (the preprocessed pixels), so an image seen before skips the vision graph.

`max_bytes` bounds the three stores together (0 disables the cache); an entry larger than it is not stored.
Not thread-safe: one Pipeline (one engine loop thread) owns one cache.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from coverpruner.engines.interfaces import KVSnapshot

TEXT_ROW = -1  # the first identity column of a text row (an image row holds its image's 63-bit hash there)


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


def chain_hashes(ident: np.ndarray) -> list[bytes]:
    """The chained key of every row of ``ident`` int64 [P, C]: key i names rows 0..i (16-byte blake2b)."""
    ident = np.ascontiguousarray(ident, dtype=np.int64)
    keys, prev = [], b""
    for row in ident:
        prev = hashlib.blake2b(prev + row.tobytes(), digest_size=16).digest()
        keys.append(prev)
    return keys


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Rows on which two identity arrays [*, C] agree from the start."""
    m = min(len(a), len(b))
    same = np.all(a[:m] == b[:m], axis=1)
    return m if same.all() else int(np.argmin(same))


def truncate(snap: KVSnapshot, length: int) -> KVSnapshot:
    """The first ``length`` rows of a snapshot (copies: the restore wants contiguous [1, H_kv, P, hd]).
    ValueError for a snapshot with decoder states (contract v5), which holds the state of its whole length only."""
    if length == snap.length:
        return snap
    if snap.states:
        raise ValueError(f"a snapshot with decoder states holds {snap.length} rows and cannot be cut to {length}")
    cut = lambda arrays: tuple(np.ascontiguousarray(a[:, :, :length]) for a in arrays)  # noqa: E731
    return KVSnapshot(length, cut(snap.keys), cut(snap.values))


class _Budget:
    """The byte budget the stores share: (store, key) in least-recently-used order with their sizes."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max(0, int(max_bytes))
        self.order: OrderedDict = OrderedDict()
        self.nbytes = 0

    def touch(self, store, key) -> None:
        self.order.move_to_end((id(store), key))

    def add(self, store, key, size: int) -> None:
        """Account a new entry, then evict least recently used ones (from any store) until under budget."""
        self.order[(id(store), key)] = (store, key, size)
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            _, (victim, vkey, _) = next(iter(self.order.items()))
            victim.remove(vkey)

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


class KVStore(_Store):
    """entry id -> (identity int64 [P, C], KVSnapshot of P rows, chain keys [P]); ``index``: chain key -> the ids
    of the entries that hold that prefix; ``ends``: an entry's last chain key -> its id."""

    def __init__(self, budget: _Budget):
        super().__init__(budget)
        self.index: dict[bytes, set[int]] = {}
        self.ends: dict[bytes, int] = {}  # an entry's last chain key -> its id (finds the entries ours extends)
        self._next = 0

    def remove(self, key) -> None:
        del self.ends[self.items[key][2][-1]]
        for h in self.items[key][2]:
            ids = self.index[h]
            ids.discard(key)
            if not ids:
                del self.index[h]
        super().remove(key)

    def lookup(self, ident: np.ndarray) -> tuple[int, KVSnapshot | None]:
        """The longest stored prefix of ``ident`` [L', C], at most L' - 1 rows: (P, snapshot of P rows) or
        (0, None). Walks the chain of ``ident``'s rows while the index knows it. Entries with decoder states are
        restored only whole: the longest one that ends at a matched row."""
        best, ids, boundary = 0, None, None
        for i, h in enumerate(chain_hashes(ident[:len(ident) - 1])):
            found = self.index.get(h)
            if found is None:
                break
            best, ids = i + 1, found
            if h in self.ends and self.items[self.ends[h]][1].states:
                boundary = (i + 1, self.ends[h])  # an entry with states that ends here
        if ids is None:
            return 0, None
        key = max(ids)  # the newest entry holding the prefix
        if self.items[key][1].states:  # a state cannot be cut back: only an exact boundary restores
            if boundary is None:
                return 0, None
            best, key = boundary
        stored, snap, _ = self.get(key)
        if not np.array_equal(stored[:best], ident[:best]):  # a 128-bit collision: never restore a wrong prefix
            return 0, None
        return best, truncate(snap, best)

    def insert(self, ident: np.ndarray, snap: KVSnapshot) -> None:
        """Store a snapshot of the rows ``ident`` [P, C] describes; entries it extends are dropped."""
        if self.budget.max_bytes == 0 or snap.length == 0:
            return
        ident = np.ascontiguousarray(ident[:snap.length])
        keys = chain_hashes(ident)
        for h in keys:  # an entry that ends at one of our rows is a prefix of ours: ours replaces it (KV rows can be
            old = self.ends.get(h)  # cut back; with decoder states only the one ending where ours ends is replaced)
            if old is not None and (not snap.states or h == keys[-1]):
                self.remove(old)
        self._next += 1
        size = snap.nbytes + ident.nbytes
        if size > self.budget.max_bytes:
            return
        self.items[self._next] = (ident, snap, keys)
        self.ends[keys[-1]] = self._next
        for h in keys:
            self.index.setdefault(h, set()).add(self._next)
        self.budget.add(self, self._next, size)


class PrefixCache:
    """The three stores (see the module docstring): ``kv`` (KVStore), ``vision`` (VisionStore), ``selections``
    (SelectionStore), all within ``max_bytes``."""

    def __init__(self, max_bytes: int):
        self._budget = _Budget(max_bytes)
        self.kv, self.vision, self.selections = KVStore(self._budget), VisionStore(self._budget), \
            SelectionStore(self._budget)

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
        for store in (self.kv, self.vision, self.selections):
            for key in list(store.items):
                store.remove(key)

    # -- the stores' operations under the names Pipeline uses ------------------------------------
    def get_vision(self, digest: bytes):
        return self.vision.get(digest)

    def put_vision(self, digest: bytes, outputs: dict) -> None:
        self.vision.put_outputs(digest, outputs)

    def get_selection(self, digest: bytes):
        return self.selections.get(digest)

    def put_selection(self, digest: bytes, keep: np.ndarray, relevance) -> None:
        self.selections.put_selection(digest, keep, relevance)

    def lookup(self, ident: np.ndarray) -> tuple[int, KVSnapshot | None]:
        """KVStore.lookup: the longest cached prefix of ``ident`` [L', C], at most L' - 1 rows."""
        return self.kv.lookup(ident)

    def insert(self, ident: np.ndarray, snap: KVSnapshot) -> None:
        """KVStore.insert: store a snapshot of the rows ``ident`` [P, C] describes."""
        self.kv.insert(ident, snap)
