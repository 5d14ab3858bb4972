"""GenerationOptions: one typed, frozen object validated once (issue 25); every refusal names its option (param)."""

from __future__ import annotations

import dataclasses

import pytest

from coverpruner.runtime import GenerationOptions, OptionError


def test_defaults_and_normalised_values():
    o = GenerationOptions()
    assert (o.budget, o.method, o.tau, o.demand, o.max_new_tokens) == (64, "coverpruner", None, "turn", 128)
    assert (o.temperature, o.top_p, o.seed, o.ignore_eos, o.max_images, dict(o.family)) == \
        (0.0, 1.0, None, False, None, {})
    assert GenerationOptions(budget="full").budget is None and GenerationOptions(budget=" 16 ").budget == 16
    assert GenerationOptions(tau=1).tau == 1.0 and isinstance(GenerationOptions(tau=1).tau, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.budget = 3


@pytest.mark.parametrize("kwargs,param", [
    (dict(budget=0), "budget"), (dict(budget=True), "budget"), (dict(budget=1.5), "budget"),
    (dict(method="magic"), "method"), (dict(tau=-1), "tau"), (dict(tau=float("nan")), "tau"),
    (dict(demand="soon"), "demand"), (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=-0.1), "temperature"), (dict(top_p=0), "top_p"), (dict(seed=-1), "seed"),
    (dict(ignore_eos=1), "ignore_eos"), (dict(max_images=-1), "max_images"), (dict(max_images=True), "max_images"),
    (dict(family=["newline_policy"]), "family"),
])
def test_each_refusal_names_its_option(kwargs, param):
    with pytest.raises(OptionError) as info:
        GenerationOptions(**kwargs)
    assert info.value.param == param and info.value.code == "invalid_value"
    assert param in str(info.value) and "\n" not in str(info.value)


def test_of_merges_keywords_by_name():
    base = GenerationOptions(budget=16, seed=3, family={"newline_policy": "keep"})
    assert GenerationOptions.of(base) is base
    o = GenerationOptions.of(base, max_new_tokens=5, newline_policy="drop", image_size=448)
    assert (o.budget, o.seed, o.max_new_tokens) == (16, 3, 5)
    assert dict(o.family) == {"newline_policy": "drop", "image_size": 448}  # non-fields are family options
    assert GenerationOptions.of(None, budget="full") == GenerationOptions(budget=None)
    with pytest.raises(OptionError) as info:
        GenerationOptions.of({"budget": 16})  # not a GenerationOptions
    assert info.value.param == "options"
    with pytest.raises(OptionError) as info:
        GenerationOptions.of(base, budget=0)  # a replaced field is validated again
    assert info.value.param == "budget"
