"""WorkerPool with stand-in pipelines: admission bound, one pipeline per running job, per-token cancel."""

from __future__ import annotations

import asyncio
import threading

import pytest

from coverpruner.serving.workers import Job, QueueFull, WorkerPool


class _Stream:
    def __init__(self, owner, n):
        self.owner, self.n, self.result = owner, n, None

    def __iter__(self):
        assert not self.owner.busy, "a pipeline ran two requests at once"
        self.owner.busy = True
        try:
            for i in range(self.n):
                self.owner.pulled += 1
                self.owner.gate.acquire()  # each token waits until the test lets one through
                yield f"t{i} "
            self.result = f"done by {self.owner.name}"
        finally:
            self.owner.busy = False


class _FakePipeline:
    def __init__(self, name):
        self.name, self.pulled, self.gate, self.busy = name, 0, threading.Semaphore(0), False

    def stream(self, image, prompt, max_new_tokens=4):
        return _Stream(self, max_new_tokens)


async def _drain(job):
    events = []
    while True:
        kind, value = await job.events.get()
        events.append((kind, value))
        if kind != "piece":
            return events


def test_admission_bound_and_results():
    async def main():
        pipes = [_FakePipeline("a"), _FakePipeline("b")]
        pool = WorkerPool(pipes, max_queue=1)
        loop = asyncio.get_running_loop()
        jobs = [Job(None, "q", {"max_new_tokens": 3}, loop) for _ in range(3)]
        for job in jobs:
            pool.submit(job)
        with pytest.raises(QueueFull):  # 2 workers + 1 queued admitted; the 4th is refused at once
            pool.submit(Job(None, "q", {}, loop))
        for p in pipes:
            p.gate.release(100)
        results = [await _drain(j) for j in jobs]
        pool.shutdown()
        return results, pool

    results, pool = asyncio.run(main())
    for events in results:
        assert [e[1] for e in events[:-1]] == ["t0 ", "t1 ", "t2 "]
        assert events[-1][0] == "done" and events[-1][1].startswith("done by ")
    assert pool.admitted == 0 and pool.running == 0


def test_cancel_stops_after_the_current_token():
    async def main():
        pipe = _FakePipeline("a")
        pool = WorkerPool([pipe], max_queue=0)
        job = Job(None, "q", {"max_new_tokens": 1000}, asyncio.get_running_loop())
        pool.submit(job)
        pipe.gate.release()  # one token
        first = await job.events.get()
        job.cancel()
        pipe.gate.release()  # let the worker pull the next token; it must stop there
        rest = await _drain(job)
        pool.shutdown()
        return first, rest, pipe.pulled

    first, rest, pulled = asyncio.run(main())
    assert first == ("piece", "t0 ")
    assert rest == [("cancelled", None)]  # the token pulled after the cancel is not sent
    assert pulled == 2  # and no further token was generated
