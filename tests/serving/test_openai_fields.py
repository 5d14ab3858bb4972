"""OpenAI fields beyond the basics (issue 30 item 3): penalties and logit_bias change sampling as OpenAI defines
them, book-keeping fields are taken, and each refused field gets a 400 naming it and why."""

from __future__ import annotations

import io

import numpy as np
import openai
import pytest
from PIL import Image

from coverpruner.runtime.sampling import Sampler, SamplingConfig
from tests.serving.conftest import PROMPT, data_url, user_message


def test_penalties_and_bias_match_openai_definition():
    """Greedy picks under penalties equal a literal per-token loop of OpenAI's formula."""
    rng = np.random.default_rng(0)
    steps = rng.normal(size=(30, 11)).astype(np.float32)
    cfg = SamplingConfig(frequency_penalty=0.7, presence_penalty=0.4, logit_bias={"3": -1.5, 5: 0.8})
    sampler, counts, want = Sampler(cfg), [0] * 11, []
    for row in steps:
        scores = [float(row[j]) - counts[j] * 0.7 - (0.4 if counts[j] else 0.0) + {3: -1.5, 5: 0.8}.get(j, 0.0)
                  for j in range(11)]
        pick = max(range(11), key=lambda j: (scores[j], -j))
        counts[pick] += 1
        want.append(pick)
    assert [sampler(row) for row in steps] == want
    assert len(set(want)) > 1  # the penalties did move the choice off one token


def test_logit_bias_forces_a_token(client, reference, demo_png):
    r = client.chat.completions.create(model="tiny", messages=user_message(data_url(demo_png)), max_tokens=6,
                                       logit_bias={"7": 100}, extra_body={"budget": 8, "ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6
    # +100 outweighs any logit of the random-weight model: every token is id 7
    assert r.choices[0].message.content == reference.encoder.tokenizer.decode([7] * 6)


def test_penalties_reach_the_decoder(client, reference, demo_png):
    opts = {"frequency_penalty": 2.0, "presence_penalty": 1.0}
    want = reference.generate(Image.open(io.BytesIO(demo_png)), PROMPT, max_new_tokens=16, budget=8,
                              ignore_eos=True, **opts)
    plain = reference.generate(Image.open(io.BytesIO(demo_png)), PROMPT, max_new_tokens=16, budget=8,
                               ignore_eos=True)
    counts = np.bincount(want.token_ids)
    assert counts.max() <= np.bincount(plain.token_ids).max()
    assert want.token_ids != plain.token_ids  # random weights repeat tokens; the penalty breaks the repeats
    r = client.chat.completions.create(model="tiny", messages=user_message(data_url(demo_png)), max_tokens=16,
                                       extra_body={"budget": 8, "ignore_eos": True}, **opts)
    assert r.choices[0].message.content == want.text


def test_bookkeeping_fields_are_taken(client, demo_png):
    r = client.chat.completions.create(model="tiny", messages=user_message(data_url(demo_png)), max_tokens=4,
                                       user="u1", metadata={"k": "v"}, store=False, parallel_tool_calls=False,
                                       n=1, logprobs=False, response_format={"type": "text"}, tool_choice="none",
                                       extra_body={"budget": 8})
    assert r.choices[0].message.content is not None


@pytest.mark.parametrize("field, value", [
    ("functions", [{"name": "f", "parameters": {"type": "object"}}]),
    ("response_format", {"type": "json_xml"}),
    ("logprobs", "yes"), ("top_logprobs", 2), ("top_logprobs", 21), ("n", 2),
    ("frequency_penalty", 3.0), ("logit_bias", {"99999999": 1}), ("logit_bias", {"7": 101}),
])
def test_refused_fields_name_themselves(client, demo_png, field, value):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=user_message(data_url(demo_png)), max_tokens=4,
                                       extra_body={"budget": 8, field: value})
    assert info.value.body["param"] == field, info.value.body
    assert field in info.value.body["message"] or "Input should" in info.value.body["message"]
