"""Prefix reuse across requests: a byte-bounded LRU of pruned-prefix KV snapshots, vision outputs and selections.

Why it is exact. The decoder KV of the first P rows of a pruned sequence is a function of those rows' inputs and
positions only (causal attention). A row's *identity* (`row_identity`) is what determines its input and position:
a text row's token id, an image row's (image hash, row index in its span), and its positions [R]. Two requests
whose identities agree on the first P rows therefore have the same KV there, and restoring a snapshot of it
(engines.interfaces.KVSnapshot, a bit-identical copy of what a prefill wrote) is the same as computing it again.
The last row is always prefilled (its logits start the answer), so at most L' - 1 rows are restored.

With demand="turn" an image's selection reads only the rows up to the end of its own message (layer 0 is
causal), so it is cached too, keyed by that native prefix and the selection options: a later turn neither
re-runs an earlier image's probe nor its selection. Vision outputs are cached by a hash of the vision graph's
feeds (the preprocessed pixels), so an image seen before skips the vision graph.

Everything lives in one LRU accounted in bytes (`max_bytes`; 0 disables the cache): inserting past the budget
evicts the least recently used entries; an entry larger than the budget is not stored.
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


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Rows on which two identity arrays [*, C] agree from the start."""
    m = min(len(a), len(b))
    same = np.all(a[:m] == b[:m], axis=1)
    return m if same.all() else int(np.argmin(same))


def truncate(snap: KVSnapshot, length: int) -> KVSnapshot:
    """The first ``length`` rows of a snapshot (copies: the restore wants contiguous [1, H_kv, P, hd])."""
    if length == snap.length:
        return snap
    cut = lambda arrays: tuple(np.ascontiguousarray(a[:, :, :length]) for a in arrays)  # noqa: E731
    return KVSnapshot(length, cut(snap.keys), cut(snap.values))


class PrefixCache:
    """The LRU (see the module docstring). Keys: ("kv", n) -> (identity [P, C], KVSnapshot);
    ("vision", digest) -> vision outputs {name: array}; ("select", digest) -> (keep, relevance)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max(0, int(max_bytes))
        self._items: OrderedDict = OrderedDict()
        self._sizes: dict = {}
        self.nbytes = 0
        self._next = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def clear(self) -> None:
        self._items.clear()
        self._sizes.clear()
        self.nbytes = 0

    def _put(self, key, value, size: int) -> None:
        if not self.enabled or size > self.max_bytes:
            return
        if key in self._items:
            self.nbytes -= self._sizes.pop(key)
            del self._items[key]
        self._items[key] = value
        self._sizes[key] = size
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            old, _ = self._items.popitem(last=False)
            self.nbytes -= self._sizes.pop(old)

    def _get(self, key):
        if key not in self._items:
            return None
        self._items.move_to_end(key)
        return self._items[key]

    # -- vision outputs and selections ------------------------------------------------------------
    def get_vision(self, digest: bytes):
        return self._get(("vision", digest))

    def put_vision(self, digest: bytes, outputs: dict) -> None:
        self._put(("vision", digest), outputs, sum(a.nbytes for a in outputs.values()))

    def get_selection(self, digest: bytes):
        return self._get(("select", digest))

    def put_selection(self, digest: bytes, keep: np.ndarray, relevance) -> None:
        size = keep.nbytes + (0 if relevance is None else relevance.nbytes)
        self._put(("select", digest), (keep, relevance), size)

    # -- KV prefixes ------------------------------------------------------------------------------
    def lookup(self, ident: np.ndarray) -> tuple[int, KVSnapshot | None]:
        """The longest cached prefix of ``ident`` [L', C], at most L' - 1 rows: (P, snapshot of P rows) or
        (0, None)."""
        best, best_key = 0, None
        for key, value in self._items.items():
            if key[0] == "kv":
                p = min(common_prefix(value[0], ident), len(ident) - 1, value[1].length)
                if p > best:
                    best, best_key = p, key
        if best_key is None:
            return 0, None
        self._items.move_to_end(best_key)
        return best, truncate(self._items[best_key][1], best)

    def insert(self, ident: np.ndarray, snap: KVSnapshot) -> None:
        """Store a snapshot of the rows ``ident`` [P, C] describes; entries it extends are dropped."""
        if not self.enabled or snap.length == 0:
            return
        ident = ident[:snap.length]
        for key in [k for k, v in self._items.items() if k[0] == "kv" and len(v[0]) <= len(ident)
                    and common_prefix(v[0], ident) == len(v[0])]:
            self.nbytes -= self._sizes.pop(key)
            del self._items[key]
        self._next += 1
        self._put(("kv", self._next), (ident, snap), snap.nbytes + ident.nbytes)
