"""Engine-level probe behind docs/performance.md "Admission beside decoding: dividing two cores" (not a CI test):
3 streams decode in one threaded engine (max_batch 8, capacity 1024) while a newcomer (a fresh picture, budget full)
is admitted; round-robin idle / loaded newcomers; per stream worst gap during the admission over its normal median,
the newcomer TTFT, the stage marks (vision .. staging), and the share of the CPU that other processes used ("foreign":
rounds above ~10% are not quiet). CP_PIN picks how the cores are divided (none: the default; A: the admission thread
on the last core and the engine thread on the first; AW: also the decoder pool worker on the last core; AWs: the
admission thread on the last core only while it stages; nA: the staging thread at a lower priority, STAGE_NICE),
CP_NICE lowers the admission and decoder pool threads by that much. argv[1]: admission threads (or none).

    CP_PIN=none ROUNDS=2 nice -n -15 python benchmarks/probe_interleave_split.py none   # engine: ENG below
"""
import os
import statistics
import sys
import threading
import time
import numpy as np
from PIL import Image
import coverpruner.engines.ort as cort
import coverpruner.runtime.admission as cadm
PIN = os.environ.get("CP_PIN", "none")
if PIN in ("AW", "AWs"):
    _so = cort.session_options
    def so2(threads=None, optimization="all", spin=True):
        o = _so(threads, optimization, spin)
        if spin and threads == 2: o.add_session_config_entry("session.intra_op_thread_affinities", "2")
        return o
    cort.session_options = so2
if PIN in ("A", "AW"):
    _w = cadm.Admission._work
    def w(self):
        os.sched_setaffinity(0, {1}); return _w(self)
    cadm.Admission._work = w
from coverpruner.runtime.pipeline import Pipeline
NICE = int(os.environ.get("CP_NICE", "0"))
LOW = []  # tids to lower
def tids(): return set(int(t) for t in os.listdir('/proc/self/task'))
_ms = cort.make_session
def ms(path, provider="cpu", threads=None, optimization="all", spin=True, *a, **k):
    if os.environ.get("CP_NOSPIN") and str(path).endswith("decoder.onnx"): spin = False  # the decode steps' pool too
    before = tids(); r = _ms(path, provider, threads, optimization, spin, *a, **k); new = tids() - before
    if NICE and (str(path).endswith("decoder.onnx") or not spin): LOW.extend(new)
    return r
cort.make_session = ms
_w0 = cadm.Admission._work
def w0(self):
    if NICE: os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + NICE)
    return _w0(self)
cadm.Admission._work = w0
import coverpruner.runtime.engine as ceng, coverpruner.runtime.inputs as cinp
MARK = []
_prep = cinp.InputProcessor.prepare
def prep(self, *a, **k):
    MARK.append(("prep0", time.perf_counter())); r = _prep(self, *a, **k); MARK.append(("prep1", time.perf_counter())); return r
cinp.InputProcessor.prepare = prep
_st = ceng.Engine._stage
def st(self, *a, **k):
    MARK.append(("stage0", time.perf_counter())); r = _st(self, *a, **k); MARK.append(("stage1", time.perf_counter())); return r
ceng.Engine._stage = st
import coverpruner.engines.ort_form_decoder as cofd
STEPT = {}
def timed(cls, name):
    f = getattr(cls, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); STEPT[name] = STEPT.get(name, 0) + time.perf_counter() - t; return r
    setattr(cls, name, g)
for c, n in ((ceng.Engine, "_prefill"), (ceng.Engine, "_start_masks"), (ceng.Engine, "_take_token"), (ceng.Engine, "_start_answers"), (ceng.Engine, "_decode_feeds"), (cofd.BatchDecoder, "join_staged"), (cofd.BatchDecoder, "step"), (cadm.Admission, "collect")):
    timed(c, n)
SPIKE = float(os.environ.get("SPIKE", "0.19"))
import coverpruner.runtime.slots as cslots
for _n in ("stage_rows", "prefault_join", "stage"):
    def _mk(_f, _n):
        def g(*a, **k):
            MARK.append((_n + "0", time.perf_counter())); r = _f(*a, **k); MARK.append((_n + "1", time.perf_counter())); return r
        return g
    setattr(cslots.BatchSlots, _n, _mk(getattr(cslots.BatchSlots, _n), _n))
_step = ceng.Engine.step
SLOW = []
def step(self, wait=0.0):
    STEPT.clear(); t = time.perf_counter(); r = _step(self, wait); d = time.perf_counter() - t
    if d > 0.15 and self._running: SLOW.append((round(t, 2), round(d * 1e3), {k: round(v * 1e3) for k, v in STEPT.items()}))
    return r
ceng.Engine.step = step
if PIN == "nA":
    STAGE_NICE = int(os.environ.get("STAGE_NICE", "5"))
    _st3 = ceng.Engine._stage
    def st3(self, *a, **k):
        tid = threading.get_native_id(); base = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, base + STAGE_NICE)
        try: return _st3(self, *a, **k)
        finally: os.setpriority(os.PRIO_PROCESS, tid, base)
    ceng.Engine._stage = st3
if PIN == "AWs":
    def st2(self, *a, **k):
        os.sched_setaffinity(0, {1})
        try: return st(self, *a, **k)
        finally: os.sched_setaffinity(0, {0, 1})
    ceng.Engine._stage = st2

ENG = os.environ.get("ENGINE", "/tmp/sched35/bench/llava-1.5-7b-2l-fp32")  # bench_serve.py --interleave builds it
adm = None if sys.argv[1] == "none" else int(sys.argv[1])
SHARE = float(os.environ.get("CP_SHARE", "0")) or None  # the product's turns (CoreShare), off by default here
pipe = Pipeline.load(ENG, threads=2, admission_threads=adm, prefix_cache_mb=256, admission_share=SHARE)
eng = pipe.engine(max_batch=8, capacity=1024, threaded=True)
rng = np.random.default_rng(0)
base = Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8))
def req(img, text, budget, n):
    return pipe.chat_request([{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": text}]}],
                             max_new_tokens=n, temperature=0, budget=budget, ignore_eos=True)
def cpu_now():
    f = open('/proc/stat').readline().split()[1:]
    busy = sum(int(x) for x in f[:3]) + sum(int(x) for x in f[5:8])
    me = open('/proc/self/stat').read().rsplit(')', 1)[1].split()
    return busy, int(me[11]) + int(me[12])
def run_round(seed, loaded):
    new_img = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (480, 640, 3), dtype=np.uint8))
    times = {}
    streams = [eng.submit(req(base, f"Describe this picture in detail. ({i})", 64, 400)) for i in range(3)] if loaded else []
    for r in streams: times[r] = []
    while loaded and min(len(v) for v in times.values()) < 16:
        for ev in eng.step(0.01):
            if ev.request_id in times: times[ev.request_id].append(time.perf_counter())
    SLOW.clear(); t_send = time.perf_counter(); nid = eng.submit(req(new_img, "What is in this image?", None, 4)); first = None
    marks = {r: len(v) for r, v in times.items()}
    while True:
        for ev in eng.step(0.01):
            t = time.perf_counter()
            if ev.request_id in times: times[ev.request_id].append(t)
            elif ev.request_id == nid and first is None: first = t
        if first is not None and all(len(times[r]) - marks[r] >= 16 for r in times): break
    if not loaded:
        print("  idle marks", [(n, round(t - t_send, 2)) for n, t in MARK if t >= t_send - 0.01], "first", round(first - t_send, 2), flush=True)
    for r in streams: eng.cancel(r)
    while eng.pending: eng.step(0.01)
    out = []
    for r, ts in times.items():
        sp = list(zip(ts[:-1], ts[1:])); gaps = np.diff(ts)
        during = [g for g, (a, b) in zip(gaps, sp) if b > t_send and a < first]
        normal = [g for g, (a, b) in zip(gaps, sp) if b <= t_send or a >= first]
        med = statistics.median(normal[1:]); out.append((round(max(during) / med, 2), round(med * 1e3)))
        if loaded and r == streams[0]:
            marks = [(n, round(t - t_send, 2)) for n, t in MARK if t >= t_send - 0.01]
            worst = [(round(a - t_send, 2), round(g * 1e3)) for g, (a, b) in zip(gaps, sp) if b > t_send and a < first and g > 1.8 * med]
            print("  slow steps", [(round(a - t_send, 2), d, x) for a, d, x in SLOW if a > first - 1.0 or d > SPIKE], flush=True)
            print("  marks", marks, "first", round(first - t_send, 2), "big gaps (start, ms)", worst, flush=True)
    return first - t_send, out
print("admission_threads", adm, "pin", PIN, "nice", NICE, "share", SHARE, "low tids", len(LOW), flush=True)
for t in LOW: os.setpriority(os.PRIO_PROCESS, t, os.getpriority(os.PRIO_PROCESS, 0) + NICE)
if PIN != "none": os.sched_setaffinity(0, {0})
run_round(1, False)
for r in range(int(os.environ.get('ROUNDS', '2'))):
    for loaded in ((False, True) if r % 2 == 0 else (True, False)):
        b0, m0 = cpu_now(); t0 = time.time()
        ttft, s = run_round(100 + 2 * r + loaded, loaded)
        b1, m1 = cpu_now(); foreign = ((b1 - b0) - (m1 - m0)) / (time.time() - t0) / 100 / 2
        print("loaded" if loaded else "idle  ", f"ttft {ttft:.2f}", s, f"foreign {foreign:.0%}", flush=True)
eng.close()
