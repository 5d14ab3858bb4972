"""Continuous batching for Pipeline: requests decoding at the same time share one decoder call per step.

    batch = BatchGenerator(pipe, max_batch=8, capacity=2048)
    ids = [batch.submit(pipe.request(image, prompt, max_new_tokens=128)) for image, prompt in jobs]
    while batch.pending:
        for event in batch.step():      # BatchEvent: request id, new text piece, GenerationResult when done
            ...
    # or: results = pipe.batch_generate([dict(image=..., prompt=...), ...], max_batch=8)

A submitted request waits in a queue until a slot is free; it then runs its own stages up to the prefill alone
(vision, probe, selection: per request, as in Pipeline.generate) and joins the batch at its first decode step.
Every ``step`` then advances all requests in the batch by one token in one batched decoder call
(engines.ort_form_decoder.BatchDecoder), and a request leaves at EOS, its length or context limit, or
``cancel`` without waiting for the others. Greedy tokens equal Pipeline.generate's (tests/runtime/
test_batching.py). Needs the ORT-form decoder (graphs.decoder.form "ort"); other dirs are refused in one line.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from coverpruner.engine_dir import graph_spec
from coverpruner.engines.ort_form_decoder import BatchDecoder
from coverpruner.runtime.errors import OptionError, PromptError
from coverpruner.runtime.result import TIMING_KEYS, GenerationResult
from coverpruner.runtime.sampling import Sampler
from coverpruner.runtime.stages import Request
from coverpruner.runtime.text import StreamDecoder


@dataclass
class BatchEvent:
    """What one step did for one request: ``piece`` (new text, may be ""), and once it is done ``result``
    (its GenerationResult) or ``error`` (a one-line CoverPrunerError raised by its own stages)."""

    request_id: int
    piece: str = ""
    result: GenerationResult | None = None
    error: Exception | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


@dataclass
class _Running:
    """A request in the batch: its stages' outputs, sampler, stream decoder and tokens so far."""

    rid: int
    handle: int
    request: Request
    native: object
    selection: object
    rows: int
    state: object
    sampler: Sampler
    stream: StreamDecoder
    times: dict
    t_start: float
    t_decode: float
    tokens: list = field(default_factory=list)


class BatchGenerator:
    """Drives up to ``max_batch`` requests of one Pipeline through a shared BatchDecoder.

    capacity: tokens one request may hold (pruned prompt + generated; default the model's max positions). The
    KV cache is allocated once: num_layers x 2 x [max_batch, H_kv, capacity, head_dim] float32. Not thread-safe:
    one thread calls submit / step / cancel (the server's worker does).
    """

    def __init__(self, pipeline, max_batch: int = 8, capacity: int | None = None):
        if pipeline.decoder_form != "ort":
            raise OptionError(f"{pipeline.manifest.root}: batched decoding needs the ORT-form decoder "
                              f"(graphs.decoder.form 'ort'); this dir's is {pipeline.decoder_form!r} (re-export with "
                              "--decoder-form ort, or decode one request at a time)")
        if not isinstance(max_batch, int) or max_batch < 1:
            raise OptionError(f"max_batch must be a positive integer, got {max_batch!r}")
        self.pipe = pipeline
        d = pipeline.manifest.dims
        self.capacity = int(capacity or pipeline.max_positions)
        self.decoder = BatchDecoder(pipeline.sessions["decoder"], max_batch, self.capacity, int(d["num_layers"]),
                                    int(d["num_kv_heads"]), int(d["head_dim"]),
                                    graph_spec(pipeline.manifest, "decoder").rotary)
        self.max_batch = max_batch
        self._queue: deque[tuple[int, Request]] = deque()
        self._running: dict[int, _Running] = {}
        self._next = 0

    @property
    def pending(self) -> int:
        """Requests queued or in the batch."""
        return len(self._queue) + len(self._running)

    def submit(self, request: Request) -> int:
        """Queue a validated Request (Pipeline.request); returns its id."""
        rid, self._next = self._next, self._next + 1
        self._queue.append((rid, request))
        return rid

    def cancel(self, rid: int) -> bool:
        """Drop request ``rid`` (queued or running) without an event; False if it is unknown or done."""
        for i, (qid, _) in enumerate(self._queue):
            if qid == rid:
                del self._queue[i]
                return True
        run = self._running.pop(rid, None)
        if run is None:
            return False
        self.decoder.leave(run.handle)
        return True

    # -- one step ---------------------------------------------------------------------------
    def step(self) -> list[BatchEvent]:
        """One batched decode step for the requests in the batch, then queued requests take the free slots (their
        stages up to the prefill, alone; they decode from the next step on). Returns one event per request that
        did something."""
        events = self._decode(list(self._running.values())) if self._running else []
        while self._queue and len(self._running) < self.max_batch:
            rid, request = self._queue.popleft()
            events.append(self._admit(rid, request))
        return events

    def _admit(self, rid: int, request: Request) -> BatchEvent:
        pipe = self.pipe
        t_start = time.perf_counter()
        try:
            native = pipe.native_sequence(request)
            selection = pipe.select(request, native)
            t = time.perf_counter()
            rows, positions, state = pipe.pruned_sequence(request, native, selection)
            if len(rows) + state.max_tokens > self.capacity:
                raise PromptError(f"request needs {len(rows)} prompt + {state.max_tokens} new tokens; the batch's "
                                  f"KV capacity is {self.capacity} per request")
            handle, logits = self.decoder.join(native.embeds[rows][None].astype(np.float32), positions,
                                               extras=native.extras_of(rows))
            pipe._verified()  # no answer leaves before the background file check has passed (first request)
        except Exception as exc:  # noqa: BLE001 - the request fails alone; the batch goes on
            return BatchEvent(rid, error=exc)
        times = dict.fromkeys(TIMING_KEYS, 0.0)
        for stage in (native, selection):
            times.update(stage.timings)
        sampler = Sampler(request.sampling)
        run = _Running(rid, handle, request, native, selection, len(rows), state, sampler,
                       StreamDecoder(pipe.encoder), times, t_start, 0.0)
        self._running[rid] = run
        token = sampler(logits)
        run.times["prefill"] = time.perf_counter() - t
        run.t_decode = time.perf_counter()
        return self._after_token(run, token)

    def _decode(self, runs: list[_Running]) -> list[BatchEvent]:
        pipe, fam = self.pipe, self.pipe.family_runtime
        ids = np.array([r.tokens[-1] for r in runs], dtype=np.int64)
        embeds = pipe.sessions["embed"].run(["inputs_embeds"], {"input_ids": ids[:, None]})[0][:, 0]  # [b, d]
        feeds = {}
        for r, e in zip(runs, embeds):
            pos = np.asarray(fam.decode_position(r.state.native, r.state.pruned, r.state.step), dtype=np.int64)
            feeds[r.handle] = (e.astype(np.float32), pos)
        logits = self.decoder.step(feeds)
        events = []
        for r in runs:
            r.state.step += 1
            events.append(self._after_token(r, r.sampler(logits[r.handle])))
        return events

    def _after_token(self, run: _Running, token: int) -> BatchEvent:
        """Pipeline._generate's rule: stop on a stop id (kept in token_ids, not in the text), else emit the piece,
        stop at max_tokens."""
        run.tokens.append(int(token))
        finish = None
        piece = ""
        if token in run.request.stop_ids:
            finish = "eos"
        else:
            piece = run.stream.push(token)
            if len(run.tokens) >= run.state.max_tokens:
                finish = run.state.limit
        if finish is None:
            return BatchEvent(run.rid, piece)
        piece += run.stream.flush()
        del self._running[run.rid]
        self.decoder.leave(run.handle)
        now = time.perf_counter()
        run.times["decode"] = now - run.t_decode
        run.times["total"] = now - run.t_start
        result = self.pipe.result(run.request, run.native, run.selection, run.stream.emitted, run.tokens, run.times,
                                  run.rows, finish)
        return BatchEvent(run.rid, piece, result)
