"""One image in one user turn is the special case: the conversation reference equals the single-image references
that the existing pipeline tests use (kept indices, demand to float32 rounding, tokens), for every family.

Each family's hooks (tests/families/<family>/conversation.py) call its single-image reference
(tests/families/<family>/hf_reference.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conversations import reference as R
from tests.conversations.conversations import image

pytestmark = pytest.mark.slow  # runs the tiny HF models
PROMPT = "What is on the left of the picture?"
STEPS = 8


@pytest.mark.parametrize("budget", [16, 40])
@pytest.mark.parametrize("fam_name", R.FAMILIES)
def test_one_image_one_turn_is_the_single_image_reference(hf_family, fam_name, budget):
    fam, img = hf_family(fam_name), image(0)
    ours = R.chat(fam, [{"role": "user", "content": [{"type": "image", "image": img},
                                                     {"type": "text", "text": PROMPT}]}],
                  budget=budget, max_new_tokens=STEPS)
    tokens, keep, relevance = fam.hooks.single_image_reference(fam, img, PROMPT, budget, STEPS)
    assert ours.selection.keep[0].tolist() == np.asarray(keep).tolist()
    # both are HF eager float32 layer-0 softmax over the same sequence; they differ only in how the mean over
    # heads and rows is taken (float32 vs float64): a few float32 ulps of the values
    np.testing.assert_allclose(ours.selection.relevance[0], relevance, rtol=1e-5, atol=1e-9)
    assert ours.tokens == list(tokens)  # generate(inputs_embeds=...) returns the new tokens only
