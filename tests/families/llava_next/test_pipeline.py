"""LLaVA-NeXT Pipeline.generate (ONNX graphs, numpy) == an HF PyTorch reference (tests/families/llava_next/hf_reference.py).

budget full == HF generate on the processor's inputs, token for token (both newline policies: full keeps every
row). Budgets 64/16 x methods coverpruner/divprune x newline policies drop/keep x 3 aspect ratios == HF image
features (HF packing) -> HF eager layer-0 attention -> literal float64 selector -> pruned inputs_embeds
(compact positions) -> HF generate; kept candidates and demand equal too.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.families.llava_next import hf_reference as ref
from tests.families.llava_next.fixtures import smooth_image

pytestmark = pytest.mark.slow
NEW = 8
# (width, height, prompt): portrait 2x2 grid, landscape 1x3 grid, tall 3x1 grid; prompts for which the
# tiny random model's unpruned answer is not one repeated token.
CASES = [(200, 240, "What is on the left of the picture?"),
         (300, 120, "What is on the left of the picture?"),
         (90, 260, "Describe the image.")]
IDS = [f"{w}x{h}" for w, h, _ in CASES]


@pytest.fixture(scope="module")
def requests_(next_hf_model, next_processor):
    return {f"{w}x{h}": (smooth_image(w, h, seed=w), p,
                         ref.native_request(next_hf_model, next_processor, smooth_image(w, h, seed=w), p))
            for w, h, p in CASES}


@pytest.mark.parametrize("case", IDS)
@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_full_budget_equals_hf_generate(next_pipe, next_hf_model, requests_, case, policy):
    image, prompt, req = requests_[case]
    want = ref.full_generate(next_hf_model, req, NEW)
    got = next_pipe.generate(image, prompt, budget="full", max_new_tokens=NEW, newline_policy=policy)
    assert got.token_ids == want
    n = int((~req.newline).sum())
    assert got.num_visual_tokens == n and got.kept_indices.tolist() == list(range(n))
    assert got.prefill_tokens == got.prompt_tokens == len(req.ids)


@pytest.mark.parametrize("case", IDS)
@pytest.mark.parametrize("policy", ["drop", "keep"])
@pytest.mark.parametrize("method", ["coverpruner", "divprune"])
@pytest.mark.parametrize("budget", [64, 16])
def test_pruned_equals_hf_reference(next_pipe, next_hf_model, next_eager_model, requests_, case, policy, method,
                                    budget):
    image, prompt, req = requests_[case]
    n, newlines = int((~req.newline).sum()), int(req.newline.sum())
    assert budget < n
    got = next_pipe.generate(image, prompt, budget=budget, method=method, max_new_tokens=NEW, newline_policy=policy)
    want, keep, relevance = ref.pruned_generate(next_hf_model, next_eager_model, req, budget, method, policy, NEW)
    assert got.kept_indices.tolist() == keep.tolist()
    if method == "coverpruner":
        # float32 softmax over ~180 keys (HF eager) vs the probe graph: relative rounding ~1e-6 of each value
        np.testing.assert_allclose(got.relevance, relevance, rtol=1e-4, atol=1e-7)
    extra = newlines if policy == "keep" else 0
    assert got.prefill_tokens == len(req.ids) - n - newlines + budget + extra
    assert got.token_ids == want


class _FirstTokenIs:
    """Sampler stand-in: returns `first` on the first call, then greedy argmax (the pipeline's loop unchanged)."""

    def __init__(self, first):
        self.first, self.calls = first, 0

    def sample(self, logits):
        self.calls += 1
        return self.first if self.calls == 1 else int(np.asarray(logits).reshape(-1).argmax())


def test_generated_image_token_is_an_ordinary_token(next_pipe, next_hf_model, requests_, monkeypatch):
    """The first answer token forced to the image token id: the pipeline embeds it as text and continues exactly
    as HF does (HF's decode steps carry no pixel_values, so the id goes through the embedding table)."""
    import coverpruner.runtime.pipeline as pipeline_module

    image, prompt, req = requests_[IDS[0]]
    image_id = next_hf_model.config.image_token_id
    forced = _FirstTokenIs(image_id)
    monkeypatch.setattr(pipeline_module, "Sampler", lambda config: forced.sample)
    got = next_pipe.generate(image, prompt, budget="full", max_new_tokens=NEW)
    want = ref.forced_first_token_generate(next_hf_model, req, image_id, NEW)
    assert got.token_ids[0] == image_id and got.token_ids == want
