"""Turn-boundary snapshots of a decoder with state that is not KV (contract v5: a hybrid decoder's Gated DeltaNet
layers carry a conv and a recurrent state per layer).

A KV prefix can be cut back to any row, so the prefix cache stores one snapshot per request and restores any prefix
of it. A layer's state holds the effect of every row so far and cannot be cut back: a snapshot is only good at
exactly the row it was taken at. The rows a later request shares with this one end, at the latest, where this
request's generation prompt begins (the layout's turn_end: a later turn renders the messages up to there the same
way, the generation prompt and the answer maybe not; Qwen3.5's template opens "<think>" in the prompt and drops it
when it renders the answer as an earlier turn). So each admitted request's prefill runs up to that row first, its
slot is snapshotted there (KV rows and states, runtime/prefix_cache.py: an exact boundary), and the rest of the
prompt runs after it; a later request restores the longest boundary its own rows reach.

The engine loop (runtime/engine.py) calls ``feed_with_boundaries`` in place of its one-call prefill when the decoder
has states and the prefix cache is on; the slots' ``admit(..., whole=True)`` and ``extend`` are the only hooks.
"""

from __future__ import annotations


def _rows(plan, native, start: int, end: int | None) -> tuple:
    """A prefill input of plan.rows[start:end]: (embeds [S,d], positions [R,S], decoder extras or None)."""
    rows = plan.rows[start:end]
    return native.embeds[rows], plan.positions[:, start:end], native.extras_at(rows)


def feed_with_boundaries(pipe, slots, plans: list, natives: list) -> list:
    """engine.feed_prefill for a decoder with states: the requests whose turn boundary lies after their restored
    prefix run up to it in one call (every row), are snapshotted into the prefix cache there, and go on with the rest
    of their prompt (``slots.extend``); the others are admitted as usual. -> per request (slot handle, logits [V] of
    its last row or None, as feed_prefill)."""
    out: list = [None] * len(plans)
    split = [i for i, p in enumerate(plans)
             if p.identity is not None and p.boundary is not None and p.cached < p.boundary < len(p.rows)]
    rest = [i for i in range(len(plans)) if i not in split]
    capacity = [len(p.rows) + p.state.max_tokens for p in plans]
    if rest:
        got = slots.admit([_rows(plans[i], natives[i], plans[i].cached, None) for i in rest],
                          [plans[i].prefix for i in rest], [capacity[i] for i in rest])
        for i, item in zip(rest, got):
            out[i] = item
    if split:
        got = slots.admit([_rows(plans[i], natives[i], plans[i].cached, plans[i].boundary) for i in split],
                          [plans[i].prefix for i in split], [capacity[i] for i in split], whole=True)
        for i, (handle, _) in zip(split, got):
            plan = plans[i]
            pipe.prefix_cache.insert(plan.identity[:plan.boundary], slots.snapshot(handle))
            out[i] = (handle, slots.extend(handle, *_rows(plan, natives[i], plan.boundary, None)))
    for plan in plans:
        plan.prefix = None  # restored: the slot holds it now
    pipe.check_files()  # no answer leaves before the background file check has passed (first request only)
    return out
