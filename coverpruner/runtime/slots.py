"""The decoder slots the engine loop (runtime/engine.py) runs on: one request over any DecoderLoop (``LoopSlots``),
or up to max_batch over an ORT-form BatchDecoder (``BatchSlots``). One interface:

    open(prefix, capacity, reserve, whole) -> handle   a slot for a new request, empty or holding a restored
                                        prefix (KV blocks, or a whole KVSnapshot with a decoder's states)
    prefill(items) -> {handle: logits | None}   prompt rows of some requests (a chunk each)
    decode(feeds) -> {handle: logits}   ONE decoder call, one row per fed request
    fork(handle, count) -> [handle]     the request's cache copied into new slots (n answers)
    read(handle, start, stop)           host copies of cached rows (what the prefix cache stores)
    snapshot(handle)                    host copies of all its cached rows and decoder states (contract v5)
    leave(handle)

``batched`` says how a prefill ends: LoopSlots runs a chunk in one forward and returns its last row's logits (there
is nothing to share a call with); BatchSlots leaves every chunk's last row out of the prefill call (logits None)
for the engine to feed in the step's one decode call, beside the other requests' rows, and needs every request
that holds a slot fed in that call (engines.ort_form_decoder.BatchDecoder.step).

BatchSlots can also stage (``stages``): the admission worker prefills a request's rows into a slot of its own, one
request at a time, on its thread, while the engine keeps stepping the active slots; ``join_staged`` then makes it an
active slot (runtime/admission.py, runtime/engine.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coverpruner.engine_dir import position_ids_input
from coverpruner.engines.interfaces import KVSnapshot
from coverpruner.engines.ort_form_decoder import BatchDecoder
from coverpruner.runtime.errors import OptionError
from coverpruner.runtime.prefix_cache import Block, join_blocks


@dataclass
class Rows:
    """Prompt rows of one request: embeds float [S,d], positions int64 [R,S], decoder extras {name: [S,d]} or None."""

    handle: int
    embeds: np.ndarray
    positions: np.ndarray
    extras: dict | None = None


class LoopSlots:
    """One slot over a coverpruner.engines.interfaces.DecoderLoop (the model's own decoder, any form). The cache is
    sized per request (prompt + the tokens it may generate)."""

    max_batch = 1
    batched = False
    stages = False

    def __init__(self, decoder, position_rank: int):
        self.decoder, self.rank = decoder, position_rank
        self.free = 1

    def open(self, prefix: list[Block], capacity: int, reserve: int = 0, whole: KVSnapshot | None = None) -> int:
        """Reset the cache to ``capacity`` tokens and restore the prefix blocks, or the ``whole`` snapshot (a decoder
        with states: its KV rows and states) -> handle 0 (no forks: reserve 0)."""
        self.decoder.reset(capacity)
        if whole is not None:
            self.decoder.restore(whole)
        elif prefix:
            self.decoder.restore(join_blocks(prefix))
        self.free = 0
        return 0

    def prefill(self, items: list[Rows]) -> dict[int, np.ndarray]:
        """The one request's rows in one forward, exactly as a one-shot prefill -> {0: logits [V] of its last row}."""
        (rows,) = items
        extras = {k: v[None] for k, v in rows.extras.items()} if rows.extras else None
        return {0: np.array(self.decoder.forward(rows.embeds[None], position_ids_input(rows.positions, self.rank),
                                                 extras=extras))}

    def decode(self, feeds: dict) -> dict[int, np.ndarray]:
        """{0: (embedding [d], position int64 [R])} -> {0: logits [V]} (a decode row: no decoder extras)."""
        ((handle, (emb, pos, *_)),) = feeds.items()
        pos = np.asarray(pos, dtype=np.int64).reshape(-1, 1)
        return {handle: self.decoder.forward(emb[None, None], position_ids_input(pos, self.rank))}

    def fork(self, handle: int, count: int) -> list[int]:
        raise OptionError("n > 1 needs a batch of slots", param="n")

    def read(self, handle: int, start: int, stop: int) -> tuple[tuple, tuple]:
        snap = self.decoder.snapshot()
        cut = slice(start, stop)
        return tuple(a[:, :, cut] for a in snap.keys), tuple(a[:, :, cut] for a in snap.values)

    def snapshot(self, handle: int) -> KVSnapshot:
        return self.decoder.snapshot()

    def length(self, handle: int) -> int:
        return self.decoder.length

    def leave(self, handle: int) -> None:
        """Nothing to free in the cache: the next request resets it."""
        self.free = 1


class BatchSlots:
    """Up to ``max_batch`` requests over an engines.ort_form_decoder.BatchDecoder (``capacity`` tokens per request,
    allocated once)."""

    batched = True
    stages = True

    def __init__(self, decoder: BatchDecoder):
        self.decoder, self.max_batch, self.capacity = decoder, decoder.max_batch, decoder.capacity

    @property
    def free(self) -> int:
        return self.decoder.free

    def stage(self, prefix: list[Block], whole: KVSnapshot | None = None) -> bool:
        """Reserve the staging slot and write the prefix blocks, or the ``whole`` snapshot, into it (the admission
        worker's thread); False when no slot is free or another request is staged."""
        if self.decoder.stage() is None:
            return False
        try:
            if whole is not None:
                self.decoder.stage_restore(whole)
            for block in prefix:
                self.decoder.stage_append(block.keys, block.values)
        except BaseException:
            self.decoder.unstage()
            raise
        return True

    def stage_rows(self, rows: Rows) -> None:
        """Prompt rows into the staging slot, in one call (the admission worker's thread)."""
        self.decoder.stage_extend(np.asarray(rows.embeds, np.float32), rows.positions, rows.extras)

    def stage_read(self, start: int, stop: int) -> tuple[tuple, tuple]:
        return self.decoder.stage_read(start, stop)

    def prefault_join(self) -> None:
        """The staging thread, its rows in: fault in the memory the join writes (BatchDecoder.prefault_join)."""
        self.decoder.prefault_join()

    def stage_snapshot(self) -> KVSnapshot:
        return self.decoder.stage_snapshot()

    def join_staged(self, reserve: int = 0) -> int:
        return self.decoder.join_staged(reserve)

    def unstage(self) -> None:
        self.decoder.unstage()

    def unreserve(self, count: int) -> None:
        self.decoder.unreserve(count)

    def open(self, prefix: list[Block], capacity: int, reserve: int = 0, whole: KVSnapshot | None = None) -> int:
        """A free slot with the prefix blocks written into it, block by block (no joined copy), or the ``whole``
        snapshot (a decoder with states), and ``reserve`` slots promised to its forks."""
        handle = self.decoder.open(whole, reserve=reserve)
        for block in prefix:
            self.decoder.append(handle, block.keys, block.values)
        return handle

    def prefill(self, items: list[Rows]) -> dict[int, None]:
        """Every chunk's rows but its last (the engine feeds that one in the decode call): one call for the requests
        that start from empty slots with positions that fit one rotary table, one each for the others."""
        self.decoder.extend([(r.handle, np.asarray(r.embeds[:-1], np.float32), r.positions[:, :-1],
                              {k: v[:-1] for k, v in r.extras.items()} if r.extras else None)
                             for r in items if len(r.embeds) > 1])
        return {r.handle: None for r in items}

    def decode(self, feeds: dict) -> dict[int, np.ndarray]:
        return self.decoder.step({h: (np.asarray(e, np.float32), *rest) for h, (e, *rest) in feeds.items()})

    def fork(self, handle: int, count: int) -> list[int]:
        return self.decoder.fork(handle, count)

    def read(self, handle: int, start: int, stop: int) -> tuple[tuple, tuple]:
        return self.decoder.read(handle, start, stop)

    def snapshot(self, handle: int) -> KVSnapshot:
        return self.decoder.snapshot(handle)

    def length(self, handle: int) -> int:
        return self.decoder.length(handle)

    def leave(self, handle: int) -> None:
        self.decoder.leave(handle)

