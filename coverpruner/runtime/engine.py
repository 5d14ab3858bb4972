"""The engine loop: every request, alone or with others, runs here (vLLM's EngineCore.step in spirit).

    engine = Engine.for_pipeline(pipe, max_batch=8)       # max_batch 1: the Pipeline's own DecoderLoop
    rid = engine.submit(pipe.request(image, prompt))
    while engine.pending:
        for event in engine.step():   # EngineEvent: request id, new text piece, GenerationResult / error when done
            ...

One ``step`` is schedule -> run -> update, each a small named function:

    admit       queued requests take the free slots: their stages (native sequence, select: per request),
                ``plan_prefill`` (pruned rows, positions, the longest cached prefix of their row identities),
                then ``feed_prefill``: each one's prefix restored into its slot and the rows after it (one
                forward at batch 1; in a batch all rows but the last, BatchDecoder.admit: the requests that start
                from an empty slot in one right-padded call, a request with a restored prefix alone, since ONNX
                Runtime's attention runs several rows of several requests only as a first prompt)
    decode      ONE decoder call (``feed_decode``): a token for every running request and, in a batch, the last
                prompt row of every request admitted in this step (vLLM's chunked prefill: the last chunk, one
                row, rides beside the decodes), whose logits give those requests their first tokens
    update      ``_after_token``: the stop rules (a stop id, max_new_tokens, the context), text pieces, and at
                the end the request's KV inserted into the prefix cache and its slot freed
    cancel      drops a queued or running request between steps
    fork        a request submitted with n > 1 (OpenAI's ``n``) is admitted once (one vision pass, one selection,
                one prefill) and its prefix copied into n - 1 more slots (``_fork``): n answers, each with its
                own sampler stream (runtime.sampling: answer i's seed), each an event ``index``. With
                ``top_logprobs`` (0..20) every answer token's event carries its TokenLogprob (runtime.logprobs)

Batch 1 is this loop with one slot (``LoopSlots`` over Pipeline.decoder, any decoder form: the standard form
cannot batch, so it always runs here); up to N requests share ``BatchSlots`` (engines.ort_form_decoder.
BatchDecoder, ORT-form decoder). Pipeline.generate / stream / chat / chat_stream / batch_generate, coverpruner-run,
evaluation and both server worker pools go through it, and so does prefix reuse: a request admitted into a
running batch restores its longest cached pruned prefix into its own slot and prefills only the rest.
Not thread-safe: one thread drives an engine (a server worker owns its own).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from coverpruner.engine_dir import graph_spec, position_ids_input
from coverpruner.engines.interfaces import KVSnapshot
from coverpruner.engines.ort import device_type
from coverpruner.engines.ort_form_decoder import BatchDecoder
from coverpruner.runtime.errors import OptionError, PromptError
from coverpruner.runtime.grammar import GrammarMatcher, start_masks
from coverpruner.runtime.logprobs import TokenLogprob, check_top_logprobs, token_logprob
from coverpruner.runtime.options import check_int
from coverpruner.runtime.prefix_cache import TEXT_ROW
from coverpruner.runtime.result import TIMING_KEYS, GenerationResult
from coverpruner.runtime.sampling import Sampler
from coverpruner.runtime.stages import DecodeState, NativeSequence, Request, Selection
from coverpruner.runtime.state_boundaries import feed_with_boundaries
from coverpruner.runtime.text import StreamDecoder


@dataclass
class EngineEvent:
    """What one step did for one request: ``piece`` (new text, may be ""), and once it is done ``result``
    (its GenerationResult) or ``error`` (the exception its own stages raised; the others go on)."""

    request_id: int
    piece: str = ""
    result: GenerationResult | None = None
    error: Exception | None = None
    index: int = 0  # which of the request's n answers (fork); errors concern them all
    logprob: TokenLogprob | None = None  # the token of this step (submit's top_logprobs; none for a stop id)

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


# -- the decoder slots: one request (any DecoderLoop) or many (BatchDecoder) --------------------------
class LoopSlots:
    """One slot over a coverpruner.engines.interfaces.DecoderLoop (the Pipeline's own decoder, any form).
    The cache is sized per request (prompt + the tokens it may generate)."""

    max_batch = 1

    def __init__(self, decoder, position_rank: int):
        self.decoder, self.rank = decoder, position_rank

    def admit(self, inputs: list, prefixes: list, capacities: list,
              whole: bool = False) -> list[tuple[int, np.ndarray | None]]:
        """inputs: [(embeds [S,d], positions int64 [R,S], decoder extras {name: [S,d]} or None)] of one request
        (its rows after the restored prefix, S >= 1) -> [(handle 0, logits [V] of its last row)]: the rows run in
        one forward, exactly as a one-shot prefill. The cache is reset to capacities[0] tokens. (whole: every row
        is fed anyway here.)"""
        (embeds, positions, extras), = inputs
        self.decoder.reset(capacities[0])
        if prefixes[0] is not None:
            self.decoder.restore(prefixes[0])
        return [(0, self.extend(0, embeds, positions, extras))]

    def extend(self, handle: int, embeds: np.ndarray, positions: np.ndarray, extras) -> np.ndarray:
        """More rows of the request's prompt (embeds [S,d], positions [R,S], extras {name: [S,d]} or None) after
        what its cache holds -> logits [V] of the last."""
        extras = {k: v[None] for k, v in extras.items()} if extras else None
        return np.array(self.decoder.forward(embeds[None], position_ids_input(positions, self.rank), extras=extras))

    def step(self, feeds: dict) -> dict:
        """{0: (embedding [d], position int64 [R])} -> {0: logits [V]} (a decode row: no decoder extras)."""
        (handle, (emb, pos)), = feeds.items()
        pos = np.asarray(pos, dtype=np.int64).reshape(-1, 1)
        return {handle: self.decoder.forward(emb[None, None], position_ids_input(pos, self.rank))}

    def length(self, handle: int) -> int:
        return self.decoder.length

    def snapshot(self, handle: int) -> KVSnapshot:
        return self.decoder.snapshot()

    def leave(self, handle: int) -> None:
        """Nothing to free: the next prefill resets the cache."""


class BatchSlots:
    """Up to ``max_batch`` requests over an engines.ort_form_decoder.BatchDecoder (float32 KV, ``capacity``
    tokens per request, allocated once)."""

    def __init__(self, decoder: BatchDecoder):
        self.decoder, self.max_batch, self.capacity = decoder, decoder.max_batch, decoder.capacity

    def admit(self, inputs: list, prefixes: list, capacities: list,
              whole: bool = False) -> list[tuple[int, np.ndarray | None]]:
        """As LoopSlots.admit, but every request's last row is left out (logits None): it goes into the next
        batched step beside the other requests' tokens (BatchDecoder.admit says why); whole: every row is fed (the
        prompt goes on with ``extend``)."""
        cut = None if whole else -1
        handles = self.decoder.admit([(np.asarray(e[:cut], np.float32), p[:, :cut],
                                       {k: v[:cut] for k, v in x.items()} if x else None) for e, p, x in inputs],
                                     prefixes)
        return [(h, None) for h in handles]

    def extend(self, handle: int, embeds: np.ndarray, positions: np.ndarray, extras) -> None:
        """More rows of an admitted request's prompt, the last one left for the next step (as admit)."""
        if len(embeds) > 1:
            self.decoder.extend(handle, np.asarray(embeds[:-1], np.float32), positions[:, :-1],
                                {k: v[:-1] for k, v in extras.items()} if extras else None)

    def step(self, feeds: dict) -> dict:
        return self.decoder.step({h: (np.asarray(e, np.float32), *rest) for h, (e, *rest) in feeds.items()})

    def length(self, handle: int) -> int:
        return self.decoder.length(handle)

    def snapshot(self, handle: int) -> KVSnapshot:
        return self.decoder.snapshot(handle)

    def leave(self, handle: int) -> None:
        self.decoder.leave(handle)


# -- the two places the decoder is fed ----------------------------------------------------------------
@dataclass
class PrefillPlan:
    """What one request's prefill feeds: rows int64 [L'] (ascending native indices), positions int64 [R,L'],
    the DecodeState, identity int64 [L',C] of the rows (None with the prefix cache off), cached (rows restored
    from ``prefix``, a KVSnapshot or None), boundary: the pruned row where the conversation's messages end (the
    layout's turn_end; a decoder with states is snapshotted there: runtime/state_boundaries.py), None if unknown."""

    rows: np.ndarray
    positions: np.ndarray
    state: DecodeState
    identity: np.ndarray | None = None
    cached: int = 0
    prefix: KVSnapshot | None = None
    boundary: int | None = None


def plan_prefill(pipe, request: Request, native: NativeSequence, selection: Selection,
                 capacity: int | None = None) -> PrefillPlan:
    """The pruned rows and positions of a request and the longest prefix of them the pipeline's prefix cache
    holds (at most L' - 1 rows). capacity: KV tokens a batch slot holds; PromptError (one line) when the request
    needs more."""
    rows, positions, state = pipe.pruned_sequence(request, native, selection)
    if capacity is not None and len(rows) + state.max_tokens > capacity:
        raise PromptError(f"request needs {len(rows)} prompt + {state.max_tokens} new tokens; the batch's KV "
                          f"capacity is {capacity} per request")
    plan = PrefillPlan(rows, positions, state)
    if native.layout.turn_end is not None:  # kept rows before the generation prompt (text rows: all kept)
        plan.boundary = int(np.searchsorted(rows, native.layout.turn_end))
    if pipe.prefix_cache.enabled:
        plan.identity = pipe.row_identities(native, selection, rows, positions)
        plan.cached, plan.prefix = pipe.prefix_cache.lookup(plan.identity)
    return plan


def feed_prefill(pipe, slots, plans: list[PrefillPlan], natives: list[NativeSequence]
                 ) -> list[tuple[int, np.ndarray | None]]:
    """The one place a prefill reaches the decoder: per request its restored prefix and the rows after it, all
    requests admitted together in one call -> per request (slot handle, logits [V] of its last row, or None where
    the slots leave the last row to the next step: ``last_row`` through feed_decode). A decoder with states (contract
    v5) with the prefix cache on runs up to each request's turn boundary first and snapshots it there."""
    if pipe.decoder_states and pipe.prefix_cache.enabled:
        return feed_with_boundaries(pipe, slots, plans, natives)
    # the decoder extras (contract v4) are gathered with the same kept rows as the embeddings
    inputs = [(native.embeds[plan.rows[plan.cached:]], plan.positions[:, plan.cached:],
               native.extras_at(plan.rows[plan.cached:])) for plan, native in zip(plans, natives)]
    out = slots.admit(inputs, [p.prefix for p in plans], [len(p.rows) + p.state.max_tokens for p in plans])
    for plan in plans:
        plan.prefix = None  # restored: the slot holds it now
    pipe.check_files()  # no answer leaves before the background file check has passed (first request only)
    return out


def last_row(handle: int, plan: PrefillPlan, native: NativeSequence) -> tuple[int, np.ndarray, np.ndarray]:
    """A feed_decode item for a request's last prompt row: (handle, embedding [d], positions int64 [R], decoder
    extras {name: [d]} or None)."""
    extras = native.extras_at(plan.rows[-1:])
    return handle, native.embeds[plan.rows[-1]], plan.positions[:, -1], (
        {k: v[0] for k, v in extras.items()} if extras else None)


def token_row(pipe, handle: int, state: DecodeState, embedding: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """A feed_decode item for a generated token (embedding [d]) at the family's decode position for state.step;
    state.step advances."""
    fam = pipe.family_runtime
    pos = np.asarray(fam.decode_position(state.native, state.pruned, state.step), dtype=np.int64)
    state.step += 1
    return handle, embedding, pos


def feed_decode(pipe, slots, items: list[tuple[int, np.ndarray, np.ndarray]]) -> dict[int, np.ndarray]:
    """The one decode step: one row per request, (slot handle, embedding [d], positions int64 [R]) -> {handle:
    logits [V]} in one decoder call. A row is a generated token (token_row) or the last prompt row of a request
    admitted since the last step (last_row), whose logits start its answer."""
    return slots.step({h: (e, p, *x) for h, e, p, *x in items})


# -- the loop -----------------------------------------------------------------------------------------
@dataclass
class _Sequence:
    """A request in the engine: its stages' outputs, slot, sampler, stream decoder and tokens so far."""

    rid: int
    request: Request
    t_start: float = 0.0
    native: NativeSequence | None = None
    selection: Selection | None = None
    plan: PrefillPlan | None = None
    handle: int = -1
    first: np.ndarray | None = None  # logits [V] of the last prompt row when the prefill computed them
    sampler: Sampler | None = None
    stream: StreamDecoder | None = None
    times: dict = field(default_factory=dict)
    t_decode: float = 0.0
    tokens: list = field(default_factory=list)
    n: int = 1  # answers of the request (fork); the others are admitted as copies of this one
    index: int = 0  # this answer's index among them
    top_logprobs: int | None = None  # None: no logprobs
    grammar: GrammarMatcher | None = None  # this answer's response_format parser (runtime/grammar.py)


class Engine:
    """Drives requests of one Pipeline through ``slots`` (LoopSlots or BatchSlots); see the module docstring.

    capacity: KV tokens a batch slot holds (BatchSlots), checked per request at admission; None for LoopSlots.
    """

    def __init__(self, pipeline, slots, capacity: int | None = None):
        self.pipe, self.slots = pipeline, slots
        self.max_batch = slots.max_batch
        self.capacity = capacity
        self._queue: deque[_Sequence] = deque()
        self._running: dict[tuple[int, int], _Sequence] = {}  # (request id, answer index) -> its sequence
        self._next = 0

    @classmethod
    def for_pipeline(cls, pipeline, max_batch: int = 1, capacity: int | None = None) -> "Engine":
        """max_batch 1 (and no capacity): the pipeline's own DecoderLoop, any decoder form. Otherwise a BatchDecoder
        of ``max_batch`` slots of ``capacity`` tokens (default the model's max positions; ORT-form decoder only,
        other dirs refused in one line). Its KV cache is num_layers x 2 x [max_batch, H_kv, capacity, hd] in the
        decoder's float dtype, on the provider's device (host for 'cpu', GPU memory for 'cuda')."""
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise OptionError(f"max_batch must be a positive integer, got {max_batch!r}")
        if max_batch == 1 and capacity is None:
            return cls(pipeline, LoopSlots(pipeline.decoder, pipeline.family_runtime.position_rank))
        if pipeline.decoder_form != "ort":
            raise OptionError(f"{pipeline.manifest.root}: batched decoding needs the ORT-form decoder "
                              f"(graphs.decoder.form 'ort'); this dir's is {pipeline.decoder_form!r} (re-export with "
                              "--decoder-form ort, or decode one request at a time)")
        d = pipeline.manifest.dims
        capacity = int(capacity or pipeline.max_positions)
        decoder = BatchDecoder(pipeline.sessions["decoder"], max_batch, capacity, int(d["num_layers"]),
                               int(d["num_kv_heads"]), int(d["head_dim"]),
                               graph_spec(pipeline.manifest, "decoder").rotary, device_type(pipeline.provider))
        return cls(pipeline, BatchSlots(decoder), capacity)

    @property
    def pending(self) -> int:
        """Requests queued or running."""
        return len(self._queue) + len(self._running)

    def submit(self, request: Request, n: int = 1, top_logprobs: int | None = None) -> int:
        """Queue a validated Request (Pipeline.request / chat_request); returns its id. n: answers (1 ..
        max_batch: they decode side by side in the batch's slots); top_logprobs: None, or 0..20 alternatives
        reported with every token's log-probability. OptionError (param ``n`` / ``top_logprobs``) otherwise."""
        n = check_int("n", n, 1, self.max_batch)
        top_logprobs = check_top_logprobs(top_logprobs)
        rid, self._next = self._next, self._next + 1
        self._queue.append(_Sequence(rid, request, n=n, top_logprobs=top_logprobs))
        return rid

    def cancel(self, rid: int) -> bool:
        """Drop request ``rid`` (queued or running: all its answers) without an event; False if it is unknown or
        done."""
        for i, queued in enumerate(self._queue):
            if queued.rid == rid:
                del self._queue[i]
                return True
        keys = [key for key in self._running if key[0] == rid]
        for key in keys:
            self.slots.leave(self._running.pop(key).handle)
        return bool(keys)

    def step(self) -> list[EngineEvent]:
        """admit (queued requests into the free slots: stages, prefix, rows but the last) -> one decoder call (a
        token for every running request, the last prompt row of every admitted one) -> update (stop rules) ->
        one event per request that did something."""
        running = list(self._running.values())
        admitted, events = self._admit()
        if not running and not admitted:
            return events
        # the grammar masks of this step's tokens are computed in a background thread during the decoder call
        constrained = [s for s in running + admitted if s.grammar is not None]
        masks = start_masks([s.grammar for s in constrained])
        mask_of = {(s.rid, s.index): i for i, s in enumerate(constrained)}
        t = time.perf_counter()
        tokens = [s.tokens[-1] for s in running]
        embeds = self.pipe.embed(np.array(tokens, dtype=np.int64)) if running else ()
        items = [token_row(self.pipe, s.handle, s.plan.state, e) for s, e in zip(running, embeds)]
        items += [last_row(s.handle, s.plan, s.native) for s in admitted if s.first is None]
        try:
            logits = feed_decode(self.pipe, self.slots, items) if items else {}
        except Exception as exc:  # noqa: BLE001 - a failed step fails the requests it carried
            for seq in admitted:
                self.slots.leave(seq.handle)
            if running:
                raise
            return events + [EngineEvent(s.rid, error=exc) for s in admitted if s.index == 0]  # one per request
        dt = time.perf_counter() - t
        dead: set[int] = set()  # requests a grammar error ended during this update
        events += [self._take_token(s, logits[s.handle], masks, mask_of, dead) for s in running
                   if s.rid not in dead]
        for seq in admitted:
            if seq.rid in dead:  # a sibling answer's grammar failed: this one never starts
                self.slots.leave(seq.handle)
                continue
            t = time.perf_counter()
            self._running[seq.rid, seq.index] = seq
            row = logits[seq.handle] if seq.first is None else seq.first
            seq.first = None
            seq.times["prefill"] += dt  # the first token comes with the prefill (its sampling added in _take_token)
            seq.t_decode = t
            events.append(self._take_token(seq, row, masks, mask_of, dead, first=True))
        return [e for e in events if e is not None]

    def _take_token(self, seq: _Sequence, logits: np.ndarray, masks, mask_of: dict, dead: set[int],
                    first: bool = False) -> EngineEvent | None:
        """Sample the answer's next token from logits [V] (under its grammar's mask, which then consumes the
        token) and apply the stop rules. An error of its own (a grammar that cannot go on) ends this request alone,
        all its answers (rid added to ``dead``), with one error event; None for a sibling already ended."""
        if seq.rid in dead:
            return None
        t = time.perf_counter()
        try:
            allowed = masks.allowed(mask_of[seq.rid, seq.index]) if seq.grammar is not None else None
            token = seq.sampler(logits, allowed)
            if seq.grammar is not None:
                seq.grammar.advance(token)
        except OptionError as exc:
            dead.add(seq.rid)
            self.cancel(seq.rid)
            return EngineEvent(seq.rid, error=exc)
        if first:
            seq.times["prefill"] += time.perf_counter() - t
            seq.t_decode = time.perf_counter()
        return self._after_token(seq, logits, token)

    def run(self, request: Request):
        """One request through the loop alone: yields its text pieces, returns its GenerationResult; its error
        (one-line CoverPrunerError for bad input) is raised."""
        rid = self.submit(request)  # one answer
        while self.pending:
            for event in self.step():
                if event.request_id != rid:
                    continue
                if event.error is not None:
                    raise event.error
                if event.piece:
                    yield event.piece
                if event.result is not None:
                    return event.result
        raise RuntimeError("the engine finished without a result")  # unreachable: every request ends in an event

    # -- admit ---------------------------------------------------------------------------------------
    def _stages(self, seq: _Sequence) -> None:
        """Per request: native sequence, selection, prefill plan (prefix lookup)."""
        pipe = self.pipe
        seq.t_start = time.perf_counter()
        seq.native = pipe.native_sequence(seq.request)
        seq.selection = pipe.select(seq.request, seq.native)
        t = time.perf_counter()
        seq.plan = plan_prefill(pipe, seq.request, seq.native, seq.selection, self.capacity)
        if seq.request.grammar is not None:
            seq.grammar = GrammarMatcher(seq.request.grammar)
        seq.times = dict.fromkeys(TIMING_KEYS, 0.0)
        for stage in (seq.native, seq.selection):
            seq.times.update(stage.timings)
        seq.times["prefill"] = time.perf_counter() - t

    def _admit(self) -> tuple[list[_Sequence], list[EngineEvent]]:
        """Queued requests into the free slots: their stages one by one, then one feed_prefill for all of them.
        -> (the admitted sequences, error events of the ones that failed)."""
        events, seqs = [], []
        # a request takes n slots at once (FIFO: a request that needs more than are free waits for them)
        while self._queue and len(self._running) + sum(s.n for s in seqs) + self._queue[0].n <= self.max_batch:
            seq = self._queue.popleft()
            try:
                self._stages(seq)
            except Exception as exc:  # noqa: BLE001 - the request fails alone; the others go on
                events.append(EngineEvent(seq.rid, error=exc))
                continue
            seqs.append(seq)
        if not seqs:
            return [], events
        t = time.perf_counter()
        try:
            out = feed_prefill(self.pipe, self.slots, [s.plan for s in seqs], [s.native for s in seqs])
        except Exception as exc:  # noqa: BLE001 - a failed prefill fails the requests it carried
            return [], events + [EngineEvent(s.rid, error=exc) for s in seqs]
        dt = time.perf_counter() - t
        for seq, (handle, seq.first) in zip(seqs, out):
            seq.handle = handle
            seq.times["prefill"] += dt
        try:
            seqs += self._fork([s for s in seqs if s.n > 1])
        except Exception as exc:  # noqa: BLE001 - a failed copy fails the requests it carried
            for seq in seqs:
                self.slots.leave(seq.handle)
            return [], events + [EngineEvent(s.rid, error=exc) for s in seqs if s.index == 0]
        for seq in seqs:
            seq.sampler = Sampler(seq.request.sampling, seq.index)
            seq.stream = StreamDecoder(self.pipe.encoder)
        return seqs, events

    def _fork(self, parents: list[_Sequence]) -> list[_Sequence]:
        """Answers 1..n-1 of each request admitted with n > 1: the prefix the parent's prefill left in its slot
        (every prompt row but the last) copied into n - 1 fresh slots (slots.snapshot -> admit: a restore, no
        forward), each with its own DecodeState; their last prompt row rides the next decode step beside the
        parent's, as the parent's does. -> the new sequences (slots taken)."""
        children, plans, natives = [], [], []
        for parent in parents:
            if parent.first is not None:  # LoopSlots computed the last row too; submit bounds n by max_batch = 1
                raise OptionError("n > 1 needs a batch of slots", param="n")
            snapshot = self.slots.snapshot(parent.handle)
            for index in range(1, parent.n):
                plan = dataclasses.replace(parent.plan, state=dataclasses.replace(parent.plan.state),
                                           cached=len(parent.plan.rows) - 1, prefix=snapshot)
                children.append(_Sequence(parent.rid, parent.request, parent.t_start, parent.native,
                                          parent.selection, plan, times=dict(parent.times), index=index,
                                          n=parent.n, top_logprobs=parent.top_logprobs,
                                          grammar=None if parent.grammar is None
                                          else GrammarMatcher(parent.request.grammar)))
                plans.append(plan)
                natives.append(parent.native)
        if not children:
            return []
        out = feed_prefill(self.pipe, self.slots, plans, natives)
        for child, (handle, child.first) in zip(children, out):
            child.handle = handle
            child.plan.cached = next(p for p in parents if p.rid == child.rid).plan.cached  # what usage reports
        return children

    # -- update ----------------------------------------------------------------------------------------
    def _after_token(self, seq: _Sequence, logits: np.ndarray, token: int) -> EngineEvent:
        """The stop rules for the answer's new token (sampled from logits [V]): a stop id ends the answer (kept in
        token_ids, not in the text, no logprob); else its text piece (and its TokenLogprob when asked), and the
        answer ends when its grammar is complete (finish_reason "grammar") or at state.max_tokens ("length", or
        "context" when the context ended first)."""
        seq.tokens.append(int(token))
        finish, piece, logprob = None, "", None
        if token in seq.request.stop_ids:
            finish = "eos"
        else:
            piece = seq.stream.push(token)
            if seq.top_logprobs is not None:
                logprob = token_logprob(logits, token, seq.top_logprobs)
            if seq.grammar is not None and seq.grammar.done:
                finish = "grammar"
            elif len(seq.tokens) >= seq.plan.state.max_tokens:
                finish = seq.plan.state.limit
        if finish is None:
            return EngineEvent(seq.rid, piece, index=seq.index, logprob=logprob)
        piece += seq.stream.flush()
        del self._running[seq.rid, seq.index]
        now = time.perf_counter()
        seq.times["decode"] = now - seq.t_decode
        self._remember(seq)
        self.slots.leave(seq.handle)
        seq.times["total"] = time.perf_counter() - seq.t_start
        result = self.pipe.result(seq.request, seq.native, seq.selection, seq.stream.emitted, seq.tokens, seq.times,
                                  len(seq.plan.rows), finish, seq.plan.cached)
        return EngineEvent(seq.rid, piece, result, index=seq.index, logprob=logprob)

    def _remember(self, seq: _Sequence) -> None:
        """Insert the request's cache (the pruned prompt + the answer tokens fed back) into the prefix cache."""
        plan = seq.plan
        if plan.identity is None:
            return
        fam = self.pipe.family_runtime
        fed = seq.tokens[:-1]  # the last token was sampled, never fed
        extra = np.empty((len(fed), plan.identity.shape[1]), dtype=np.int64)
        extra[:, 0] = TEXT_ROW
        extra[:, 1] = fed
        for step in range(len(fed)):
            extra[step, 2:] = np.asarray(fam.decode_position(plan.state.native, plan.state.pruned, step),
                                         dtype=np.int64)
        identity = np.concatenate([plan.identity, extra])
        if self.slots.length(seq.handle) == len(identity):
            self.pipe.prefix_cache.insert(identity, self.slots.snapshot(seq.handle))
