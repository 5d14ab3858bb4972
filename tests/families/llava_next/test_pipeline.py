"""LLaVA-NeXT's pipeline quirks. Pipeline == HF reference for budgets full/64/16 x methods x newline policies x 3
aspect ratios is the matrix test (tests/matrix/test_pipeline_reference.py; cases in matrix.py, reference in
hf_reference.py); here: a generated <image> token id is embedded as ordinary text, as HF does.
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


class _FirstTokenIs:
    """Sampler stand-in: returns `first` on the first call, then greedy argmax (the pipeline's loop unchanged)."""

    def __init__(self, first):
        self.first, self.calls = first, 0

    def sample(self, logits, allowed=None):  # allowed: a grammar's mask (None here: no response_format)
        assert allowed is None
        self.calls += 1
        return self.first if self.calls == 1 else int(np.asarray(logits).reshape(-1).argmax())


def test_generated_image_token_is_an_ordinary_token(next_pipe, next_hf_model, requests_, monkeypatch):
    """The first answer token forced to the image token id: the pipeline embeds it as text and continues exactly
    as HF does (HF's decode steps carry no pixel_values, so the id goes through the embedding table)."""
    import coverpruner.runtime.engine as engine_module  # the engine loop makes each request's sampler

    image, prompt, req = requests_[IDS[0]]
    image_id = next_hf_model.config.image_token_id
    forced = _FirstTokenIs(image_id)
    monkeypatch.setattr(engine_module, "Sampler", lambda config, stream=0: forced.sample)
    got = next_pipe.generate(image, prompt, budget="full", max_new_tokens=NEW)
    want = ref.forced_first_token_generate(next_hf_model, req, image_id, NEW)
    assert got.token_ids[0] == image_id and got.token_ids == want
