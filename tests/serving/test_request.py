"""Request translation: the extra body fields are declared from GenerationOptions' fields (serving.schema), never
read from a Python signature: a new Pipeline keyword does not become an API field; the family's request options
(listed by the loaded pipeline) pass through; anything else is refused by name."""

from __future__ import annotations

import dataclasses

import pytest

from coverpruner.runtime import Pipeline
from coverpruner.runtime.options import GenerationOptions
from coverpruner.serving import request as request_mod
from coverpruner.serving import schema
from coverpruner.serving.errors import APIError
from coverpruner.serving.schema import ChatCompletionRequest
from tests.serving.conftest import data_url, user_message

OPTION_FIELDS = {"budget", "method", "tau", "demand", "ignore_eos", "stop_token_ids", "chat_template_kwargs"}


class _FamilyPipeline:
    """Stands in for a loaded Pipeline whose family has a per-request option (e.g. LLaVA-NeXT's newline_policy)."""

    def __init__(self, **options):
        self.options = options

    def family_options(self):
        return dict(self.options)


def _req(demo_png, **extra):
    return ChatCompletionRequest.model_validate({"model": "m", "messages": user_message(data_url(demo_png)),
                                                 "max_tokens": 5, **extra})


def test_a_new_pipeline_keyword_is_no_api_field(monkeypatch, demo_png):
    """Issue 25: the schema is declared, not read from Pipeline's signatures with inspect."""
    def stream(self, image, prompt, *, options=None, secret_knob=1, **kwargs):
        raise NotImplementedError

    for name in ("generate", "stream", "chat", "chat_stream", "chat_request", "request"):
        monkeypatch.setattr(Pipeline, name, stream)
    methods = {"pivots", "relevance_weight"}  # the selection methods' declared options (registry, not signatures)
    assert set(request_mod.pipeline_options()) == OPTION_FIELDS | methods
    allowed = request_mod.pipeline_options(_FamilyPipeline(newline_policy="keep"))
    assert set(allowed) == OPTION_FIELDS | methods | {"newline_policy"}
    gen = request_mod.build_request(_req(demo_png, newline_policy="drop", budget=32), {}, False, False, allowed)
    assert gen.options == GenerationOptions(budget=32, method="coverpruner", max_new_tokens=5,
                                            family={"newline_policy": "drop"})
    with pytest.raises(APIError) as info:
        request_mod.build_request(_req(demo_png, secret_knob=2), {}, False, False, allowed)
    assert info.value.status == 400 and info.value.param == "secret_knob" and info.value.code == "unknown_field"


def test_every_generation_option_is_declared_once():
    """Each GenerationOptions field is an OpenAI field, an extra body field or the server's: a new field fails here
    until the schema says which (so none joins the API silently)."""
    fields = [f.name for f in dataclasses.fields(GenerationOptions)]
    groups = [set(schema.OPENAI_FIELDS), set(schema.EXTRA_FIELDS), set(schema.SERVER_FIELDS)]
    assert sorted(fields) == sorted(name for g in groups for name in g)
    defaults = GenerationOptions()
    # plus the selection methods' own options (registry declarations: dart's pivots, cdpruner's relevance_weight)
    assert request_mod.pipeline_options() == {**{name: getattr(defaults, name) for name in OPTION_FIELDS},
                                              "pivots": None, "relevance_weight": None}


def test_family_options_listed_by_the_pipeline(demo_png):
    allowed = request_mod.pipeline_options(_FamilyPipeline(image_size=448))
    assert allowed == {**request_mod.pipeline_options(), "image_size": 448}
    gen = request_mod.build_request(_req(demo_png, image_size=336), {}, False, False, allowed)
    assert gen.options.family["image_size"] == 336
    with pytest.raises(APIError) as info:
        request_mod.build_request(_req(demo_png, newline_policy="keep"), {}, False, False, allowed)
    assert info.value.param == "newline_policy"


def test_current_pipeline_options_and_manifest_defaults(demo_png):
    assert {"budget", "method", "tau"} <= set(request_mod.pipeline_options())
    gen = request_mod.build_request(_req(demo_png), {"budget": 48, "method": "divprune"}, False, False)
    assert (gen.options.budget, gen.options.method) == (48, "divprune")
    gen = request_mod.build_request(_req(demo_png, budget="full", seed=3, temperature=0.5), {"budget": 48}, False, False)
    assert gen.options.budget is None and gen.options.seed == 3 and gen.options.temperature == 0.5
    # stop strings, n and logprobs are options too, validated once with the others
    gen = request_mod.build_request(_req(demo_png, stop="END", n=2, logprobs=True, top_logprobs=3), {}, False, False)
    assert (gen.options.stop, gen.n, gen.top_logprobs) == (("END",), 2, 3)
    for body, param in [(dict(top_logprobs=3), "top_logprobs"), (dict(stop=["a", ""]), "stop"),
                        (dict(stop_token_ids=[-1]), "stop_token_ids")]:
        with pytest.raises(APIError) as info:
            request_mod.build_request(_req(demo_png, **body), {}, False, False)
        assert info.value.status == 400 and info.value.param == param


def test_parts_stay_in_order_with_the_image_decoded(demo_png):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "first"},
                                         {"type": "image_url", "image_url": data_url(demo_png)},
                                         {"type": "text", "text": "second"}]}]
    gen = request_mod.build_request(ChatCompletionRequest(model="m", messages=msgs), {}, False, False)
    parts = gen.messages[0]["content"]
    assert [p["type"] for p in parts] == ["text", "image", "text"]
    assert (parts[0]["text"], parts[2]["text"]) == ("first", "second") and parts[1]["image"].size == (480, 360)
