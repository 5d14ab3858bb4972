"""LLaVA-1.5's guard for the pipeline == HF reference tests (tests/matrix/test_pipeline_reference.py, with this
family's cases and reference in matrix.py / hf_reference.py): budgets really change the answer path."""

import pytest

from tests.families.llava.matrix import NEW, PROMPTS

pytestmark = pytest.mark.slow


def test_pruning_changes_the_answer_path(tiny_pipe, demo_image):
    """Guard against a parity test that passes because budgets do nothing: prefill lengths and kept sets differ,
    and at 16 tokens the greedy tokens differ from the full model's on this checkpoint."""
    full = tiny_pipe.generate(demo_image, PROMPTS[0], budget="full", max_new_tokens=NEW)
    r64 = tiny_pipe.generate(demo_image, PROMPTS[0], budget=64, method="coverpruner", max_new_tokens=NEW)
    r16 = tiny_pipe.generate(demo_image, PROMPTS[0], budget=16, method="divprune", max_new_tokens=NEW)
    assert full.prefill_tokens - r64.prefill_tokens == tiny_pipe.max_visual_tokens - 64
    assert set(r16.kept_indices) != set(r64.kept_indices[:16])
    assert r16.token_ids != full.token_ids or r64.token_ids != full.token_ids
