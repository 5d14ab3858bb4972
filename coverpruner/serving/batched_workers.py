"""Worker threads that decode their requests together (``coverpruner-serve --max-batch B``).

Each worker thread owns one Pipeline and one engine loop of ``max_batch`` slots (runtime.batching.BatchGenerator,
i.e. runtime/engine.py over a BatchDecoder): it takes jobs from the shared queue while it has free slots, and
every loop turn is one engine step: the jobs taken since the last turn are admitted (their stages, the longest
pruned prefix in the pipeline's prefix cache restored into their slots, their prefills) and every job advances
one token in one batched decoder call; a job leaves at EOS, length or cancel, and a finished one leaves its
prefix in the cache for the conversation's next turn (--prefix-cache-mb holds for every --max-batch). Same
interface as workers.WorkerPool (submit / admitted / running / queued / shutdown; Job events unchanged), admitting at most
``workers * max_batch + max_queue`` requests before QueueFull (503).
"""

from __future__ import annotations

import logging
import queue
import threading

from coverpruner.runtime.batching import BatchGenerator
from coverpruner.runtime.errors import CoverPrunerError
from coverpruner.serving.workers import Job, QueueFull

log = logging.getLogger("coverpruner.serving")


class BatchedWorkerPool:
    """pipelines: one per worker thread (ORT-form engine dirs); max_batch: requests one worker decodes at once;
    capacity: KV tokens per request; max_queue: admitted requests that may wait for a slot."""

    def __init__(self, pipelines: list, max_batch: int, max_queue: int, capacity: int | None = None,
                 on_finish=None):
        if not pipelines:
            raise ValueError("BatchedWorkerPool needs at least one pipeline")
        self.workers, self.max_batch, self.max_queue = len(pipelines), max_batch, max_queue
        # built here, in the caller's thread, so a dir that cannot batch fails at start-up in one line
        self._batches = [BatchGenerator(p, max_batch, capacity) for p in pipelines]
        self._jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self.admitted = 0
        self.running = 0
        self._on_finish = on_finish
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(b,), daemon=True,
                                          name=f"coverpruner-batch-{i}") for i, b in enumerate(self._batches)]
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
        job.emit({"done": "done", "error": "error"}.get(outcome, "cancelled"), value)
        with self._lock:
            self.running -= int(counted)
            self.admitted -= 1
        if self._on_finish is not None:
            self._on_finish(job, outcome)

    def _loop(self, batch: BatchGenerator) -> None:
        jobs: dict[int, Job] = {}  # request id -> job, for the requests in this worker's batch
        while not self._stop.is_set():
            while len(jobs) < self.max_batch:  # fill free slots; wait only when there is nothing to decode
                try:
                    job = self._jobs.get(timeout=0.1) if not jobs else self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job.cancelled:  # gave up while queued
                    self._end(job, "cancelled", counted=False)
                    continue
                try:  # a conversation (the server's requests) or image + prompt; n answers share its prefill
                    rid = batch.submit(job.request(batch.pipe), job.n, job.top_logprobs)
                except CoverPrunerError as exc:
                    self._end(job, "error", exc, counted=False)
                    continue
                with self._lock:
                    self.running += 1
                jobs[rid] = job
            for rid, job in list(jobs.items()):
                if job.cancelled and batch.cancel(rid):
                    self._end(jobs.pop(rid), "cancelled")
            if not jobs:
                continue
            try:
                events = batch.step()
            except Exception as exc:  # a fault of the shared step fails every request in it
                log.exception("batched decode step failed")
                for rid, job in list(jobs.items()):
                    batch.cancel(rid)
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
                    batch.cancel(event.request_id)  # its other answers, if any
                self._end(jobs.pop(event.request_id), *end)

    def shutdown(self) -> None:
        self._stop.set()
