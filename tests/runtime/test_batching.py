"""The engine loop over a batch of slots (runtime/engine.py over engines.ort_form_decoder.BatchDecoder) answers as
batch 1, whatever the scheduler does.

Requests of different prompts, budgets and lengths join a batch of 3 slots (more requests than slots, so some
wait and join when others leave) and their greedy tokens must equal Pipeline.generate's, one request at a time,
on the same ORT-form engine dir: with the whole prefill in one step, and with prefills cut into chunks of a few
rows across steps beside the others' decodes (LLaVA's compact positions and Qwen2.5-VL's M-RoPE rows). The
reference is the batch-1 path of the same pipeline (itself checked against the HF models in tests/matrix/; the
chunked decoder calls themselves against transformers in tests/export/test_ortform_decoder.py): the claim here is
that batching and scheduling change nothing. Then the loop's own rules: a stop string ends an answer and frees its
slot at once, a request whose own processing fails fails alone, admission runs beside the decode steps and a
cancel reaches it there, and a conversation finds the prompt blocks a concurrent one with the same prefix stored.
"""

from __future__ import annotations

import pytest

import threading

from coverpruner.runtime import OptionError, Pipeline
from coverpruner.runtime.batching import BatchGenerator
from tests.stops import stop_at

pytestmark = pytest.mark.slow

PRESETS = ("tiny", "qwen2.5-vl-tiny")
JOBS = [dict(prompt="Describe the image.", budget=16, max_new_tokens=12),
        dict(prompt="What color is the sky?", budget="full", max_new_tokens=5),
        dict(prompt="Count the objects please.", budget=8, max_new_tokens=9, method="divprune"),
        dict(prompt="Is there text?", budget=4, max_new_tokens=1),
        dict(prompt="Where is it?", budget=16, max_new_tokens=7, ignore_eos=True)]


@pytest.fixture(scope="module", params=PRESETS)
def ort_pipe(request, builds):
    return Pipeline.load(builds.export(request.param, "ort"), threads=1)


@pytest.fixture(scope="module")
def batch_1(ort_pipe, demo_image):
    """JOBS answered one at a time (the pipeline's own engine of one slot)."""
    return [ort_pipe.generate(demo_image, **j) for j in JOBS]


def _same(got, want):
    assert got.token_ids == want.token_ids and got.text == want.text and got.finish_reason == want.finish_reason
    assert got.kept_indices.tolist() == want.kept_indices.tolist() and got.prefill_tokens == want.prefill_tokens


def test_batched_greedy_answers_equal_batch_1(ort_pipe, demo_image, batch_1):
    jobs = [dict(image=demo_image, **j) for j in JOBS]
    for got, want in zip(ort_pipe.batch_generate(jobs, max_batch=3, capacity=512), batch_1):
        _same(got, want)


def test_chunked_prefills_beside_decodes_answer_as_batch_1(ort_pipe, demo_image, batch_1):
    """A budget of 4 rows a step with 3 slots: every prompt is prefilled in chunks of 1-4 rows across steps while
    the others decode, and the answers do not change."""
    batch = BatchGenerator(ort_pipe, max_batch=3, capacity=512, max_step_tokens=4)
    ids = [batch.submit(ort_pipe.request(demo_image, **j)) for j in JOBS]
    done, plans = {}, []
    while batch.pending:
        for event in batch.step():
            assert event.error is None
            if event.result is not None:
                done[event.request_id] = event.result
        plans.append(batch.last_plan)
    for rid, want in zip(ids, batch_1):
        _same(done[rid], want)
    assert all(p.tokens <= 4 for p in plans)
    # prefills were cut into chunks, and chunks ran in the same steps as other requests' decodes
    assert any(c.rows > 1 and not c.final for p in plans for c in p.prefills)
    assert any(p.decodes and p.prefills for p in plans)


def test_cancel_leaves_the_others_unchanged(ort_pipe, demo_image):
    batch = BatchGenerator(ort_pipe, max_batch=2, capacity=512)
    reqs = [ort_pipe.request(demo_image, j["prompt"], budget=16, max_new_tokens=10, ignore_eos=True) for j in JOBS[:3]]
    ids = [batch.submit(r) for r in reqs]
    done = {}
    steps = 0
    while batch.pending:
        for e in batch.step():
            assert e.error is None
            if e.result is not None:
                done[e.request_id] = e.result
        steps += 1
        if steps == 3:
            assert batch.cancel(ids[0]) and not batch.cancel(ids[0])
    assert sorted(done) == ids[1:]
    for rid in ids[1:]:
        assert done[rid].token_ids == ort_pipe.generate(demo_image, JOBS[rid]["prompt"], budget=16, max_new_tokens=10,
                                                         ignore_eos=True).token_ids


def test_too_long_request_fails_alone(ort_pipe, demo_image):
    batch = BatchGenerator(ort_pipe, max_batch=2, capacity=64)
    bad = batch.submit(ort_pipe.request(demo_image, "Describe.", budget="full", max_new_tokens=8))
    good = batch.submit(ort_pipe.request(demo_image, "Describe.", budget=4, max_new_tokens=3))
    events = {}
    while batch.pending:
        for e in batch.step():
            if e.done:
                events[e.request_id] = e
    assert "KV capacity is 64" in str(events[bad].error) and events[good].result is not None


def test_standard_form_is_refused_in_one_line(builds):
    pipe = Pipeline.load(builds.export("tiny", "standard"), threads=1)
    with pytest.raises(OptionError, match="batched decoding needs the ORT-form decoder"):
        pipe.batch_generate([dict(image=None, prompt="x")])


def _drain(batch):
    """Step until nothing is pending -> {request id: last event}."""
    events = {}
    while batch.pending:
        for event in batch.step(wait=0.05):
            if event.done:
                events[event.request_id] = event
    return events


def test_a_stop_string_ends_the_answer_and_frees_its_slot_at_once(ort_pipe, demo_image):
    """Issue 35: a stop string completed by token 10 of a max_new_tokens 200 answer ends it at that token (the text
    stops before the string, finish_reason "stop"), and its slot is free in the step that ends it while another
    request decodes on."""
    full = ort_pipe.generate(demo_image, JOBS[0]["prompt"], budget=16, max_new_tokens=14, ignore_eos=True)
    stop, cut = stop_at(ort_pipe.encoder.decode, full.token_ids, 10)
    batch = BatchGenerator(ort_pipe, max_batch=2, capacity=512)
    rid = batch.submit(ort_pipe.request(demo_image, JOBS[0]["prompt"], budget=16, max_new_tokens=200,
                                        ignore_eos=True, stop=[stop]))
    other = batch.submit(ort_pipe.request(demo_image, JOBS[1]["prompt"], budget=8, max_new_tokens=30,
                                          ignore_eos=True))
    pieces = []
    while True:
        events = batch.step()
        pieces += [e.piece for e in events if e.request_id == rid]
        end = next((e for e in events if e.request_id == rid and e.done), None)
        if end is not None:
            break
    r = end.result
    assert (r.text, r.finish_reason, r.stop_reason, r.token_ids) == (cut, "stop", stop, full.token_ids[:10])
    assert "".join(pieces) == cut  # streamed: no part of the stop string came out
    assert len(batch.slots.decoder.active) == 1 and batch.pending == 1  # its slot is free, the other decodes on
    assert _drain(batch)[other].result.finish_reason == "length"


def test_a_request_that_fails_in_its_own_processing_fails_alone(ort_pipe, demo_image, batch_1, monkeypatch):
    """A request planted in the batch whose sampling raises at its third token (a seed the test's sampler refuses):
    it ends with its own error event; its neighbours, which share every decoder call with it, answer as batch 1."""
    from coverpruner.runtime.sampling import Sampler

    real = Sampler.__call__

    def sample(self, logits, allowed=None):
        if self.config.seed == 13 and sum(self.counts.values()) == 2:
            raise RuntimeError("planted failure")
        return real(self, logits, allowed)

    monkeypatch.setattr(Sampler, "__call__", sample)
    batch = BatchGenerator(ort_pipe, max_batch=4, capacity=512)
    ids = [batch.submit(ort_pipe.request(demo_image, **j)) for j in JOBS[:3]]
    planted = batch.submit(ort_pipe.request(demo_image, "Fail here.", budget=8, max_new_tokens=12, seed=13,
                                            ignore_eos=True))
    events = _drain(batch)
    assert str(events[planted].error) == "planted failure" and events[planted].result is None
    for rid, want in zip(ids, batch_1):
        _same(events[rid].result, want)


def _hold(pipe, prompt: str, monkeypatch, inside_call=None):
    """The request whose last text part is ``prompt`` waits inside its native sequence stage (the admission
    worker's thread) until the returned gate is set; ``inside`` is set once it is there (after ``inside_call()``)."""
    gate, inside = threading.Event(), threading.Event()
    real = pipe.inputs.native_sequence

    def held(request, check=None):
        if request.conversation.messages[0]["content"][-1]["text"] == prompt:
            if inside_call is not None:
                inside_call()
            inside.set()
            gate.wait(30)
        return real(request) if check is None else real(request, check)

    monkeypatch.setattr(pipe.inputs, "native_sequence", held)
    return gate, inside


def test_admission_runs_beside_decoding_and_a_cancel_reaches_it(ort_pipe, demo_image, batch_1, monkeypatch):
    """A threaded engine: while a newcomer's input stages are held inside its native sequence stage, the running
    request keeps getting a token every step; cancelled there, the newcomer never produces an event and the
    running answer is the batch-1 one; a later request is admitted and answered as usual."""
    gate, inside = _hold(ort_pipe, "Hold me.", monkeypatch)
    engine = ort_pipe.engine(2, 512, threaded=True)
    try:
        first = engine.submit(ort_pipe.request(demo_image, **JOBS[0]))
        while not engine._running:
            engine.step(wait=0.05)
        newcomer = engine.submit(ort_pipe.request(demo_image, "Hold me.", budget=8, max_new_tokens=4))
        assert inside.wait(30)
        tokens = []
        for _ in range(3):  # the newcomer is inside its stages: the first request decodes on
            tokens += [e for e in engine.step() if e.request_id == first]
        assert len(tokens) == 3 and engine.admission.pending == 1
        assert engine.cancel(newcomer) and not engine.cancel(newcomer)
        gate.set()
        events = _drain(engine)
        assert newcomer not in events
        _same(events[first].result, batch_1[0])
        later = engine.submit(ort_pipe.request(demo_image, **JOBS[1]))
        _same(_drain(engine)[later].result, batch_1[1])
    finally:
        gate.set()
        engine.close()


def test_a_concurrent_conversation_finds_the_first_ones_prompt_blocks(builds, demo_image):
    """Two conversations with the same system prompt and image: the second, submitted while the first is
    decoding, restores the blocks of the shared prefix the first stored when its prefill ended (cached_tokens > 0,
    whole blocks), and both answer as they do with the prefix cache off."""
    from coverpruner.runtime.prefix_cache import BLOCK_ROWS

    export = builds.export("tiny", "ort")
    cached, plain = Pipeline.load(export, threads=1, prefix_cache_mb=64), Pipeline.load(export, threads=1)

    def conversation(question):
        return [{"role": "system", "content": "You describe pictures for a museum catalogue, briefly."},
                {"role": "user", "content": [{"type": "image", "image": demo_image}, {"type": "text", "text": question}]}]

    opts = dict(budget=16, method="uniform", max_new_tokens=8, ignore_eos=True)
    engine = cached.engine(2, 512)
    a = engine.submit(cached.chat_request(conversation("What is shown?"), **opts))
    while not engine._running:  # a's prefill has ended: it decodes
        engine.step()
    b = engine.submit(cached.chat_request(conversation("Which colors?"), **opts))
    events = _drain(engine)
    ra, rb = events[a].result, events[b].result
    assert ra.cached_tokens == 0 and rb.cached_tokens > 0 and rb.cached_tokens % BLOCK_ROWS == 0
    assert rb.token_ids == plain.chat(conversation("Which colors?"), **opts).token_ids
    assert ra.token_ids == plain.chat(conversation("What is shown?"), **opts).token_ids


def test_turns_answer_as_batch_1_with_the_admission_at_the_lowest_priority(builds, demo_image, monkeypatch):
    """admission_share (a server's CPU default): the admission worker runs under SCHED_IDLE and stages in a session
    of the decoder of its own, after a step with a stream running and an admission under way the
    engine owes the admission share / (1 - share) of that step's time, and every answer is the batch-1 one."""
    import gc
    import os

    export = builds.export("tiny", "ort")
    plain, turns = Pipeline.load(export, threads=1), Pipeline.load(export, threads=1, admission_share=0.6)
    want = [plain.generate(demo_image, **j) for j in JOBS[:3]]
    policy = []  # the admission worker's scheduling policy, read on its thread
    gate, inside = _hold(turns, JOBS[1]["prompt"], monkeypatch, lambda: policy.append(os.sched_getscheduler(0)))
    engine = turns.engine(3, 512, threaded=True)
    try:
        decoder = engine.slots.decoder
        assert decoder.stage_session is not None and decoder.stage_session is not turns.model.sessions["decoder"]
        first = engine.submit(turns.request(demo_image, **JOBS[0]))
        while not engine._running:
            engine.step(wait=0.05)
        second = engine.submit(turns.request(demo_image, **JOBS[1]))
        assert inside.wait(30)
        pace = engine._pace  # the running mean of the steps before the admission began
        t = __import__("time").perf_counter()
        engine.step()
        took = __import__("time").perf_counter() - t
        # owed: what remains of 1 / (1 - 0.6) = 2.5 steps at the streams' pace after this step's own time
        assert pace > 0 and pace / 0.4 - took - 1e-3 <= engine._owed <= pace / 0.4
        full = []  # the next step pays that pause, and a full garbage pass due (5 s since the last) runs inside it
        gc.callbacks.append(lambda phase, info: full.append(phase) if info["generation"] == 2 else None)
        engine._last_gc -= 10
        try:
            engine.step()
        finally:
            gc.callbacks.pop()
        assert full == ["start", "stop"]
        if hasattr(os, "SCHED_IDLE"):
            assert policy == [os.SCHED_IDLE]
        gate.set()
        third = engine.submit(turns.request(demo_image, **JOBS[2]))
        events = _drain(engine)
    finally:
        gate.set()
        engine.close()
    for rid, w in zip((first, second, third), want):
        _same(events[rid].result, w)
    assert engine._owed == 0  # nothing under way any more: the steps run back to back


def test_turns_that_would_not_fit_in_memory_fall_back_to_side_by_side_in_one_warning(builds, monkeypatch):
    """admission_share opens a second copy of the decoder; with less memory available than both copies need, the
    load says so in one RuntimeWarning line and runs side by side (no share, no staging session); with room, the
    share stays."""
    import coverpruner.runtime.model as model_module

    export = builds.export("tiny", "ort")
    decoder = sum(f.stat().st_size for f in export.iterdir() if f.name.startswith("decoder.onnx"))
    monkeypatch.setattr(model_module, "available_memory", lambda: 2 * decoder)  # < 2.2x
    with pytest.warns(RuntimeWarning, match=r"admission_share needs a second copy of the decoder's weights .* "
                                            r"admissions run side by side") as caught:
        short = Pipeline.load(export, threads=1, admission_share=0.5)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert short.model.admission_share is None and short.model.staging_session() is None
    monkeypatch.setattr(model_module, "available_memory", lambda: 3 * decoder)
    assert Pipeline.load(export, threads=1, admission_share=0.5).model.admission_share == 0.5
