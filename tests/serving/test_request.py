"""Request translation: which extra body fields reach Pipeline.stream is read from its signature, so an
option a later family adds to generate/stream passes through, and anything else is refused by name."""

from __future__ import annotations

import pytest

from coverpruner.serving import request as request_mod
from coverpruner.serving.errors import APIError
from coverpruner.serving.schema import ChatCompletionRequest
from tests.serving.conftest import data_url, user_message


class _FuturePipeline:
    """Stands in for a Pipeline whose family added a per-request option (e.g. LLaVA-NeXT's newline_policy)."""

    def generate(self, image, prompt, budget=64, method="coverpruner", tau=None, max_new_tokens=128,
                 temperature=0.0, top_p=1.0, seed=None, newline_policy="keep"):
        raise NotImplementedError

    def stream(self, image, prompt, budget=64, method="coverpruner", tau=None, max_new_tokens=128,
               temperature=0.0, top_p=1.0, seed=None, newline_policy="keep"):
        raise NotImplementedError


def _req(demo_png, **extra):
    return ChatCompletionRequest.model_validate({"model": "m", "messages": user_message(data_url(demo_png)),
                                                 "max_tokens": 5, **extra})


def test_options_follow_the_pipeline_signature(monkeypatch, demo_png):
    monkeypatch.setattr(request_mod, "Pipeline", _FuturePipeline)
    # plus the selection methods' own options (registry declarations: dart's pivots, cdpruner's relevance_weight)
    assert set(request_mod.pipeline_options()) == {"budget", "method", "tau", "newline_policy", "pivots",
                                                   "relevance_weight"}
    gen = request_mod.build_request(_req(demo_png, newline_policy="drop", budget=32), {}, False, False)
    assert gen.options == {"newline_policy": "drop", "budget": 32, "method": "coverpruner", "max_new_tokens": 5}
    with pytest.raises(APIError) as info:
        request_mod.build_request(_req(demo_png, ignore_eos=True), {}, False, False)  # not in this signature
    assert info.value.status == 400 and info.value.param == "ignore_eos"


class _KwargsPipeline:
    """Stands in for a Pipeline that takes family options through **options and lists them."""

    def generate(self, image, prompt, budget=64, method="coverpruner", max_new_tokens=128, **options):
        raise NotImplementedError

    stream = generate

    def family_options(self):
        return {"image_size": 448}


def test_family_options_listed_by_the_pipeline(monkeypatch, demo_png):
    monkeypatch.setattr(request_mod, "Pipeline", _KwargsPipeline)
    allowed = request_mod.pipeline_options(_KwargsPipeline())
    assert allowed == {"budget": 64, "method": "coverpruner", "image_size": 448, "pivots": None,
                       "relevance_weight": None}
    gen = request_mod.build_request(_req(demo_png, image_size=336), {}, False, False, allowed)
    assert gen.options["image_size"] == 336
    with pytest.raises(APIError) as info:
        request_mod.build_request(_req(demo_png, newline_policy="keep"), {}, False, False, allowed)
    assert info.value.param == "newline_policy"


def test_current_pipeline_options_and_manifest_defaults(demo_png):
    assert {"budget", "method", "tau"} <= set(request_mod.pipeline_options())
    gen = request_mod.build_request(_req(demo_png), {"budget": 48, "method": "divprune"}, False, False)
    assert (gen.options["budget"], gen.options["method"]) == (48, "divprune")
    gen = request_mod.build_request(_req(demo_png, budget="full", seed=3, temperature=0.5), {"budget": 48}, False, False)
    assert gen.options["budget"] == "full" and gen.options["seed"] == 3 and gen.options["temperature"] == 0.5


def test_parts_stay_in_order_with_the_image_decoded(demo_png):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "first"},
                                         {"type": "image_url", "image_url": data_url(demo_png)},
                                         {"type": "text", "text": "second"}]}]
    gen = request_mod.build_request(ChatCompletionRequest(model="m", messages=msgs), {}, False, False)
    parts = gen.messages[0]["content"]
    assert [p["type"] for p in parts] == ["text", "image", "text"]
    assert (parts[0]["text"], parts[2]["text"]) == ("first", "second") and parts[1]["image"].size == (480, 360)
