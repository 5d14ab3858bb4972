"""Continuous batching (runtime/batching.py over engines.ort_form_decoder.BatchDecoder) answers as batch 1.

Requests of different prompts, budgets and lengths join a batch of 3 slots (more requests than slots, so some
wait and join when others leave) and their greedy tokens must equal Pipeline.generate's, one request at a time,
on the same ORT-form engine dir. The reference is the batch-1 path of the same pipeline (itself checked against
the HF models in tests/matrix/): the claim here is only that batching changes nothing.
"""

from __future__ import annotations

import pytest

from coverpruner.runtime import OptionError, Pipeline

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


def test_batched_greedy_answers_equal_batch_1(ort_pipe, demo_image):
    jobs = [dict(image=demo_image, **j) for j in JOBS]
    want = [ort_pipe.generate(**j) for j in jobs]
    got = ort_pipe.batch_generate(jobs, max_batch=3, capacity=512)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.text == w.text and g.finish_reason == w.finish_reason
        assert g.kept_indices.tolist() == w.kept_indices.tolist() and g.prefill_tokens == w.prefill_tokens


def test_cancel_leaves_the_others_unchanged(ort_pipe, demo_image):
    from coverpruner.runtime.batching import BatchGenerator

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
    from coverpruner.runtime.batching import BatchGenerator

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
