"""The step planner of the engine loop: which rows run in the next decoder step, under a token budget (vLLM's
scheduler with chunked prefill, in spirit).

    plan = Scheduler(max_step_tokens=64, max_batch=8).plan(running, pending, free_slots)
    plan.decodes     answers that decode one token each (every running answer, first)
    plan.prefills    PrefillChunk per request: rows start..stop-1 of its pruned sequence (stop == total: the last
                     row, whose logits start its answer)

Rules, in order:
1. Every running answer decodes one token (a decode never waits for a prefill).
2. Every request already prefilling (it holds its slots) takes at least one row: a batched decoder step feeds one
   row to every slot it holds (engines.ort_form_decoder.BatchDecoder), so a started prefill advances every step.
3. With what is left of the budget, requests prefill in arrival order: first the started ones, then the ready ones
   while their n slots are free (first come, first served: a request that needs more slots than are free waits,
   and so do the ones behind it). A request with a cached prefix starts after it (``Pending.done``).
4. A chunk never runs past a request's next ``Pending.stops`` row (a row its slot must be read at: a decoder with
   states is snapshotted at its turn boundary, runtime/engine.py).
A long prefill is thus split into chunks across steps, each step near one decode step's time when the budget is
set so (``--max-step-tokens``); with no budget (None) a request prefills whole, which is what a single slot does
(there is nothing to interleave it with).
4. A chunk never cuts one of its request's ``whole`` ranges (rows one decoder call must hold together: contract v5's
   bidirectional blocks, runtime/attention_blocks.py), and since its last row runs by itself in the decode call,
   that row is never a range's row: it ends earlier (at the range's start) or, when that leaves nothing, after the
   range's last row, over the budget (a block is run whole).
"""

from __future__ import annotations

from dataclasses import dataclass

from coverpruner.runtime.attention_blocks import call_end


@dataclass(frozen=True)
class Pending:
    """A request waiting to prefill or prefilling: ``rid``, ``total`` pruned rows L', ``done`` rows already in (or
    restored into) its slot, ``slots`` it takes (its n answers), ``started`` (it holds its slots), ``whole``: the row
    ranges [a, b) no chunk may cut (rule 4; () for most families), ``stops``: rows where a chunk must end (rule 4: a
    decoder with states is snapshotted there)."""

    rid: int
    total: int
    done: int = 0
    slots: int = 1
    started: bool = False
    whole: tuple = ()
    stops: tuple = ()


@dataclass(frozen=True)
class PrefillChunk:
    """Rows start..stop-1 of request ``rid``'s pruned sequence of ``total`` rows."""

    rid: int
    start: int
    stop: int
    total: int

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def final(self) -> bool:
        """The chunk ends at the request's last prompt row: its logits start the answer."""
        return self.stop == self.total


@dataclass(frozen=True)
class StepPlan:
    """What one engine step runs: ``decodes`` (the running answers' keys, one token each) and ``prefills`` (one chunk
    per request, in arrival order); ``budget``: the step's token budget (None: unbounded)."""

    decodes: tuple = ()
    prefills: tuple = ()
    budget: int | None = None

    @property
    def tokens(self) -> int:
        """Rows the step feeds the decoder: a token per decode plus every chunk's rows."""
        return len(self.decodes) + sum(c.rows for c in self.prefills)

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.prefills


class Scheduler:
    """Plans each step under ``max_step_tokens`` (None: unbounded) for an engine of ``max_batch`` slots.
    max_step_tokens must leave room for a row beside a full batch of decodes (>= max_batch), or a waiting request
    could never start while the others decode."""

    def __init__(self, max_step_tokens: int | None, max_batch: int):
        if max_step_tokens is not None and (not isinstance(max_step_tokens, int) or isinstance(max_step_tokens, bool)
                                            or max_step_tokens < max_batch):
            raise ValueError(f"max_step_tokens must be an integer >= the max batch ({max_batch}) or None, got "
                             f"{max_step_tokens!r}")
        self.max_step_tokens, self.max_batch = max_step_tokens, max_batch

    def plan(self, running, pending: list[Pending], free_slots: int) -> StepPlan:
        """running: the keys of the answers that decode (each one token); pending: the requests that prefill or
        wait to, in arrival order; free_slots: slots nobody holds -> the StepPlan."""
        budget = self.max_step_tokens
        left = float("inf") if budget is None else budget - len(running)
        chunks = []
        for p in sorted(pending, key=lambda p: not p.started):  # stable: arrival order within each group
            if not p.started:
                if p.slots > free_slots or (left < 1 and (running or chunks)):
                    break
                free_slots -= p.slots
            rows = max(1, int(min(p.total - p.done, left, *(s - p.done for s in p.stops if s > p.done))))
            stop = min(call_end(p.whole, p.done, p.done + rows, alone_last=True), p.total)
            chunks.append(PrefillChunk(p.rid, p.done, stop, p.total))
            left -= stop - p.done
        return StepPlan(tuple(running), tuple(chunks), budget)
