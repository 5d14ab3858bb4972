"""N pipelines behind a bounded queue, each generation in a worker thread, cancellable per token
(``coverpruner-serve --max-batch 1``, and every standard-form dir).

Every worker thread owns one ``Pipeline`` (its KV-cache buffers and prefix cache are per instance) and runs
Pipeline.stream / chat_stream: the engine loop (runtime/engine.py) with one request. ``submit`` admits a
request only while fewer than ``workers + max_queue`` are admitted, so a full server answers 503 at
once instead of letting latency grow without bound. A request's events (text pieces, then the
GenerationResult or an error) reach the event loop through an asyncio queue; ``cancel()`` (a client
that went away, a stop string) makes the worker stop pulling tokens after the current one and free
its pipeline.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

from coverpruner.runtime.errors import CoverPrunerError

log = logging.getLogger("coverpruner.serving")


class QueueFull(Exception):
    """Raised by submit when workers + max_queue requests are already admitted."""


class Job:
    """One admitted request. Events on ``events``: ("piece", str or serving.choices.Piece), ("finish",
    serving.choices.Finished: one of n answers ended, others go on), ("done", GenerationResult or Finished: the
    last answer), ("error", exception) or ("cancelled", None) — done / error / cancelled always end the job —
    and ("timeout", None) from ``expire``, put by the event loop itself so the handler answers without waiting
    for the worker. n: answers (forked in the engine loop); top_logprobs: None or 0..20 (per-token logprobs)."""

    def __init__(self, image, prompt: str | None, options: dict, loop: asyncio.AbstractEventLoop, messages=None,
                 n: int = 1, top_logprobs: int | None = None):
        # messages: a conversation for Pipeline.chat_stream; else image + prompt for Pipeline.stream
        self.image, self.prompt, self.options, self.messages = image, prompt, options, messages
        self.n, self.top_logprobs, self.left = n, top_logprobs, n
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self._cancel = threading.Event()
        self.timed_out = False

    def cancel(self) -> None:
        self._cancel.set()

    def expire(self) -> None:
        """The request's deadline passed (call in the event loop): the worker stops after its current token
        (or never starts), and the handler wakes at once."""
        self.timed_out = True
        self.cancel()
        self.events.put_nowait(("timeout", None))

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def detailed(self) -> bool:
        """Whether the job needs the engine loop's events (n answers or logprobs), not a plain text stream."""
        return self.n > 1 or self.top_logprobs is not None

    def request(self, pipe):
        """The job's runtime Request on ``pipe`` (a conversation, or image + prompt); CoverPrunerError if bad."""
        return (pipe.chat_request(self.messages, **self.options) if self.messages is not None
                else pipe.request(self.image, self.prompt, **self.options))

    def deliver(self, event) -> tuple[str, object] | None:
        """One runtime.engine.EngineEvent of this job: its piece (a serving.choices.Piece) and an answer that
        ends while others go on ("finish") are emitted here; the job's end is returned for the pool to emit:
        ("done", Finished) after the last answer, ("error", exception); None otherwise."""
        from coverpruner.serving.choices import Finished, Piece

        if event.piece or event.logprob is not None:
            self.emit("piece", Piece(event.piece, event.index, event.logprob))
        if event.error is not None:
            return "error", event.error
        if event.result is None:
            return None
        self.left -= 1
        if self.left:
            self.emit("finish", Finished(event.index, event.result))
            return None
        return "done", Finished(event.index, event.result)

    def emit(self, kind: str, value) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is gone (server shutting down)
            self.cancel()


class WorkerPool:
    """pipelines: one Pipeline per worker thread; max_queue: admitted requests that may wait."""

    def __init__(self, pipelines: list, max_queue: int, on_finish=None):
        if not pipelines:
            raise ValueError("WorkerPool needs at least one pipeline")
        self.workers = len(pipelines)
        self.max_queue = max_queue
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for p in pipelines:
            self._free.put(p)
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="coverpruner-worker")
        self._lock = threading.Lock()
        self.admitted = 0
        self.running = 0
        self._on_finish = on_finish  # called in the worker with (job, outcome) when a job ends
        self._ids = itertools.count()

    @property
    def queued(self) -> int:
        return self.admitted - self.running

    def submit(self, job: Job) -> None:
        with self._lock:
            if self.admitted >= self.workers + self.max_queue:
                raise QueueFull(f"{self.admitted} requests in progress or queued "
                                f"({self.workers} workers, queue {self.max_queue})")
            self.admitted += 1
        self._executor.submit(self._work, job)

    def _work(self, job: Job) -> None:
        pipe = self._free.get()
        with self._lock:
            self.running += 1
        outcome = "cancelled"
        pieces = None
        try:
            if job.cancelled:  # gave up while queued
                return
            if job.detailed:
                outcome = self._engine(pipe, job)
                return
            stream = (pipe.chat_stream(job.messages, **job.options) if job.messages is not None
                      else pipe.stream(job.image, job.prompt, **job.options))
            pieces = iter(stream)
            for piece in pieces:
                if job.cancelled:
                    break
                job.emit("piece", piece)
            else:
                outcome = "done"
                job.emit("done", stream.result)
        except Exception as exc:  # CoverPrunerError for bad input; anything else is a server error
            outcome = "error"
            if not isinstance(exc, CoverPrunerError):
                log.exception("generation failed")
            job.emit("error", exc)
        finally:
            if pieces is not None:
                pieces.close()
            if outcome == "cancelled":
                job.emit("cancelled", None)
            self._free.put(pipe)
            with self._lock:
                self.running -= 1
                self.admitted -= 1
            if self._on_finish is not None:
                self._on_finish(job, outcome)

    @staticmethod
    def _engine(pipe, job: Job) -> str:
        """A job with logprobs (n is 1 here: n <= the server's max batch) through the engine loop's events,
        which carry them -> its outcome ("done", "error"; "cancelled" emits nothing)."""
        from coverpruner.runtime.engine import Engine

        engine = Engine.for_pipeline(pipe)
        rid = engine.submit(job.request(pipe), job.n, job.top_logprobs)
        while engine.pending:
            if job.cancelled:
                engine.cancel(rid)
                return "cancelled"
            for event in engine.step():
                end = job.deliver(event)
                if end is not None:
                    if end[0] == "error":
                        raise end[1]
                    job.emit(*end)
                    return "done"
        return "cancelled"  # unreachable: every request ends in an event

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

