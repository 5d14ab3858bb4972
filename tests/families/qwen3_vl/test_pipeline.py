"""Qwen3-VL pipeline (ONNX, CPU) == the independent HF reference (tests/families/qwen3_vl/hf_reference.py: its own
positions, literal selector and DeepStack gather) for three image shapes at budgets full / 32 / 8 and DivPrune at 32
(the matrix covers 300x250 at full / 64 / 16 against HF generate), and the DeepStack inputs matter: zeroing them
changes the tokens, so the parity tests exercise them. Each shape's HF request and layer-0 demand are computed once.
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
def pipe(qwen3_export):
    from coverpruner.runtime.pipeline import Pipeline

    return Pipeline.load(qwen3_export)


def _reference(builds, model, ckpt, shape):
    """(image, HF Native request, layer-0 demand [n]) of one shape, once per session."""
    from tests.families.qwen3_vl import hf_reference as ref
    from tests.families.qwen3_vl.fixtures import sample_image

    def make():
        image = sample_image(5, shape)
        req = ref.native_request(model, ckpt, image, PROMPT)
        return image, req, ref.layer0_relevance(model, req)

    return builds.memo(("qwen3_vl", "pipeline-reference", shape), make)


def _keep(req, relevance, method: str, budget) -> np.ndarray:
    from tests.families.qwen3_vl.hf_reference import literal_coverage, literal_divprune

    n = req.visual.size
    if budget == "full":
        return np.arange(n)
    feats = req.features.float().numpy()
    return literal_coverage(feats, relevance, budget, 0.3) if method == "coverpruner" else literal_divprune(feats, budget)


@pytest.mark.parametrize("shape,budget,method", CASES, ids=[f"{h}x{w}-{b}-{m}" for (h, w), b, m in CASES])
def test_pruned_equals_reference(builds, pipe, qwen3_hf, qwen3_checkpoint, shape, budget, method):
    from tests.families.qwen3_vl import hf_reference as ref

    image, req, relevance = _reference(builds, qwen3_hf, qwen3_checkpoint, shape)
    got = pipe.generate(image, PROMPT, budget=budget, max_new_tokens=NEW, method=method)
    keep = _keep(req, relevance, method, budget)
    assert got.kept_indices.tolist() == np.sort(keep).tolist()
    assert len(keep) == (req.visual.size if budget == "full" else budget) < 80
    assert got.token_ids == ref.pruned_generate(qwen3_hf, req, keep, NEW, set(qwen3_hf.generation_config.eos_token_id))


def test_zero_deepstack_changes_the_tokens(builds, pipe, qwen3_hf, qwen3_checkpoint):
    from tests.families.qwen3_vl import hf_reference as ref

    image, req, _ = _reference(builds, qwen3_hf, qwen3_checkpoint, SHAPES[0])
    eos = set(qwen3_hf.generation_config.eos_token_id)
    got = pipe.generate(image, PROMPT, budget=8, max_new_tokens=NEW)
    with_levels = ref.pruned_generate(qwen3_hf, req, got.kept_indices, NEW, eos)
    without = ref.pruned_generate(qwen3_hf, req, got.kept_indices, NEW, eos, zero_deepstack=True)
    assert got.token_ids == with_levels != without
