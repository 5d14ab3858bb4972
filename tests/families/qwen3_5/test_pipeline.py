"""Qwen3.5 pipeline (ONNX, CPU, ORT-form decoder) == the independent HF references: single images at three shapes,
budgets full / 32 / 8 and DivPrune (tests/families/qwen3_5/hf_reference.py: HF's layout, positions, features and
first-full-attention-layer demand, the literal selector, its own gather and greedy loop over HF's hybrid cache), the
probe's demand within 1e-5 of HF's; a three-turn conversation with two images against tests/conversations/
reference.py, turn by turn with the prefix cache on (later turns restore the state snapshot of the earlier turn's
boundary: same tokens, cached_tokens > 0); batched answers == alone; the state snapshots stay within the cache's
byte budget; on the v5 engine loop, chunked prefill beside decoding, staged admission and a second turn on a batched
engine restored from the prefix cache == the same references. (The matrix runs 300x250 at full / 64 / 16 against HF
generate in both decoder forms.)
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow
PROMPT = "What is written on the sign next to the red car?"
NEW = 8
#: (H, W) -> merged grids 9x8 (72 tokens), 4x13 (52; the learned 8x8 position grid shrunk on one axis), 7x7 (49)
SHAPES = [(300, 250), (140, 420), (224, 224)]
CASES = [(shape, budget, "coverpruner") for shape in SHAPES for budget in ("full", 32, 8)] + \
        [(shape, 32, "divprune") for shape in SHAPES]


@pytest.fixture(scope="module")
def pipe(qwen35_export_ort):
    from coverpruner.runtime.pipeline import Pipeline

    return Pipeline.load(qwen35_export_ort, threads=1)


def _reference(builds, model, ckpt, shape):
    """(image, HF Native request, the demand of HF's first full-attention layer [n]) of one shape, once a session."""
    from tests.families.qwen3_5 import hf_reference as ref
    from tests.families.qwen_common import sample_image

    def make():
        image = sample_image(5, shape)
        req = ref.native_request(model, ckpt, image, PROMPT)
        return image, req, ref.layer0_relevance(model, req)

    return builds.memo(("qwen3_5", "pipeline-reference", shape), make)


@pytest.mark.parametrize("shape,budget,method", CASES, ids=[f"{h}x{w}-{b}-{m}" for (h, w), b, m in CASES])
def test_pruned_equals_reference(builds, pipe, qwen35_hf, qwen35_checkpoint, shape, budget, method):
    from tests.families.qwen3_5 import hf_reference as ref

    image, req, relevance = _reference(builds, qwen35_hf, qwen35_checkpoint, shape)
    got = pipe.generate(image, PROMPT, budget=budget, max_new_tokens=NEW, method=method)
    keep = ref.select(qwen35_hf, req, method, None if budget == "full" else budget)
    assert got.kept_indices.tolist() == np.sort(keep).tolist()
    assert len(keep) == (req.visual.size if budget == "full" else budget) < 80
    if method == "coverpruner" and budget != "full":
        # the probe (layers 0..2 run on the whole sequence, then layer 3's softmax) == HF's attentions[0]: float32
        # rounding of ~100-key softmaxes after three recurrent layers, measured ~1e-7
        assert np.abs(got.relevance - relevance).max() <= 1e-5
    eos = set(qwen35_hf.generation_config.eos_token_id)
    assert got.token_ids == ref.pruned_generate(qwen35_hf, req, keep, NEW, eos)


def _conversation_reference(builds, ckpt, answers: list[str], k: int, budget):
    """tests/conversations/reference.py's answer to turn k of _three_turns(answers), once a session."""
    from tests.conversations import reference as R

    fam = builds.memo(("qwen3_5", "conversation-reference"), lambda: R.load_family("qwen3_5", ckpt))
    return builds.memo(("qwen3_5", "conversation-turn", tuple(answers), k, budget),
                       lambda: R.chat(fam, _three_turns(answers)[k], budget=budget, max_new_tokens=NEW))


def _three_turns(answers: list[str]) -> list[list[dict]]:
    """The conversation after each of its three user turns: [user(image A + q1)], + [assistant, user(q2)],
    + [assistant, user(image B + q3)] (two images, answers the model's own)."""
    from tests.conversations.conversations import image

    turns = [[{"role": "user", "content": [{"type": "image", "image": image(0)},
                                           {"type": "text", "text": "What is in the first picture?"}]}],
             [{"role": "user", "content": "Is it bright?"}],
             [{"role": "user", "content": [{"type": "image", "image": image(1)},
                                           {"type": "text", "text": "And what changed in this one?"}]}]]
    out, messages = [], []
    for k, turn in enumerate(turns):
        messages = messages + turn
        out.append(messages)
        if k < len(answers):
            messages = messages + [{"role": "assistant", "content": answers[k]}]
    return out


@pytest.mark.parametrize("budget", ["full", 16])
def test_three_turns_with_two_images_cached_equal_the_reference(builds, qwen35_export_ort, qwen35_checkpoint, budget):
    """Each turn == tests/conversations/reference.py's answer (independent: HF's processor and template, its own
    demand, literal selector, pruning and greedy loop); with the prefix cache the 2nd and 3rd turns restore the
    snapshot of the earlier turn's boundary (cached_tokens > 0) and answer the same as without it."""
    from coverpruner.runtime import Pipeline

    cached = Pipeline.load(qwen35_export_ort, threads=1, prefix_cache_mb=64)
    plain = Pipeline.load(qwen35_export_ort, threads=1, prefix_cache_mb=0)
    answers = []
    for k in range(3):
        messages = _three_turns(answers)[k]
        want = _conversation_reference(builds, qwen35_checkpoint, answers, k, budget)
        got = cached.chat(messages, budget=budget, max_new_tokens=NEW)
        again = plain.chat(messages, budget=budget, max_new_tokens=NEW)
        assert got.token_ids == again.token_ids == want.tokens, f"turn {k + 1}"
        assert [g.kept_indices.tolist() for g in got.images] == [s.tolist() for s in want.selection.keep]
        assert (got.cached_tokens > 0) == (k > 0) and again.cached_tokens == 0
        answers.append(got.text)


def test_batched_answers_equal_alone(pipe, builds, qwen35_hf, qwen35_checkpoint):
    """Three requests of different images and prompts decode side by side (each slot its own conv and recurrent
    states and KV) and answer as each does alone."""
    requests = [dict(image=_reference(builds, qwen35_hf, qwen35_checkpoint, shape)[0], prompt=prompt, budget=budget,
                     max_new_tokens=NEW)
                for shape, prompt, budget in zip(SHAPES, [PROMPT, "Describe it.", "What colour is the car?"],
                                                 [32, "full", 8])]
    alone = [pipe.generate(**kw).token_ids for kw in requests]
    together = [r.token_ids for r in pipe.batch_generate(requests, max_batch=3)]
    assert together == alone and len({tuple(t) for t in alone}) == 3


def test_state_snapshots_stay_within_the_budget(qwen35_export_ort, builds, qwen35_hf, qwen35_checkpoint):
    """Every turn boundary's snapshot (KV rows + states) counts against the one byte budget: many different requests
    never hold more than it, the least recently used snapshots go first."""
    from coverpruner.runtime import Pipeline

    pipe = Pipeline.load(qwen35_export_ort, threads=1, prefix_cache_mb=0.25)
    for k, shape in enumerate(SHAPES * 2):
        image = _reference(builds, qwen35_hf, qwen35_checkpoint, shape)[0]
        pipe.generate(image, f"{PROMPT} ({k})", budget=16, max_new_tokens=2)
        assert pipe.prefix_cache.nbytes <= pipe.prefix_cache.max_bytes
        states = [entry.snap for entry in pipe.prefix_cache.boundaries.items.values()]
        assert states and all(s.states for s in states) and not pipe.prefix_cache.kv.items

# -- the v5 engine loop's paths (engine.py) -------------------------------------------------------------------------
# A hybrid decoder's conv and recurrent states must follow each request through every path the loop has for a
# prompt, not only one-shot prefills: chunked prefill beside decoding (a 16-row step budget: a newcomer's prompt runs
# in chunks while another request decodes, each chunk continuing its slot's states, its last row riding the decode
# call); staged admission (a threaded engine: the admission worker prefills the rows but the last into the staging
# slot, whose states move with it when it joins); a second turn on a batched engine restored from the turn-1
# boundary snapshot (KV rows + states), taken where the scheduler ended a chunk.
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

    pipe = Pipeline.load(qwen35_export_ort, threads=1, prefix_cache_mb=64)
    first = _three_turns([])[0]
    want1 = _conversation_reference(builds, qwen35_checkpoint, [], 0, 16)
    engine = pipe.engine(2, 512, max_step_tokens=16)
    got1 = _drain_one(engine, pipe.chat_request(first, budget=16, max_new_tokens=NEW))
    assert got1.token_ids == want1.tokens and got1.cached_tokens == 0
    (boundary,) = [len(b.ident) for b in pipe.prefix_cache.boundaries.items.values()]
    second = _three_turns([got1.text])[1]
    want2 = _conversation_reference(builds, qwen35_checkpoint, [got1.text], 1, 16)
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
