"""The engine loop: every request, alone or with others, runs here (vLLM's EngineCore.step in spirit).

    engine = pipe.engine(max_batch=8)                  # or Engine.build(model, inputs, cache, ...)
    rid = engine.submit(pipe.chat_request(messages, stop=["</s>"]))
    while engine.pending:
        for event in engine.step():   # EngineEvent: request id, answer index, new text piece (+ logprob), and
            ...                       # once done the GenerationResult or the request's own error

A request's way through:

    submit     -> the admission worker (runtime/admission.py): native sequence, vision, probe, selection, the pruned
                  rows (runtime/inputs.py), beside the decode steps (threaded) or when the step asks (inline); with
                  a batch of slots and a worker thread it also prefills the rows but the last into a staging slot
                  beside the steps (``_stage``: cached prefix blocks written in, the rest in chunks of STAGE_ROWS,
                  never cutting a range of rows one call must hold: contract v5's blocks)
    ready      -> its rows' block keys (runtime/prefix_cache.BlockChain) and the longest cached prefix, held
    each step: Scheduler.plan(running answers, ready/prefilling requests, free slots) -> StepPlan
               (runtime/scheduler.py: running decodes first, then prefill chunks under the step's token budget)
    execute    -> open slots for the requests that start (their cached prefix written in), the chunks' rows
                  (slots.prefill), forks of n > 1 requests at their last prompt row, then ONE decode call with a row
                  for every slot: a running answer's last token, or a prefilling request's chunk's last row
    update     -> per answer that got logits: sample (grammar mask, penalties) -> the stop rules (EOS / stop ids,
                  stop strings matched on the decoded text: runtime/stop.py, the grammar complete, the length)
                  -> an EngineEvent; a finished answer leaves its slot at once and its prompt + answer KV blocks
                  go into the prefix cache; a request whose prefill just ended shares its prompt's blocks at once
    cancel     -> drops a request in whichever stage it is (admission checks it between stages)

A decoder with state that is not KV (contract v5, ``Model.decoder_states``) keeps no KV blocks in the prefix cache:
its request's turn boundary (Prepared.turn_end) is a row where the scheduler ends a chunk (Pending.stops) and the
staging worker a call; there its slot is snapshotted whole (KV rows and states) into the cache's boundary store,
and a later request restores the longest stored boundary it reaches exactly (runtime/prefix_cache.py).

A failure while processing one request in a shared step (its sampling, grammar mask, stop rule, result) fails
that request alone (an error event; its slots freed); its neighbours' answers are unchanged. A failed prefill call
fails the requests it carried; a failed decode call fails every request it carried (each gets its error event).

Batch 1 is this loop with one slot (``LoopSlots`` over the model's DecoderLoop, any decoder form: the standard form
cannot batch, so it always runs here); up to N requests share ``BatchSlots`` (engines.ort_form_decoder.BatchDecoder,
ORT-form decoder). Not thread-safe: one thread drives an engine (a server worker owns its own); its admission
worker is the only other thread that touches the request.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass, field

import numpy as np

from coverpruner.engine_dir import graph_spec
from coverpruner.engines.interfaces import KVSnapshot
from coverpruner.engines.ort import device_type
from coverpruner.engines.ort_form_decoder import BatchDecoder
from coverpruner.runtime.admission import Admission
from coverpruner.runtime.attention_blocks import call_end
from coverpruner.runtime.errors import OptionError
from coverpruner.runtime.grammar import GrammarMatcher, start_masks
from coverpruner.runtime.inputs import InputProcessor, Prepared
from coverpruner.runtime.logprobs import TokenLogprob, token_logprob
from coverpruner.runtime.model import Model
from coverpruner.runtime.prefix_cache import Block, BlockChain, PrefixCache, token_identity
from coverpruner.runtime.result import GenerationResult, ImageResult
from coverpruner.runtime.sampling import Sampler
from coverpruner.runtime.scheduler import Pending, PrefillChunk, Scheduler, StepPlan
from coverpruner.runtime.slots import BatchSlots, LoopSlots, Rows
from coverpruner.runtime.stages import DecodeState, Request
from coverpruner.runtime.stop import StopMatcher
from coverpruner.runtime.text import StreamDecoder

#: tokens one step of a batched engine runs when not told (decodes + prefill chunk rows): a step near one decode
#: step's time (measured: benchmarks/bench_serve.py --interleave, docs/performance.md)
DEFAULT_MAX_STEP_TOKENS = 32
#: a threaded engine's full garbage collections (a server turns the automatic ones off: serving/memory.py
#: leave_full_collections_to_the_engines): at most one per FULL_GC_EVERY_S inside a pause left to an admission, and
#: at a step's start once FULL_GC_LATEST_S have passed without one
FULL_GC_EVERY_S = 5.0
FULL_GC_LATEST_S = 60.0
#: rows of one prefill call on the admission worker's thread (staging): each call reads every weight once, so
#: large; between calls a cancel is seen
STAGE_ROWS = 256


@dataclass
class EngineEvent:
    """What one step did for one answer of a request: ``piece`` (new text, may be ""; never part of a stop string),
    ``logprob`` (the TokenLogprob of the step's token when the request asked for logprobs), and once the answer is
    done ``result`` (its GenerationResult) or ``error`` (the exception the request's own processing raised: it
    ends all of the request's answers; the others go on)."""

    request_id: int
    piece: str = ""
    result: GenerationResult | None = None
    error: Exception | None = None
    index: int = 0  # which of the request's n answers; errors concern them all
    logprob: TokenLogprob | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


@dataclass(eq=False)
class _Job:
    """A submitted request: its stages' output (``prepared``), its prefix-cache chain and the blocks it found, its
    prefill progress (``done`` prompt rows in its slot) and its answers."""

    rid: int
    request: Request
    t_submit: float
    cancelled: bool = False
    prepared: Prepared | None = None
    error: Exception | None = None
    chain: BlockChain | None = None
    blocks: list = field(default_factory=list)  # the cached prefix it restores (held)
    snapshot: KVSnapshot | None = None  # a decoder with states: the turn-boundary snapshot it restores instead
    boundary: int | None = None  # a decoder with states: the row its slot is snapshotted at (its turn boundary)
    cached: int = 0
    done: int = 0
    staged: bool = False  # its rows but the last are in the slots' staging slot (prefilled by the admission worker)
    handle: int = -1  # its first answer's slot once started
    forks: list = field(default_factory=list)  # the slots of its answers 1..n-1 (copied at its last prompt row)
    t_prefill: float = 0.0

    @property
    def started(self) -> bool:
        return self.handle >= 0


@dataclass(eq=False)
class _Answer:
    """One of a request's n answers in its slot: its decode position, sampler stream, detokenizer, stop strings,
    grammar parser, tokens and text so far, and the prefix blocks it holds (its chain grows with its tokens)."""

    job: _Job
    index: int
    handle: int
    state: DecodeState
    sampler: Sampler
    stream: StreamDecoder
    stops: StopMatcher
    grammar: GrammarMatcher | None
    chain: BlockChain | None
    held: list
    times: dict
    tokens: list = field(default_factory=list)
    text: list = field(default_factory=list)
    t_decode: float = 0.0

    @property
    def key(self) -> tuple[int, int]:
        return self.job.rid, self.index


def _video_facts(facts: dict) -> dict | None:
    """What a result reports of a video (grid_thw, num_frames, second_per_grid_t); None for an image."""
    if facts.get("kind") != "video":
        return None
    return {"grid_thw": [int(v) for v in facts["grid_thw"]], "num_frames": int(facts["num_frames"]),
            "second_per_grid_t": float(facts["second_per_grid_t"])}


def make_result(request: Request, prepared: Prepared, text: str, tokens: list[int], times: dict, finish: str,
                cached: int = 0, stop_reason: str | int | None = None) -> GenerationResult:
    """The GenerationResult of a finished answer."""
    native, selection = prepared.native, prepared.selection
    images = [ImageResult(len(span.candidates), sel.keep, sel.relevance, vision.panels,
                          vision.facts.get("kind", "image"), _video_facts(vision.facts))
              for span, sel, vision in zip(native.spans, selection.images, native.visions)]
    return GenerationResult(
        text=text, token_ids=tokens, timings=times, prompt_tokens=native.length, prefill_tokens=prepared.length,
        budget=request.budget, method=request.method, finish_reason=finish, options=request.options,
        images=images, cached_tokens=cached, demand=request.demand, stop_reason=stop_reason)


class Engine:
    """Drives requests of one Model through ``slots`` (LoopSlots or BatchSlots); see the module docstring.

    inputs: the InputProcessor (the admission stages); cache: the model's PrefixCache; capacity: KV tokens a batch
    slot holds (checked per request at admission; None for LoopSlots); max_step_tokens: the scheduler's budget per
    step (None: unbounded; a batched engine's default DEFAULT_MAX_STEP_TOKENS); threaded: admission on a worker
    thread of its own (a server's engine), else in ``step`` (the library's calls); share: with threaded and a batch
    of slots, the decode steps and the admission take turns on the cores, the admission getting this share of the
    time while streams decode (runtime/admission.py, "Sharing the cores in turns"; None: side by side).
    """

    def __init__(self, model: Model, inputs: InputProcessor, cache: PrefixCache, slots, capacity: int | None = None,
                 max_step_tokens: int | None = None, threaded: bool = False, share: float | None = None):
        self.model, self.inputs, self.cache, self.slots = model, inputs, cache, slots
        self.max_batch, self.capacity = slots.max_batch, capacity
        self.scheduler = Scheduler(max_step_tokens if slots.batched else None, self.max_batch)
        #: the decoder carries state that is not KV (contract v5): the prefix cache holds whole snapshots at turn
        #: boundaries for it, no KV blocks (runtime/prefix_cache.py)
        self.states = bool(getattr(model, "decoder_states", False))
        #: the admission's share of the cores while streams decode, the two in turns (None: side by side)
        self.share = share if share and threaded and slots.stages else None
        self._owed = 0.0  # seconds the next step first leaves the cores to the admission
        self._pace: float | None = None  # seconds of a step with no admission under way (running mean)
        self._last_gc = time.perf_counter()  # the last full garbage pass (threaded engines run them: _collect)
        self.admission = Admission(inputs, capacity, threaded, self._stage if slots.stages else None,
                                   low_priority=self.share is not None)
        self._jobs: dict[int, _Job] = {}  # every request not finished, by id
        self._ready: list[_Job] = []  # prepared or prefilling, in arrival order
        self._running: dict[tuple[int, int], _Answer] = {}  # (request id, answer index) -> its answer
        self._next = 0
        #: the last step's plan (tests and benchmarks read it)
        self.last_plan = StepPlan()

    @classmethod
    def build(cls, model: Model, inputs: InputProcessor, cache: PrefixCache, max_batch: int = 1,
              capacity: int | None = None, max_step_tokens: int | None = None, threaded: bool = False,
              share: float | None = None) -> "Engine":
        """max_batch 1 (and no capacity): the model's own DecoderLoop, any decoder form. Otherwise a BatchDecoder
        of ``max_batch`` slots of ``capacity`` tokens (default the model's max positions; ORT-form decoder only,
        other dirs refused in one line). Its KV cache is num_layers x 2 x [max_batch, H_kv, capacity, hd] in the
        decoder's float dtype, on the provider's device (host for 'cpu', GPU memory for 'cuda')."""
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise OptionError(f"max_batch must be a positive integer, got {max_batch!r}")
        if max_batch == 1 and capacity is None:
            return cls(model, inputs, cache, LoopSlots(model.decoder, model.family_runtime.position_rank),
                       threaded=threaded)
        if model.decoder_form != "ort":
            raise OptionError(f"{model.manifest.root}: batched decoding needs the ORT-form decoder "
                              f"(graphs.decoder.form 'ort'); this dir's is {model.decoder_form!r} (re-export with "
                              "--decoder-form ort, or decode one request at a time)")
        if max_step_tokens is None:
            max_step_tokens = max(DEFAULT_MAX_STEP_TOKENS, max_batch)
        try:
            Scheduler(max_step_tokens, max_batch)
        except ValueError as exc:
            raise OptionError(str(exc), param="max_step_tokens") from None
        d = model.manifest.dims
        capacity = int(capacity or model.max_positions)
        decoder = BatchDecoder(model.sessions["decoder"], max_batch, capacity, int(d["num_layers"]),
                               int(d["num_kv_heads"]), int(d["head_dim"]),
                               graph_spec(model.manifest, "decoder").rotary, device_type(model.provider),
                               model.staging_session() if threaded and share else None)
        return cls(model, inputs, cache, BatchSlots(decoder), capacity, max_step_tokens, threaded, share)

    # -- the driver's calls ---------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Requests submitted and not finished."""
        return len(self._jobs)

    def submit(self, request: Request) -> int:
        """Queue a validated Request (Pipeline.request / chat_request: its options, stop strings, n and logprobs
        included); returns its id. OptionError (param ``n``) when its n answers exceed the slots."""
        if request.n > self.max_batch:
            raise OptionError(f"n is {request.n}; this engine decodes at most {self.max_batch} answers side by side "
                              "(its max batch)", param="n")
        rid, self._next = self._next, self._next + 1
        job = _Job(rid, request, time.perf_counter())
        self._jobs[rid] = job
        self.admission.submit(job)
        return rid

    def cancel(self, rid: int) -> bool:
        """Drop request ``rid`` (all its answers) in whichever stage it is, without an event; False if it is unknown
        or done."""
        job = self._jobs.get(rid)
        if job is None:
            return False
        job.cancelled = True  # the admission worker drops it at its next stage boundary
        self._end(job)
        return True

    def close(self) -> None:
        """Stop the admission worker (the engine drops what it had)."""
        self.admission.close()

    def run(self, request: Request):
        """One request through the loop alone: yields its text pieces, returns its GenerationResult; its error
        (one-line CoverPrunerError for bad input) is raised."""
        rid = self.submit(request)
        try:
            while rid in self._jobs:
                for event in self.step(wait=0.05):
                    if event.request_id != rid:
                        continue
                    if event.error is not None:
                        raise event.error
                    if event.piece:
                        yield event.piece
                    if event.result is not None:
                        return event.result
        finally:
            self.cancel(rid)  # a consumer that stopped early frees the slot
        raise RuntimeError("the engine finished without a result")  # unreachable: every request ends in an event

    # -- one step -------------------------------------------------------------------------------
    def step(self, wait: float = 0.0) -> list[EngineEvent]:
        """Collect the requests whose inputs are ready -> plan -> execute -> update: one event per answer that did
        something (see the module docstring). wait: seconds to wait for an admission when nothing else can run."""
        events: list[EngineEvent] = []
        if self._owed:  # the last step's streams leave the cores to the admission's threads for a while
            t = time.perf_counter()
            self._collect(FULL_GC_EVERY_S)  # a full garbage pass here takes the admission's time, not the streams'
            time.sleep(max(0.0, self._owed - (time.perf_counter() - t)))
            self._owed = 0.0
        elif self.admission.threaded:
            self._collect(FULL_GC_LATEST_S)
        idle = not self._running and not self._ready
        for job in self.admission.collect(self._free_slots(), wait if idle else 0.0):
            if job.rid not in self._jobs:  # cancelled meanwhile: what its admission took goes back
                if job.staged:
                    self.slots.unstage()
                self.cache.release(job.blocks)
                job.blocks = []
                continue
            if job.error is not None:
                self._end(job)
                events.append(EngineEvent(job.rid, error=job.error))
            else:
                self._enter(job)
        plan = self.scheduler.plan(list(self._running), [self._pending(j) for j in self._ready], self._free_slots())
        self.last_plan = plan
        if plan.empty:
            return events
        t_exec = time.perf_counter()
        try:
            return self._execute(plan, events)
        finally:
            if self.share:
                self._pace_step(time.perf_counter() - t_exec)

    def _collect(self, every: float) -> None:
        """A full garbage pass on this thread if ``every`` seconds have passed since the last."""
        now = time.perf_counter()
        if now - self._last_gc >= every:
            gc.collect()
            self._last_gc = time.perf_counter()

    def _pace_step(self, took: float) -> None:
        """Turns on the cores (``share``): after a step with streams running and an admission under way, the next
        step first leaves the cores to the admission for what remains of 1 / (1 - share) steps at the streams' own
        pace (a running mean of the steps with no admission under way) after this step's own time: the streams'
        gap stays at that multiple of their pace when a step beside an admission runs slower (this machine's
        memory bandwidth varies; the admission then gets less), and the admission gets share of the time when it
        does not."""
        if not self.admission.pending:
            self._pace = took if self._pace is None else 0.8 * self._pace + 0.2 * took
        elif self._running:
            self._owed = max(0.0, (self._pace or took) / (1.0 - self.share) - took)

    def _execute(self, plan: StepPlan, events: list) -> list[EngineEvent]:
        running = [self._running[key] for key in plan.decodes]
        chunks = [(self._jobs[c.rid], c) for c in plan.prefills]
        masks, mask_of = self._start_masks(running)
        first, failed = self._prefill(chunks)  # first: {rid: logits [V]} of LoopSlots' final chunks
        for job, exc in failed:
            events.append(EngineEvent(job.rid, error=exc))
        chunks = [(job, c) for job, c in chunks if job.rid in self._jobs and job.started]
        feeds = self._decode_feeds(running, chunks)
        try:
            logits = self.slots.decode(feeds) if feeds else {}
        except Exception as exc:  # noqa: BLE001 - a failed shared call fails every request it carried
            for job in {a.job for a in running} | {job for job, _ in chunks}:
                self._end(job)
                events.append(EngineEvent(job.rid, error=exc))
            return events
        for answer in running:
            events.append(self._take_token(answer, logits[answer.handle], masks, mask_of))
        for job, chunk in chunks:
            if job.rid not in self._jobs:
                continue
            job.done = chunk.stop
            if chunk.stop == job.boundary:
                events.append(self._snapshot_boundary(job))
            if chunk.final:
                events += self._start_answers(job, first.get(job.rid), logits)
        return [e for e in events if e is not None]

    # -- entering, planning ------------------------------------------------------------------------
    def _free_slots(self) -> int:
        """Slots no request holds nor has reserved (a started request with n answers reserves n - 1 for its forks;
        the admission worker's staged request holds one)."""
        return self.slots.free

    def _match(self, job: _Job) -> None:
        """The request's block chain and the longest cached prefix of it (held)."""
        prepared = job.prepared
        if prepared.identity is None:
            return
        job.chain = BlockChain(prepared.identity)
        if not self.states:
            job.blocks = self.cache.match(job.chain, prepared.length - 1, prepared.whole)
            job.cached = job.done = len(job.blocks) * _block_rows(job.blocks)
            return
        # a decoder with states restores only a whole snapshot at a stored turn boundary, and is snapshotted at its
        # own (the rows before its generation prompt) when that lies past what it restores
        found = self.cache.match_boundary(job.chain, prepared.length - 1)
        job.snapshot = found.snap if found is not None else None
        job.cached = job.done = found.snap.length if found is not None else 0
        end = prepared.turn_end
        job.boundary = end if end is not None and job.cached < end < prepared.length else None

    def _enter(self, job: _Job) -> None:
        """A prepared request joins the ready list (its prefix matched, unless its staging did)."""
        if not job.staged:
            self._match(job)
        self._ready.append(job)

    @staticmethod
    def _pending(job: _Job) -> Pending:
        """A staged request waits only for the slots of its forks (it holds its own)."""
        slots = job.request.n - 1 if job.staged else job.request.n
        stops = (job.boundary,) if job.boundary is not None else ()
        return Pending(job.rid, job.prepared.length, job.done, slots, job.started, job.prepared.whole, stops)

    def _stage(self, job: _Job, check) -> None:
        """On the admission worker's thread: the request's cached prefix and its rows but the last into the slots'
        staging slot (waiting for it to be free), in calls of STAGE_ROWS rows with ``check`` (cancel) between, and
        their blocks into the prefix cache; the engine's next step joins it (its last row rides the decode call).
        Undone on cancel or error."""
        prepared = job.prepared
        self._match(job)
        reserved = False
        try:
            while not self.slots.stage(job.blocks, job.snapshot):
                check()
                time.sleep(0.005)
            reserved, job.snapshot = True, None  # restored: the slot holds it now
            job.t_prefill = time.perf_counter()
            while job.done < prepared.length - 1:
                check()
                # a call never cuts a range one call must hold (contract v5's blocks: runtime/attention_blocks.py)
                stop = call_end(prepared.whole, job.done, min(job.done + STAGE_ROWS, prepared.length - 1))
                if job.boundary is not None and job.done < job.boundary:
                    stop = min(stop, job.boundary)  # a decoder with states is snapshotted there
                self.slots.stage_rows(Rows(-1, prepared.embeds(job.done, stop), prepared.positions[:, job.done:stop],
                                           prepared.extras(job.done, stop)))
                job.done = stop
                if stop == job.boundary:
                    self.cache.insert_boundary(job.chain, stop, self.slots.stage_snapshot())
            if job.chain is not None and not self.states:  # its prompt's blocks, shared from here, copied here
                self.cache.insert(job.chain, job.done, self.slots.stage_read, job.blocks)
            self.slots.prefault_join()
            job.staged = True
        except BaseException:
            if reserved:
                self.slots.unstage()
            self.cache.release(job.blocks)
            job.blocks = []
            raise

    # -- execute -----------------------------------------------------------------------------------
    def _prefill(self, chunks: list) -> tuple[dict, list]:
        """Open the slots of the requests that start, then run every chunk's rows (one slots.prefill call; BatchSlots
        leaves each chunk's last row to the decode call) -> ({rid: logits of a LoopSlots final chunk}, [(job, error)]
        of the requests it failed)."""
        items, failed, by_handle = [], [], {}
        for job, chunk in chunks:
            prepared, forks = job.prepared, job.request.n - 1
            if not job.started and self.slots.free < forks + (not job.staged):
                continue  # the admission worker staged a request since the plan: this one starts next step
            try:
                if job.staged:
                    job.handle, job.staged = self.slots.join_staged(forks), False
                elif not job.started:
                    job.t_prefill = time.perf_counter()
                    job.handle = self.slots.open(job.blocks, prepared.length + prepared.state.max_tokens, forks,
                                                 job.snapshot)
                    job.snapshot = None  # restored: the slot holds it now
            except Exception as exc:  # noqa: BLE001 - this request's slot could not be opened
                self._end(job)
                failed.append((job, exc))
                continue
            items.append(Rows(job.handle, prepared.embeds(chunk.start, chunk.stop),
                              prepared.positions[:, chunk.start:chunk.stop], prepared.extras(chunk.start, chunk.stop)))
            by_handle[job.handle] = job
        if not items:
            return {}, failed
        try:
            out = self.slots.prefill(items)
        except Exception as exc:  # noqa: BLE001 - a failed prefill call fails the requests it carried
            for rows in items:
                self._end(by_handle[rows.handle])
                failed.append((by_handle[rows.handle], exc))
            return {}, failed
        self.model.check_files()  # no answer leaves before the background file check has passed (first only)
        return {by_handle[h].rid: v for h, v in out.items() if v is not None}, failed

    def _decode_feeds(self, running: list[_Answer], chunks: list) -> dict:
        """The decode call's rows: each running answer's last token at its decode position, and (BatchSlots) each
        prefilling request's chunk's last row; a request at its last prompt row with n > 1 is forked first (its
        cache copied into n - 1 slots; their last rows ride the same call)."""
        feeds = {}
        if running:
            embeds = self.model.embed(np.array([a.tokens[-1] for a in running], dtype=np.int64))
            for answer, emb in zip(running, embeds):
                feeds[answer.handle] = (emb, self._token_position(answer))
        if not self.slots.batched:
            return feeds
        for job, chunk in chunks:
            prepared, last = job.prepared, chunk.stop - 1
            extras = prepared.extras(last, last + 1)
            row = (prepared.embeds(last, last + 1)[0], prepared.positions[:, last],
                   {k: v[0] for k, v in extras.items()} if extras else None)
            if chunk.final and job.request.n > 1:
                job.forks = self.slots.fork(job.handle, job.request.n - 1)
            for handle in [job.handle, *job.forks]:
                feeds[handle] = row
        return feeds

    def _token_position(self, answer: _Answer) -> np.ndarray:
        """The decode position of the answer's last token (fed now); its state and its block chain advance."""
        state = answer.state
        pos = np.asarray(self.model.family_runtime.decode_position(state.native, state.pruned, state.step),
                         dtype=np.int64)
        state.step += 1
        if answer.chain is not None:
            answer.chain.extend(token_identity([answer.tokens[-1]], pos.reshape(1, -1)))
        return pos

    def _start_masks(self, running: list[_Answer]):
        constrained = [a for a in running if a.grammar is not None]
        return start_masks([a.grammar for a in constrained]), {a.key: i for i, a in enumerate(constrained)}

    # -- update ------------------------------------------------------------------------------------
    def _start_answers(self, job: _Job, first, logits: dict) -> list[EngineEvent]:
        """A request's prefill ended: its n answers start (their first tokens from the last prompt row's logits);
        with BatchSlots its prompt's blocks go into the prefix cache now (a concurrent request with the same prefix
        finds them)."""
        prepared, request = job.prepared, job.request
        now = time.perf_counter()
        answers = []
        try:  # the request's own: a failure here (its grammar's parser, its blocks) ends it alone
            if self.slots.batched and job.chain is not None:
                self._insert(job.handle, job.chain, prepared.length, job.blocks)
            for index, handle in enumerate([job.handle, *job.forks]):
                times = dict(prepared.timings)
                times["prefill"] += now - job.t_prefill
                answers.append(_Answer(job, index, handle, dataclasses.replace(prepared.state),
                                       Sampler(request.sampling, index), StreamDecoder(self.model.encoder),
                                       StopMatcher(request.stop),
                                       GrammarMatcher(request.grammar) if request.grammar is not None else None,
                                       _copy_chain(job.chain), [], times, t_decode=now))
        except Exception as exc:  # noqa: BLE001
            self._end(job)
            return [EngineEvent(job.rid, error=exc)]
        self._ready.remove(job)
        for answer in answers:
            answer.held = self._hold_copy(job.blocks)  # each answer holds the prompt's blocks until it ends
            self._running[answer.key] = answer
        self.cache.release(job.blocks)  # now held by its answers
        job.blocks = []
        masks, mask_of = self._start_masks(answers)
        events = []
        for answer in answers:
            row = first if first is not None else logits[answer.handle]
            events.append(self._take_token(answer, row, masks, mask_of))
        return events

    def _take_token(self, answer: _Answer, logits: np.ndarray, masks, mask_of: dict) -> EngineEvent | None:
        """Sample the answer's next token from logits [V] (under its grammar's mask, which then consumes the token)
        and apply the stop rules. Any error here is the request's own: it ends all its answers with one error event
        (None for a sibling answer already ended); its neighbours are untouched."""
        job = answer.job
        if job.rid not in self._jobs:
            return None
        try:
            allowed = masks.allowed(mask_of[answer.key]) if answer.grammar is not None else None
            token = answer.sampler(logits, allowed)
            if answer.grammar is not None:
                answer.grammar.advance(token)
            return self._after_token(answer, logits, token)
        except Exception as exc:  # noqa: BLE001 - fails this request alone
            self._end(job)
            return EngineEvent(job.rid, error=exc)

    def _after_token(self, answer: _Answer, logits: np.ndarray, token: int) -> EngineEvent:
        """The stop rules for the answer's new token (sampled from logits [V]): an EOS id ("eos") or a stop token id
        ("stop") ends the answer (kept in token_ids, not in the text, no logprob); else its text piece goes through
        the stop strings (text that may start one is held back; at a match the answer ends, "stop", its text cut
        before the match), its TokenLogprob when asked, and the answer ends when its grammar is complete ("grammar")
        or at state.max_tokens ("length", or "context" when the context ended first). A finished answer leaves its
        slot before its event is returned."""
        request = answer.job.request
        answer.tokens.append(int(token))
        finish, piece, logprob, reason = None, "", None, None
        if token in request.stop_ids:
            finish = "eos"
        elif token in request.stop_token_ids:
            finish, reason = "stop", int(token)
        else:
            piece, stopped = answer.stops.push(answer.stream.push(token))
            if request.top_logprobs is not None:
                logprob = token_logprob(logits, token, request.top_logprobs)
            if stopped:
                finish, reason = "stop", answer.stops.matched
            elif answer.grammar is not None and answer.grammar.done:
                finish = "grammar"
            elif len(answer.tokens) >= answer.state.max_tokens:
                finish = answer.state.limit
        if finish is None:
            answer.text.append(piece)
            return EngineEvent(answer.job.rid, piece, index=answer.index, logprob=logprob)
        if not answer.stops.stopped:  # the decoder's held-back tail, then the text held back for a stop string
            tail, stopped = answer.stops.push(answer.stream.flush())
            piece += tail + answer.stops.flush()
            if stopped:  # completed by the tail: the text ends before it all the same
                finish, reason = "stop", answer.stops.matched
        answer.text.append(piece)
        times = answer.times
        times["decode"] = time.perf_counter() - answer.t_decode
        self._finish(answer)
        times["total"] = time.perf_counter() - answer.job.t_submit
        result = make_result(request, answer.job.prepared, "".join(answer.text), answer.tokens, times, finish,
                             answer.job.cached, reason)
        return EngineEvent(answer.job.rid, piece, result, index=answer.index, logprob=logprob)

    # -- leaving -----------------------------------------------------------------------------------
    def _finish(self, answer: _Answer) -> None:
        """The answer is done: its prompt + answer KV into the prefix cache (the last token was sampled, never fed),
        its slot freed, its blocks released; the request ends with its last answer."""
        if answer.chain is not None and self.slots.length(answer.handle) == answer.chain.rows:
            self._insert(answer.handle, answer.chain, answer.chain.rows, answer.held)
        del self._running[answer.key]
        self.slots.leave(answer.handle)
        self.cache.release(answer.held)
        answer.held = []
        job = answer.job
        if not any(key[0] == job.rid for key in self._running):
            self._jobs.pop(job.rid, None)

    def _end(self, job: _Job) -> None:
        """Drop a request in whichever stage it is: its slots freed, its blocks released."""
        self._jobs.pop(job.rid, None)
        if job in self._ready:
            self._ready.remove(job)
            for handle in ([job.handle, *job.forks] if job.started else []):
                self.slots.leave(handle)
            if job.started and not job.forks and job.request.n > 1:
                self.slots.unreserve(job.request.n - 1)
            if job.staged:
                self.slots.unstage()
        for key in [k for k in self._running if k[0] == job.rid]:
            answer = self._running.pop(key)
            self.slots.leave(answer.handle)
            self.cache.release(answer.held)
            answer.held = []
        self.cache.release(job.blocks)
        job.blocks = []

    def _snapshot_boundary(self, job: _Job) -> EngineEvent | None:
        """A decoder with states reached its turn boundary (its slot holds exactly those rows): its KV rows and
        states go into the prefix cache whole. A failure here ends this request alone (its error event)."""
        try:
            self.cache.insert_boundary(job.chain, job.boundary, self.slots.snapshot(job.handle))
        except Exception as exc:  # noqa: BLE001
            self._end(job)
            return EngineEvent(job.rid, error=exc)
        return None

    def _insert(self, handle: int, chain: BlockChain, rows: int, held: list) -> None:
        """KV blocks of the slot's first ``rows`` rows into the prefix cache (none for a decoder with states: KV rows
        without the states at the same row are useless; it keeps turn-boundary snapshots instead)."""
        if self.states:
            return
        self.cache.insert(chain, rows, lambda start, stop: self.slots.read(handle, start, stop), held)

    def _hold_copy(self, blocks: list[Block]) -> list[Block]:
        """Another answer's hold on the same blocks (a forked answer shares its request's prefix)."""
        self.cache.hold(blocks)
        return list(blocks)


def _block_rows(blocks: list[Block]) -> int:
    return blocks[0].ident.shape[0] if blocks else 0


def _copy_chain(chain: BlockChain | None) -> BlockChain | None:
    return None if chain is None else chain.copy()
