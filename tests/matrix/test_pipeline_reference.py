"""Pipeline.generate (ONNX graphs, numpy, CPU) == each family's independent HF PyTorch reference.

For every family of the matrix and each of its cases (tests/families/<family>/matrix.py: image, prompt,
options; the reference itself is tests/families/<family>/hf_reference.py, written without coverpruner's
layout, positions or selectors):
  budget full == HF generate on the processor's inputs, token for token, every candidate kept;
  budgets 64/16 x coverpruner/divprune == HF features -> HF eager layer-0 demand -> literal float64 selector ->
  pruned HF generate: same kept indices, same demand, same tokens.
The family's own extra facts (prefill counts, instruction positions, masked == pruned, ...) are its check_* hooks.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("torch", reason="the HF references run the PyTorch model")


@pytest.mark.parametrize("method", ["coverpruner", "divprune"])
def test_full_budget_equals_hf_generate(family, request, case_id, method):
    facts = family.facts
    image, prompt, options = facts.pipeline_case(family, request, case_id)
    want = facts.hf_full(family, request, case_id)
    got = family.pipe.generate(image, prompt, budget="full", method=method, max_new_tokens=facts.NEW, **options)
    assert got.token_ids == want
    assert got.kept_indices.tolist() == list(range(got.num_visual_tokens))
    assert got.relevance is None and got.prefill_tokens == got.prompt_tokens
    facts.check_full(family, request, case_id, got, want)


@pytest.mark.parametrize("budget", [64, 16])
@pytest.mark.parametrize("method", ["coverpruner", "divprune"])
def test_pruned_equals_hf_reference(family, request, case_id, budget, method):
    facts = family.facts
    image, prompt, options = facts.pipeline_case(family, request, case_id)
    got = family.pipe.generate(image, prompt, budget=budget, method=method, max_new_tokens=facts.NEW, **options)
    ref_out = facts.hf_pruned(family, request, case_id, budget, method)
    want, keep, relevance = ref_out[:3]
    assert got.kept_indices.tolist() == np.asarray(keep).tolist() and len(keep) == budget
    if method == "coverpruner":
        # float32 softmax over at most a few hundred keys (HF eager) vs the probe graph: relative rounding ~1e-6
        np.testing.assert_allclose(got.relevance, relevance, rtol=1e-4, atol=1e-7)
    assert got.token_ids == want
    facts.check_pruned(family, request, case_id, got, ref_out, budget)
