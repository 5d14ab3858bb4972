"""WorkerPool, the server's one engine driver, with stand-in engines: the admission bound, every request of a
worker submitted to its engine as it is, and a cancel that drops a request between two steps."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from coverpruner.runtime.engine import EngineEvent
from coverpruner.serving.workers import Job, QueueFull, WorkerPool


class _Engine:
    """An engine of ``max_batch`` slots whose every step gives each request one token, once the test lets it."""

    def __init__(self, name, max_batch=1):
        self.name, self.max_batch = name, max_batch
        self.requests, self.steps, self.gate, self.next = {}, 0, threading.Semaphore(0), 0
        self.closed = False

    def submit(self, request):
        assert len(self.requests) < self.max_batch, "the driver overfilled its engine"
        rid, self.next = self.next, self.next + 1
        self.requests[rid] = [request, 0]
        return rid

    def cancel(self, rid):
        return self.requests.pop(rid, None) is not None

    def step(self, wait=0.0):
        if not self.gate.acquire(timeout=wait or 0.01):
            return []
        self.steps += 1
        events = []
        for rid, entry in list(self.requests.items()):
            request, done = entry
            entry[1] += 1
            if entry[1] == request.tokens:
                del self.requests[rid]
                events.append(EngineEvent(rid, f"t{done} ", result=f"done by {self.name}"))
            else:
                events.append(EngineEvent(rid, f"t{done} "))
        return events

    def close(self):
        self.closed = True


def _request(tokens):
    return SimpleNamespace(n=1, tokens=tokens)


async def _drain(job):
    events = []
    while True:
        kind, value = await job.events.get()
        events.append((kind, value))
        if kind != "piece":
            return events


def test_admission_bound_and_results():
    async def main():
        engines = [_Engine("a"), _Engine("b")]
        pool = WorkerPool(engines, max_queue=1)
        loop = asyncio.get_running_loop()
        jobs = [Job(_request(3), loop) for _ in range(3)]
        for job in jobs:
            pool.submit(job)
        with pytest.raises(QueueFull):  # 2 workers x batch 1 + 1 queued admitted; the 4th is refused at once
            pool.submit(Job(_request(3), loop))
        for e in engines:
            e.gate.release(100)
        results = [await _drain(j) for j in jobs]
        pool.shutdown()
        return results, pool, engines

    results, pool, engines = asyncio.run(main())
    for events in results:
        assert [e[1].text for e in events[:-1]] == ["t0 ", "t1 ", "t2 "]
        assert events[-1][0] == "done" and events[-1][1].result.startswith("done by ")
    assert pool.admitted == 0 and pool.running == 0


def test_cancel_drops_the_request_before_the_next_step():
    async def main():
        engine = _Engine("a", max_batch=2)
        pool = WorkerPool([engine], max_queue=0)
        loop = asyncio.get_running_loop()
        job, other = Job(_request(1000), loop), Job(_request(3), loop)
        pool.submit(job)
        pool.submit(other)
        engine.gate.release()  # one step: a token each
        first = await job.events.get()
        job.cancel()
        rest = await _drain(job)
        steps = engine.steps
        engine.gate.release(10)  # the other request goes on alone
        done = await _drain(other)
        pool.shutdown()
        return first, rest, steps, done, engine

    first, rest, steps, done, engine = asyncio.run(main())
    assert first[0] == "piece" and first[1].text == "t0 "
    assert rest == [("cancelled", None)] and steps == 1  # dropped before any further step
    assert [e[0] for e in done] == ["piece", "piece", "piece", "done"]
