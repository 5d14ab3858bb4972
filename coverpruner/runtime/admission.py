"""Admission beside decoding: the input stages of waiting requests (native sequence, vision, probe, selection:
runtime/inputs.py ``InputProcessor.prepare``) run on a worker thread of their own while the engine loop keeps
stepping the running requests (runtime/engine.py); a request enters the scheduler's plan once its kept rows are
ready. ONNX Runtime releases the GIL inside its runs, so the vision tower and the decoder run at the same time,
each on its own intra-op threads (runtime/model.py: the decode and the admission graphs have separate pools).

    admission = Admission(inputs, capacity, threaded=True)
    admission.submit(job)            # job: .request, .cancelled; gets .prepared or .error
    for job in admission.collect(limit, wait):   # the jobs whose stages ended (cancelled ones are dropped)
        ...

With ``stage`` (the engine's, for a batch of slots), the worker then also prefills the request's rows but the last
into a slot of its own beside the steps (runtime/engine.py ``Engine._stage``): on a CPU, ONNX Runtime's attention
takes a prompt's rows after a cached prefix only one request per call, so a prefill cannot share the decode step's
call, and a second call per step reads every weight again; a prefill on its own thread overlaps the decode steps
instead (compute-bound beside memory-bound), and the request joins the steps for its last row.

Sharing the cores in turns (``share``: Model.load's admission_share, a server's CPU provider): a decode step at
these widths needs every core (it reads all the weights; one core of two doubles its time), and so does an
admission that must not take twice its idle time. So while streams decode and an admission is under way, the two
take turns instead of splitting the cores: every thread of the admission (this worker, the admission graphs'
ONNX Runtime threads, and a staging session of the decoder graph with threads of its own) runs at the lowest
priority (Linux's SCHED_IDLE), so a decode step runs at its full pace beside them, and after each step the engine
sleeps for what remains of 1 / (1 - share) steps at the streams' own pace (runtime/engine.py ``_pace_step``),
leaving the cores to the admission. The streams' gaps grow to about 1 / (1 - share) of their pace, the admission's
time to about 1 / share of its idle time (measured: docs/performance.md, "Taking turns on the cores"). The
staging session costs a second copy of the decoder's weights in memory.

A cancelled job (``job.cancelled`` set by Engine.cancel) is dropped before its stages start and at every stage
boundary (between images, video chunks and prefill chunks too): ``check`` raises ``Cancelled`` there.
``threaded=False`` runs the stages in the caller's thread when ``collect`` asks for jobs (at most ``limit``): the
library's synchronous calls (Pipeline.generate, batch_generate), which have nothing to overlap them with.
"""

from __future__ import annotations

import queue
import threading
from collections import deque

from coverpruner.engines.ort import lower_thread_priority
from coverpruner.runtime.inputs import InputProcessor


#: the share of the cores an admission gets while streams decode, on a server's CPU provider (coverpruner-serve
#: --admission-share): the streams' gaps grow to ~1 / (1 - share) of a step, the admission to ~1 / share of its
#: idle time (measured 2.35-2.54x and 1.80-1.83x: docs/performance.md, "Taking turns on the cores")
DEFAULT_ADMISSION_SHARE = 0.5


class Cancelled(Exception):
    """The request was cancelled while its inputs were prepared (never reaches a caller)."""


class Admission:
    """Prepares submitted jobs (see the module docstring); capacity: the KV tokens a batch slot holds (None: any)."""

    def __init__(self, inputs: InputProcessor, capacity: int | None = None, threaded: bool = False, stage=None,
                 low_priority: bool = False):
        self.inputs, self.capacity, self.threaded = inputs, capacity, threaded
        self.low_priority = low_priority  # the worker thread at the lowest priority (it shares the cores in turns)
        self.stage = stage if threaded else None  # stage(job, check): the prefill beside the steps
        self._waiting: deque = deque()  # inline: jobs not started
        self._done: queue.SimpleQueue = queue.SimpleQueue()  # threaded: jobs whose stages ended
        self._todo: queue.SimpleQueue = queue.SimpleQueue()  # threaded: jobs to prepare (None: stop)
        self._lock = threading.Lock()
        self._busy = 0  # threaded: jobs submitted and not collected
        self._thread = None
        if threaded:
            self._thread = threading.Thread(target=self._work, daemon=True, name="coverpruner-admission")
            self._thread.start()

    @property
    def pending(self) -> int:
        """Jobs submitted whose stages have not been collected yet."""
        return len(self._waiting) if not self.threaded else self._busy

    def submit(self, job) -> None:
        if not self.threaded:
            self._waiting.append(job)
            return
        with self._lock:
            self._busy += 1
        self._todo.put(job)

    def collect(self, limit: int, wait: float = 0.0) -> list:
        """The jobs whose stages ended since the last call (``.prepared`` or ``.error`` set, or cancelled meanwhile:
        the caller undoes what they hold). Threaded: waits up to ``wait`` seconds for the first when none has ended
        (``limit`` is the worker's business: it prepares every job in turn). Inline: prepares up to ``limit``
        waiting jobs now."""
        out = []
        if not self.threaded:
            while self._waiting and len(out) < limit:
                job = self._waiting.popleft()
                if not job.cancelled:
                    self._prepare(job)
                    out.append(job)
            return out
        try:
            job = self._done.get(timeout=wait) if wait > 0 else self._done.get_nowait()
            while True:
                out.append(job)
                job = self._done.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            self._busy -= len(out)
        return out

    def close(self) -> None:
        """Stop the worker (after the job it is preparing)."""
        if self._thread is not None:
            self._todo.put(None)

    def _prepare(self, job) -> None:
        def check() -> None:
            if job.cancelled:
                raise Cancelled()

        try:
            job.prepared = self.inputs.prepare(job.request, self.capacity, check)
            if self.stage is not None:
                self.stage(job, check)
        except Cancelled:
            pass
        except Exception as exc:  # noqa: BLE001 - the request fails alone (its error event, from the engine)
            job.error = exc

    def _work(self) -> None:
        if self.low_priority:
            lower_thread_priority()
        while True:
            job = self._todo.get()
            if job is None:
                return
            if not job.cancelled:
                self._prepare(job)
            self._done.put(job)
            del job  # not kept while waiting for the next one: a request holds its images
