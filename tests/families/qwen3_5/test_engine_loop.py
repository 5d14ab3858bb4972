"""Qwen3.5 on the v5 engine loop (runtime/engine.py) == the independent HF references: a hybrid decoder's conv and
recurrent states must follow each request through every path the loop has for a prompt, not only one-shot prefills.

- chunked prefill beside decoding (a step budget of 16 rows: a newcomer's prompt runs in chunks of a few rows while
  another request decodes; each chunk continues its slot's states, the chunk's last row rides the decode call);
- staged admission (a threaded engine: the admission worker prefills the rows but the last into the staging slot,
  whose states move with it when it joins the active slots);
- a second conversation turn on a batched engine restored from the prefix cache: the first turn's snapshot (KV rows
  + states) taken at its turn boundary, where the scheduler ended a chunk.
Every answer's tokens and kept indices equal tests/families/qwen3_5/hf_reference.py's (HF's own modules, the
literal selector, its own gather and greedy loop) or tests/conversations/reference.py's for the conversation.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.families.qwen3_5.test_pipeline import NEW, PROMPT, SHAPES, _reference, _three_turns

pytestmark = pytest.mark.slow
BUDGETS = [32, "full", 8]


@pytest.fixture(scope="module")
def cached_pipe(qwen35_export_ort):
    from coverpruner.runtime.pipeline import Pipeline

    return Pipeline.load(qwen35_export_ort, threads=1, prefix_cache_mb=64)


@pytest.fixture(scope="module")
def wants(builds, qwen35_hf, qwen35_checkpoint):
    """Per shape: (image, HF reference tokens, kept indices) at its budget in BUDGETS."""
    from tests.families.qwen3_5 import hf_reference as ref

    eos = set(qwen35_hf.generation_config.eos_token_id)
    out = []
    for shape, budget in zip(SHAPES, BUDGETS):
        image, req, _ = _reference(builds, qwen35_hf, qwen35_checkpoint, shape)
        keep = ref.select(qwen35_hf, req, "coverpruner", None if budget == "full" else budget)
        out.append((image, ref.pruned_generate(qwen35_hf, req, keep, NEW, eos), np.sort(keep).tolist()))
    return out


def _drain(engine, plans: list | None = None) -> dict:
    """Step until every request ended -> {request id: GenerationResult}; any error event fails the test."""
    results = {}
    while engine.pending:
        for event in engine.step(wait=0.05):
            assert event.error is None, event.error
            if event.result is not None:
                results[event.request_id] = event.result
        if plans is not None:
            plans.append(engine.last_plan)
    return results


def _check(result, want) -> None:
    _, tokens, keep = want
    assert result.token_ids == tokens
    assert result.images[0].kept_indices.tolist() == keep


def test_chunked_prefill_beside_decoding_equals_reference(cached_pipe, wants):
    engine = cached_pipe.engine(3, 512, max_step_tokens=16)
    requests = [cached_pipe.request(image, PROMPT, budget=budget, max_new_tokens=NEW)
                for (image, _, _), budget in zip(wants, BUDGETS)]
    first = engine.submit(requests[0])
    while not engine._running:
        engine.step()
    ids = [first] + [engine.submit(r) for r in requests[1:]]
    plans = []
    results = _drain(engine, plans)
    # the newcomers prefilled in chunks of a few rows while the first request decoded
    beside = [p for p in plans if p.decodes and any(c.rows < c.total - c.start for c in p.prefills)]
    assert beside
    for rid, want in zip(ids, wants):
        _check(results[rid], want)


def test_staged_admission_equals_reference(cached_pipe, wants):
    engine = cached_pipe.engine(3, 512, threaded=True)
    try:
        ids = [engine.submit(cached_pipe.request(image, PROMPT, budget=budget, max_new_tokens=NEW))
               for (image, _, _), budget in zip(wants, BUDGETS)]
        results = _drain(engine)
    finally:
        engine.close()
    for rid, want in zip(ids, wants):
        _check(results[rid], want)


def test_second_turn_restored_from_the_prefix_cache_on_a_batch(qwen35_export_ort, builds, qwen35_checkpoint):
    """Turn 1 on a batched engine (chunked: its turn boundary ends a chunk, where its slot is snapshotted), turn 2 on a
    threaded one (staged after the restored snapshot): both == the conversation reference, turn 2 restores the
    whole turn-1 boundary (cached_tokens == its rows before the generation prompt, not a 16-row block multiple)."""
    from coverpruner.runtime.pipeline import Pipeline
    from tests.conversations import reference as R

    pipe = Pipeline.load(qwen35_export_ort, threads=1, prefix_cache_mb=64)
    fam = builds.memo(("qwen3_5", "conversation-reference"), lambda: R.load_family("qwen3_5", qwen35_checkpoint))
    first = _three_turns([])[0]
    want1 = R.chat(fam, first, budget=16, max_new_tokens=NEW)
    engine = pipe.engine(2, 512, max_step_tokens=16)
    got1 = _drain_one(engine, pipe.chat_request(first, budget=16, max_new_tokens=NEW))
    assert got1.token_ids == want1.tokens and got1.cached_tokens == 0
    (boundary,) = [len(b.ident) for b in pipe.prefix_cache.boundaries.items.values()]
    second = _three_turns([got1.text])[1]
    want2 = R.chat(fam, second, budget=16, max_new_tokens=NEW)
    threaded = pipe.engine(2, 512, threaded=True)
    try:
        got2 = _drain_one(threaded, pipe.chat_request(second, budget=16, max_new_tokens=NEW))
    finally:
        threaded.close()
    assert got2.token_ids == want2.tokens
    assert got2.cached_tokens == boundary and boundary % 16


def _drain_one(engine, request):
    rid = engine.submit(request)
    return _drain(engine)[rid]
