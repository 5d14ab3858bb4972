"""Qwen3-VL pipeline (ONNX, CPU) == the independent HF reference (tests/families/qwen3_vl/hf_reference.py: its own
positions, literal selector and DeepStack gather) at budgets 32 and 8 (the matrix covers full / 64 / 16), and the
DeepStack inputs matter: zeroing them changes the tokens, so the parity tests exercise them."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow
PROMPT = "What is written on the sign next to the red car?"
NEW = 10


@pytest.fixture(scope="module")
def setup(builds, qwen3_checkpoint, qwen3_hf, qwen3_export):
    from coverpruner.runtime.pipeline import Pipeline
    from tests.families.qwen3_vl import hf_reference as ref
    from tests.families.qwen3_vl.fixtures import sample_image

    image = sample_image(5, (300, 250))
    req = ref.native_request(qwen3_hf, qwen3_checkpoint, image, PROMPT)
    return Pipeline.load(qwen3_export), image, req, set(qwen3_hf.generation_config.eos_token_id)


@pytest.mark.parametrize("budget", [32, 8])
def test_pruned_equals_reference(setup, qwen3_hf, budget):
    from tests.families.qwen3_vl import hf_reference as ref

    pipe, image, req, eos = setup
    got = pipe.generate(image, PROMPT, budget=budget, max_new_tokens=NEW)
    keep = ref.select(qwen3_hf, req, "coverpruner", budget)
    assert got.kept_indices.tolist() == np.sort(keep).tolist() and len(keep) == budget
    assert got.token_ids == ref.pruned_generate(qwen3_hf, req, keep, NEW, eos)


@pytest.mark.parametrize("budget", ["full", 8])
def test_zero_deepstack_changes_the_tokens(setup, qwen3_hf, budget):
    from tests.families.qwen3_vl import hf_reference as ref

    pipe, image, req, eos = setup
    got = pipe.generate(image, PROMPT, budget=budget, max_new_tokens=NEW)
    keep = got.kept_indices
    with_levels = ref.pruned_generate(qwen3_hf, req, keep, NEW, eos)
    without = ref.pruned_generate(qwen3_hf, req, keep, NEW, eos, zero_deepstack=True)
    assert got.token_ids == with_levels != without
