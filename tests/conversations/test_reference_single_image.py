"""One image in one user turn is the special case: the conversation reference equals the single-image references
that the existing pipeline tests use (kept indices, demand to float32 rounding, tokens), for every family.

Imports the single-image references from tests/families/<family>/hf_reference.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conversations import reference as R
from tests.conversations.conversations import image

pytestmark = pytest.mark.slow  # runs the tiny HF models
PROMPT = "What is on the left of the picture?"
STEPS = 8


def _single_image_reference(fam, img, budget):
    """(tokens, kept indices, relevance) from the family's own single-image reference."""
    if fam.name == "llava":
        from tests.families.llava import hf_reference as ref

        tokens, keep, relevance, _ = ref.pruned_generate(fam.model, fam.processor, img, PROMPT, budget,
                                                         "coverpruner", STEPS)
        return tokens, keep, relevance
    if fam.name == "llava_next":
        from tests.families.llava_next import hf_reference as ref

        req = ref.native_request(fam.model, fam.processor, img, PROMPT)
        return ref.pruned_generate(fam.model, fam.model, req, budget, "coverpruner", "drop", STEPS)
    from tests.families.qwen2_5_vl import hf_reference as ref

    req = ref.native_request(fam.model, fam.ckpt, img, PROMPT)
    keep = ref.select(fam.model, req, "coverpruner", budget)
    return ref.pruned_generate(fam.model, req, keep, STEPS, fam.eos), keep, ref.layer0_relevance(fam.model, req)


@pytest.mark.parametrize("budget", [16, 40])
@pytest.mark.parametrize("fam_name", R.FAMILIES)
def test_one_image_one_turn_is_the_single_image_reference(hf_family, fam_name, budget):
    fam, img = hf_family(fam_name), image(0)
    ours = R.chat(fam, [{"role": "user", "content": [{"type": "image", "image": img},
                                                     {"type": "text", "text": PROMPT}]}],
                  budget=budget, max_new_tokens=STEPS)
    tokens, keep, relevance = _single_image_reference(fam, img, budget)
    assert ours.selection.keep[0].tolist() == np.asarray(keep).tolist()
    # both are HF eager float32 layer-0 softmax over the same sequence; they differ only in how the mean over
    # heads and rows is taken (float32 vs float64): a few float32 ulps of the values
    np.testing.assert_allclose(ours.selection.relevance[0], relevance, rtol=1e-5, atol=1e-9)
    assert ours.tokens == list(tokens)  # generate(inputs_embeds=...) returns the new tokens only
