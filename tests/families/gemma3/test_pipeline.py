"""Gemma 3 beyond the matrix: a three-turn conversation with two images whose pruned prompt is longer than the
sliding window (both decoder forms == the independent HF reference), batched == alone with blocks in a batch, and
the prefix cache restoring whole blocks only (a cut inside a crop's block would reuse rows that saw other rows)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.families.gemma3 import hf_reference as ref
from tests.families.gemma3.fixtures import wide_image

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


def test_batched_equals_alone(gemma3_ort_export):
    """Requests with blocks in one batch (two from empty slots prefill in one padded call, each with its own
    bias; a pan-and-scan one with four blocks): each answer is its batch-1 answer."""
    from coverpruner.runtime import Pipeline

    pipe = Pipeline.load(gemma3_ort_export, provider="cpu", threads=1)
    requests = [dict(image=wide_image(0, (300, 800)), prompt="What is shown in this image?", budget=64,
                     pan_and_scan=True),
                dict(image=wide_image(1, (240, 200)), prompt="Describe it.", budget=16),
                dict(image=wide_image(2, (300, 800)), prompt="Which colour is it?", budget=16, method="divprune",
                     pan_and_scan=True)]
    alone = [pipe.generate(max_new_tokens=NEW, **kw) for kw in requests]
    batched = pipe.batch_generate([dict(kw, max_new_tokens=NEW) for kw in requests], max_batch=3)
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]
    assert [r.kept_indices.tolist() for r in batched] == [r.kept_indices.tolist() for r in alone]
    assert alone[0].num_visual_tokens == 576


def test_prefix_cache_restores_whole_blocks(gemma3_ort_export):
    """Uniform selection of 17, then 16 of the same image's 144 soft tokens: the kept rows agree on their first row
    (4) and then differ, so the cached identities match one row into the image's block; the second request restores
    only the rows before the block (whose KV saw no row of it) and answers as without the cache. A third request
    with the 16 rows and another question reuses the whole block."""
    from coverpruner.runtime import Pipeline

    path = gemma3_ort_export  # the cut is the runtime's (plan_prefill), the same for both decoder forms
    image, questions = wide_image(3, (240, 200)), ["What is shown in this image?", "Which colour is the sky?"]
    kw = dict(method="uniform", max_new_tokens=NEW)
    cold = Pipeline.load(path, provider="cpu", threads=1)
    want = [cold.generate(image, q, budget=16, **kw).token_ids for q in questions]
    pipe = Pipeline.load(path, provider="cpu", threads=1, prefix_cache_mb=64)
    first = pipe.generate(image, questions[0], budget=17, **kw)
    second = pipe.generate(image, questions[0], budget=16, **kw)
    third = pipe.generate(image, questions[1], budget=16, **kw)
    layout = pipe.encoder.encode_conversation(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": questions[0]}]}], [144],
        [{"crops": 0}])
    before = int(layout.visual_positions[0])  # the text rows before the soft tokens
    assert first.kept_indices[0] == second.kept_indices[0] and first.kept_indices[1] != second.kept_indices[1]
    assert second.cached_tokens == before > 0 and second.token_ids == want[0]
    assert third.cached_tokens >= before + 16 + 2 and third.token_ids == want[1]  # the block and its end marker


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
