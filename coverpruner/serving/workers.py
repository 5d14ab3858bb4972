"""The server's one engine driver: N worker threads, each driving its own engine loop (runtime/engine.py) of
``max_batch`` slots, behind one bounded queue (``coverpruner-serve --workers N --max-batch B``; B = 1 is the same
driver over an engine of one slot, any decoder form).

Every worker thread owns one Pipeline's engine (``Pipeline.engine``: its KV slots, prefix cache and admission
worker). A worker takes jobs from the shared queue while its engine holds fewer than ``max_batch`` requests and
submits each job's runtime Request (built once by the app) as it is; every loop turn is one engine step: the
scheduler's plan (running decodes first, then prefill chunks of requests whose inputs are ready, under the step's
token budget) in one batched decoder call, while the admission worker prepares the next requests (vision, probe,
selection) beside it. ``submit`` admits a request only while fewer than ``workers * max_batch + max_queue`` are
admitted, so a full server answers 503 at once instead of letting latency grow without bound. A request's events
(``serving.choices.Piece`` / ``Finished``, then its end) reach the event loop through an asyncio queue;
``cancel()`` (a client that went away, the deadline) drops it from its engine before the next step, in whichever
stage it is (waiting, being prepared, prefilling or decoding).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading

from coverpruner.runtime.errors import CoverPrunerError
from coverpruner.serving.choices import Finished, Piece

log = logging.getLogger("coverpruner.serving")

#: how long an idle worker waits for a job, and how long a step waits for an admission to finish, before it looks
#: at cancellations again (seconds)
_POLL_S = 0.05


class QueueFull(Exception):
    """Raised by submit when workers * max_batch + max_queue requests are already admitted."""


class Job:
    """One admitted request: its runtime Request (runtime.stages.Request, with its n answers and logprob setting).
    Events on ``events``: ("piece", Piece), ("finish", Finished: one of n answers ended, others go on), ("done",
    Finished: the last answer), ("error", exception) or ("cancelled", None) — done / error / cancelled always end
    the job — and ("timeout", None) from ``expire``, put by the event loop itself so the handler answers without
    waiting for the worker."""

    def __init__(self, request, loop: asyncio.AbstractEventLoop):
        self.request = request  # dropped once submitted: the engine holds it (and its images) while it needs them
        self.n = self.left = request.n
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self._cancel = threading.Event()
        self.timed_out = False

    def cancel(self) -> None:
        self._cancel.set()

    def expire(self) -> None:
        """The request's deadline passed (call in the event loop): its worker drops it before the next step (or
        never starts it), and the handler wakes at once."""
        self.timed_out = True
        self.cancel()
        self.events.put_nowait(("timeout", None))

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def deliver(self, event) -> tuple[str, object] | None:
        """One runtime.engine.EngineEvent of this job: its piece and an answer that ends while others go on
        ("finish") are emitted here; the job's end is returned for the pool to emit: ("done", Finished) after the
        last answer, ("error", exception); None otherwise."""
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
    """engines: one runtime engine loop per worker thread (``Pipeline.engine``), each of ``max_batch`` slots;
    max_queue: admitted requests that may wait for a slot. on_finish(job, outcome) is called in the worker when a
    job ends ("done", "error", "cancelled")."""

    def __init__(self, engines: list, max_queue: int, on_finish=None):
        if not engines:
            raise ValueError("WorkerPool needs at least one engine")
        self.workers, self.max_batch, self.max_queue = len(engines), engines[0].max_batch, max_queue
        self._jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self.admitted = 0
        self.running = 0
        self._on_finish = on_finish
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(e,), daemon=True, name=f"coverpruner-worker-{i}")
                         for i, e in enumerate(engines)]
        for t in self._threads:
            t.start()

    @property
    def queued(self) -> int:
        return self.admitted - self.running

    def submit(self, job: Job) -> None:
        with self._lock:
            if self.admitted >= self.workers * self.max_batch + self.max_queue:
                raise QueueFull(f"{self.admitted} requests in progress or queued ({self.workers} workers x batch "
                                f"{self.max_batch}, queue {self.max_queue})")
            self.admitted += 1
        self._jobs.put(job)

    def _end(self, job: Job, outcome: str, value=None, counted: bool = True) -> None:
        with self._lock:  # counted out before the client hears of it: its answer means its slot is free
            self.running -= int(counted)
            self.admitted -= 1
        job.emit({"done": "done", "error": "error"}.get(outcome, "cancelled"), value)
        if self._on_finish is not None:
            self._on_finish(job, outcome)

    def _take(self, engine, jobs: dict) -> None:
        """Submit queued jobs while the engine has room (a job takes its n slots); wait for one only when the engine
        has nothing at all to do."""
        while sum(j.n for j in jobs.values()) < self.max_batch:
            try:
                job = self._jobs.get(timeout=_POLL_S) if not jobs else self._jobs.get_nowait()
            except queue.Empty:
                return
            if job.cancelled:  # gave up while queued
                self._end(job, "cancelled", counted=False)
                continue
            try:
                rid = engine.submit(job.request)
            except CoverPrunerError as exc:
                self._end(job, "error", exc, counted=False)
                continue
            finally:
                job.request = None
            with self._lock:
                self.running += 1
            jobs[rid] = job

    def _loop(self, engine) -> None:
        try:
            self._drive(engine)
        finally:
            engine.close()  # its admission worker, from the thread that drives it

    def _drive(self, engine) -> None:
        jobs: dict[int, object] = {}  # request id -> job, for the requests in this worker's engine
        while not self._stop.is_set():
            self._take(engine, jobs)
            for rid, job in list(jobs.items()):
                if job.cancelled and engine.cancel(rid):
                    self._end(jobs.pop(rid), "cancelled")
            if not jobs:
                continue
            try:
                events = engine.step(wait=_POLL_S)
            except Exception as exc:  # a fault of the shared step (the decoder call) fails every request in it
                log.exception("engine step failed")
                for rid, job in list(jobs.items()):
                    engine.cancel(rid)
                    self._end(jobs.pop(rid), "error", exc)
                continue
            for event in events:
                job = jobs.get(event.request_id)
                if job is None:  # ended already (an error of another of its answers)
                    continue
                end = job.deliver(event)
                if end is None:
                    continue
                if end[0] == "error":
                    if not isinstance(end[1], CoverPrunerError):
                        log.error("generation failed: %s", end[1])
                    engine.cancel(event.request_id)  # its other answers, if any
                self._end(jobs.pop(event.request_id), *end)

    def shutdown(self) -> None:
        self._stop.set()
