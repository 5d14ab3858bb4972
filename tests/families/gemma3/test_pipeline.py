"""Gemma 3 beyond the matrix: a three-turn conversation with two images whose pruned prompt is longer than the
sliding window (both decoder forms == the independent HF reference), chunked prefills beside running decodes ==
batch 1 == the HF reference with no block split between decoder calls, the prefix cache restoring whole blocks only
(a cut inside a crop's block would reuse rows that saw other rows), and the quantized dirs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.families.gemma3 import hf_reference as ref
from tests.families.gemma3.fixtures import noise_image, wide_image

pytestmark = pytest.mark.slow
pytest.importorskip("torch", reason="the reference runs the PyTorch model")

NEW = 8
LONG = ("Look at the second picture again and compare it with the first one: which colours, shapes and objects "
        "appear in both, which appear only once, where are they placed, left or right, top or bottom, and how many "
        "of each can you count in the two pictures taken together?")


def _conversation(images):
    return [{"role": "system", "content": [{"type": "text", "text": "You answer briefly."}]},
            {"role": "user", "content": [{"type": "image", "image": images[0]},
                                         {"type": "text", "text": "What is in the first picture?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a red circle"}]},
            {"role": "user", "content": [{"type": "image", "image": images[1]}, {"type": "text", "text": LONG}]}]


@pytest.fixture(scope="module")
def images():
    return [wide_image(7, (240, 200)), wide_image(8, (200, 260))]


@pytest.fixture(scope="module")
def reference(gemma3_hf, images):
    processor, model = gemma3_hf
    messages = [{"role": m["role"], "content": [{k: v for k, v in p.items() if k != "image"} for p in m["content"]]}
                for m in _conversation(images)]
    return ref.conversation(model, processor, messages, images, 64, "coverpruner", NEW)


@pytest.mark.parametrize("form", ["standard", "ort"])
def test_three_turns_two_images_past_the_window_equal_the_reference(gemma3_export, gemma3_ort_export, images,
                                                                     reference, form):
    from coverpruner.runtime import Pipeline

    pipe = Pipeline.load(gemma3_export if form == "standard" else gemma3_ort_export, provider="cpu", threads=1)
    got = pipe.chat(_conversation(images), budget=64, method="coverpruner", max_new_tokens=NEW)
    window = pipe.manifest.graphs["decoder"].attention.windows[0]
    assert got.prefill_tokens == len(reference.rows) > window  # the pruned prompt is longer than layer 0's window
    assert [img.kept_indices.tolist() for img in got.images] == [k.tolist() for k in reference.keep]
    for img, want in zip(got.images, reference.relevance):
        np.testing.assert_allclose(img.relevance, want, rtol=1e-4, atol=1e-7)
    assert got.token_ids == reference.tokens


#: requests with blocks: a pan-and-scan image at budget 64 (four blocks of a few rows), a one-crop image at 16, a
#: pan-and-scan image in full (four blocks of 144 rows, a prompt of ~600 rows) and DivPrune (pruned pan-and-scan on
#: noise: no near-tied gains, so the kept indices equal the float64 reference's)
BLOCK_REQUESTS = [dict(image=noise_image(0, (300, 800)), prompt="What is shown in this image?", budget=64,
                       pan_and_scan=True),
                  dict(image=wide_image(1, (240, 200)), prompt="Describe it.", budget=16),
                  dict(image=wide_image(2, (300, 800)), prompt="Which colour is it?", budget="full",
                       pan_and_scan=True),
                  dict(image=noise_image(5, (300, 800)), prompt="Name it.", budget=16, method="divprune",
                       pan_and_scan=True)]


@pytest.fixture(scope="module")
def block_answers(gemma3_ort_export):
    """BLOCK_REQUESTS answered one at a time, without the prefix cache (batch 1: one prefill call each)."""
    from coverpruner.runtime import Pipeline

    pipe = Pipeline.load(gemma3_ort_export, provider="cpu", threads=1)
    return [pipe.generate(max_new_tokens=NEW, **kw) for kw in BLOCK_REQUESTS]


@pytest.fixture(scope="module")
def block_references(gemma3_hf):
    """BLOCK_REQUESTS answered by the independent HF reference (hf_reference.py: its own masks, selector, gather)."""
    processor, model = gemma3_hf
    return [ref.one_image(model, processor, kw["image"], kw["prompt"], kw["budget"], kw.get("method", "coverpruner"),
                          NEW, kw.get("pan_and_scan", False)) for kw in BLOCK_REQUESTS]


def _whole_in_one_call(calls: list) -> None:
    """calls: the block ids int64 [S] of one request's rows per decoder call -> every block's rows in one call."""
    seen = {}
    for k, ids in enumerate(calls):
        for b in np.unique(ids[ids >= 0]).tolist():
            assert seen.setdefault(b, k) == k, f"block {b} split between decoder calls {seen[b]} and {k}"


def test_chunked_prefill_keeps_blocks_whole_and_answers_as_alone(gemma3_ort_export, block_answers,
                                                                  block_references):
    """Batched with chunked prefill beside running decodes (a 16-token step budget, which would cut every block of
    more than 16 rows; the engine loop without an admission thread): each answer is its batch-1 answer and
    transformers' (the independent reference), and no block's rows are ever split between two decoder calls (a
    chunk's rows but its last in one call, its last row in the decode call)."""
    from coverpruner.engine_dir import ATTENTION_BLOCKS
    from coverpruner.runtime import Pipeline
    from coverpruner.runtime.batching import BatchGenerator

    pipe = Pipeline.load(gemma3_ort_export, provider="cpu", threads=1)
    engine = BatchGenerator(pipe, max_batch=3, capacity=1024, max_step_tokens=16)
    prepared, enter = {}, engine._enter
    engine._enter = lambda job: (prepared.__setitem__(job.rid, job.prepared), enter(job))[1]
    ids = [engine.submit(pipe.request(max_new_tokens=NEW, **kw)) for kw in BLOCK_REQUESTS]
    results, calls, over, beside = {}, {rid: [] for rid in ids}, 0, 0
    while engine.pending:
        for event in engine.step():
            assert event.error is None
            if event.result is not None:
                results[event.request_id] = event.result
        for chunk in engine.last_plan.prefills:
            blocks = prepared[chunk.rid].extras(chunk.start, chunk.stop)[ATTENTION_BLOCKS]
            calls[chunk.rid] += [blocks[:-1], blocks[-1:]]
            over += chunk.rows > 16
            beside += bool(engine.last_plan.decodes)
    for rid in ids:
        _whole_in_one_call(calls[rid])
    assert over and beside  # a block longer than the budget ran whole; chunks ran beside decodes
    got = [results[rid] for rid in ids]
    assert [r.token_ids for r in got] == [r.token_ids for r in block_answers] == [a.tokens for a in block_references]
    assert ([r.kept_indices.tolist() for r in got] == [r.kept_indices.tolist() for r in block_answers]
            == [a.keep[0].tolist() for a in block_references])
    assert block_answers[0].num_visual_tokens == 576


def _turn(image, question):
    return [{"role": "system", "content": [{"type": "text", "text": "You are a careful assistant; answer briefly."}]},
            {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": question}]}]


def test_prefix_cache_restores_whole_blocks(gemma3_ort_export):
    """Cached == uncached around an image block (16 of the image's 144 soft tokens kept, rows a..b-1 of the pruned
    prompt). A second question on the same image reuses the prefix past the block; a request keeping 17 rows (its
    first kept rows the same) reuses none of the block's rows, which are named by the block's kept rows (a row saw its
    block's later rows); with the stored chain evicted down to a 16-row cache block that ends inside the image block,
    the restore is cut back before the block and the block is prefilled again, whole."""
    from coverpruner.runtime import Pipeline
    from coverpruner.runtime.prefix_cache import BLOCK_ROWS
    from coverpruner.runtime.stages import ImageSelection, Selection

    path = gemma3_ort_export  # the cut is the runtime's, the same for both decoder forms
    image, questions = wide_image(3, (240, 200)), ["What is shown in this image?", "Which colour is the sky?"]
    kw = dict(method="uniform", max_new_tokens=NEW)
    cold = Pipeline.load(path, provider="cpu", threads=1)
    want = {(q, b): cold.chat(_turn(image, q), budget=b, **kw).token_ids for q in questions for b in (16, 17)
            if q == questions[0] or b == 16}
    pipe = Pipeline.load(path, provider="cpu", threads=1, prefix_cache_mb=64)
    layout = pipe.encoder.encode_conversation(_turn(None, questions[0]), [144], [{"crops": 0}])
    a = int(layout.visual_positions[0])  # the block's first row: the text rows before the soft tokens
    assert a > BLOCK_ROWS and a % BLOCK_ROWS  # a 16-row cache block ends inside the image block [a, a + 16)
    first = pipe.chat(_turn(image, questions[0]), budget=16, **kw)
    second = pipe.chat(_turn(image, questions[1]), budget=16, **kw)
    assert second.cached_tokens >= a + 16 and second.token_ids == want[(questions[1], 16)]
    more = pipe.chat(_turn(image, questions[0]), budget=17, **kw)
    assert first.kept_indices[0] == more.kept_indices[0]
    assert more.cached_tokens == a // BLOCK_ROWS * BLOCK_ROWS and more.token_ids == want[(questions[0], 17)]
    kv = pipe.prefix_cache.kv
    for key in sorted(kv.items, key=lambda k: -pipe.prefix_cache._depth(kv, k)):  # leaves first, as eviction does
        if pipe.prefix_cache._depth(kv, key) > a // BLOCK_ROWS:  # keep the cache blocks up to one inside the image
            kv.remove(key)
    again = pipe.chat(_turn(image, questions[0]), budget=16, **kw)
    assert again.cached_tokens == a // BLOCK_ROWS * BLOCK_ROWS and again.token_ids == first.token_ids
    assert first.token_ids == want[(questions[0], 16)]
    # a block's rows are named by all its kept rows: keeping rows 0..15 or 0..19 of the image, rows a..a+15 agree in
    # image, row and position, yet no identity is shared (else a chain ending at a + 16 would restore rows that saw
    # rows 16..19 of the image)
    request = pipe.chat_request(_turn(image, questions[0]), budget=16, **kw)
    native = pipe.native_sequence(request)

    def identities(kept: int):
        selection = Selection([ImageSelection(np.arange(kept), None, np.arange(kept))])
        rows, positions, _ = pipe.pruned_sequence(request, native, selection)
        return pipe.row_identities(native, selection, rows, positions)

    short, long = identities(16), identities(20)
    np.testing.assert_array_equal(short[:a], long[:a])
    np.testing.assert_array_equal(short[a:a + 16, 1:], long[a:a + 16, 1:])
    assert not np.any(short[a:a + 16, 0] == long[a:a + 16, 0])


@pytest.mark.parametrize("dtype,form", [("int8", "qdq"), ("int4", "ort")])
def test_quantized_dirs_answer(gemma3_export, gemma3_ort_export, tmp_path, dtype, form):
    """Weight-only int8 (QDQ, the TensorRT form of the standard decoder) and int4 (MatMulNBits, the ORT form with its
    block masks) run the pan-and-scan request: int8 keeps every fp32 token on this checkpoint, int4 the first (its
    4-bit rounding moves later logits at these 64-wide layers: docs/quantization.md)."""
    import shutil

    from coverpruner.export.quant import QuantOptions, quantize_engine_dir
    from coverpruner.runtime import Pipeline

    source = gemma3_export if form == "qdq" else gemma3_ort_export
    work = shutil.copytree(source, tmp_path / "dir")
    quantize_engine_dir(work, QuantOptions(dtype=dtype, form=form))
    kw = dict(image=wide_image(0, (300, 800)), prompt="What is shown in this image?", budget=64, pan_and_scan=True,
              max_new_tokens=NEW)
    want = Pipeline.load(source, provider="cpu", threads=1).generate(**kw).token_ids
    got = Pipeline.load(work, provider="cpu", threads=1).generate(**kw)
    assert got.token_ids[:1] == want[:1] and (dtype == "int4" or got.token_ids == want)
    assert Pipeline.load(work).manifest.raw["quantization"]["bits"] == int(dtype[3:])
