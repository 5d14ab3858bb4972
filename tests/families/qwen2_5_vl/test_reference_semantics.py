"""The HF-level semantics the pipeline is held to: the reference's unpruned greedy loop == HF generate, and
pruned generation (native positions, decode at max+1+t) == the full model with dropped columns masked."""

import numpy as np
import pytest
import torch

from tests.families.qwen2_5_vl import hf_reference as ref
from tests.families.qwen2_5_vl.fixtures import sample_image

PROMPT = "What is written on the sign next to the red car?"
STEPS = 12
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def request_300x250(qwen_hf, qwen_checkpoint):
    return ref.native_request(qwen_hf, qwen_checkpoint, sample_image(5, (300, 250)), PROMPT)


def _eos(model):
    return set(model.generation_config.eos_token_id)  # what HF generate stops on


def test_full_greedy_loop_equals_hf_generate(qwen_hf, request_300x250):
    req = request_300x250
    with torch.no_grad():
        out = qwen_hf.generate(**req.inputs, max_new_tokens=STEPS, do_sample=False, repetition_penalty=1.0)
    expected = out[0, req.inputs["input_ids"].shape[1]:].tolist()
    ours = ref.pruned_generate(qwen_hf, req, np.arange(req.visual.size), STEPS, _eos(qwen_hf))
    assert ours == expected and len(set(expected)) > 3  # a varied answer, not one repeated token


@pytest.mark.parametrize("method", ["coverpruner", "divprune"])
@pytest.mark.parametrize("budget", [64, 16])
def test_pruned_equals_masked_full_model(method, budget, qwen_hf, request_300x250):
    req = request_300x250
    keep = ref.select(qwen_hf, req, method, budget)
    assert keep.size == budget < req.visual.size
    pruned = ref.pruned_generate(qwen_hf, req, keep, STEPS, _eos(qwen_hf))
    assert pruned == ref.masked_generate(qwen_hf, req, keep, STEPS, _eos(qwen_hf))


def test_repacked_positions_change_the_answer(qwen_hf, request_300x250):
    """The pitfall the native scheme avoids: re-packing kept rows to 0..L'-1 changes the tokens here."""
    req = request_300x250
    keep = ref.select(qwen_hf, req, "divprune", 16)
    native = ref.pruned_generate(qwen_hf, req, keep, STEPS, _eos(qwen_hf))
    rows = np.setdiff1d(np.arange(req.embeds.shape[1]), np.setdiff1d(req.visual, req.visual[keep]))
    compact = torch.arange(rows.size).view(1, 1, -1).expand(3, 1, -1)
    repacked = ref.greedy(qwen_hf, req.embeds[:, torch.from_numpy(rows)], compact,
                          torch.ones(1, rows.size, dtype=torch.long), STEPS, _eos(qwen_hf))
    assert repacked != native


def test_literal_selectors_agree_with_the_package(request_300x250, qwen_hf):
    """Cross-check only (the pipeline tests use the literal ones): same picks as coverpruner.selection."""
    from coverpruner.selection import get_selector

    req = request_300x250
    feats = req.features.numpy()
    r = ref.layer0_relevance(qwen_hf, req)
    np.testing.assert_array_equal(ref.literal_coverage(feats, r, 16), get_selector("coverpruner")(feats, relevance=r,
                                                                                                   budget=16, tau=0.3))
    np.testing.assert_array_equal(ref.literal_divprune(feats, 16), get_selector("divprune")(feats, budget=16))
