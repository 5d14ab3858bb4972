"""Issue 40: what a client can make a grammar cost (runtime/grammar.py): the schema's size checked before any
conversion, one compile per distinct schema (refusals included), a schema that admits no document refused at
admission, and each answer's CPU budget for its masks, whose overrun fails that answer alone (the engine reads it
where it reads the mask: tests/serving/test_hostile_clients.py checks the batch around it)."""

from __future__ import annotations

import pytest

from coverpruner.runtime.errors import OptionError

pytest.importorskip("llguidance", reason="grammars need llguidance (serve extra)")


@pytest.fixture(scope="module")
def compiler(tiny_export):
    from coverpruner.runtime import Pipeline

    return Pipeline.load(tiny_export, provider="cpu", threads=1).grammars


def fmt(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def test_schema_size_is_checked_by_a_walk_that_stops_at_the_limit():
    from coverpruner.runtime.grammar import MAX_SCHEMA_CHARS, MAX_SCHEMA_NODES, check_schema_size

    check_schema_size({"enum": ["v"] * (MAX_SCHEMA_NODES - 2)})  # the object, the list and its items
    with pytest.raises(OptionError, match=f"more than {MAX_SCHEMA_NODES:,} values") as info:
        check_schema_size({"enum": ["v"] * (MAX_SCHEMA_NODES - 1)})
    assert (info.value.code, info.value.param) == ("grammar_too_complex", "response_format")
    check_schema_size({"const": "x" * (MAX_SCHEMA_CHARS - 5)})  # "const" is 5 characters
    with pytest.raises(OptionError, match=f"more than {MAX_SCHEMA_CHARS:,} characters"):
        check_schema_size({"const": "x" * (MAX_SCHEMA_CHARS - 4)})
    with pytest.raises(OptionError, match="tools: the schema holds"):
        check_schema_size([{"k": 1}] * 10, "tools", max_nodes=20)


def test_one_compile_per_distinct_schema_refusals_included(compiler, monkeypatch):
    import llguidance

    calls = []
    real = llguidance.LLMatcher.grammar_from_json_schema
    monkeypatch.setattr(llguidance.LLMatcher, "grammar_from_json_schema",
                        staticmethod(lambda *a, **k: calls.append(1) or real(*a, **k)))
    schema = {"type": "object", "properties": {"issue40-cache": {"type": "integer"}}}
    first = compiler.compile(fmt(schema))
    assert compiler.compile(fmt(dict(reversed(list(schema.items()))))) is first  # same canonical JSON
    cycle = {"$defs": {"p40": {"$ref": "#/$defs/q40"}, "q40": {"$ref": "#/$defs/p40"}}, "$ref": "#/$defs/p40"}
    for _ in range(2):
        with pytest.raises(OptionError, match="admits no finite JSON document"):
            compiler.compile(fmt(cycle))
    with pytest.raises(OptionError, match=r"^tools\[3\]\.function\.parameters schema admits no finite") as info:
        compiler.compile(fmt(cycle), param="tools[3].function.parameters")  # the cached refusal, renamed
    assert info.value.param == "tools[3].function.parameters"
    assert len(calls) == 2  # the object schema once, the cycle once


def test_a_first_mask_over_budget_is_refused_at_admission(compiler, monkeypatch):
    from coverpruner.runtime import grammar

    monkeypatch.setattr(grammar, "FIRST_MASK_S", 0.0)
    with pytest.raises(OptionError, match="first token's mask; at most 0 ms") as info:
        compiler.compile(fmt({"type": "object", "properties": {"issue40-burst": {"type": "string"}}}))
    assert info.value.code == "grammar_too_complex"


def test_mask_budget_arithmetic():
    from coverpruner.runtime.grammar import MASK_FLOOR_S, MASK_START_S, MASK_STEP_FACTOR, MaskBudget

    b = MaskBudget()
    b.spend(MASK_START_S)
    b.check()  # exactly the starting allowance: still within
    b.grant(0.0)  # a step faster than the floor is granted the floor
    b.spend(MASK_FLOOR_S)
    b.check()
    b.grant(0.004)  # a slower step grants MASK_STEP_FACTOR of its CPU time
    b.spend(MASK_STEP_FACTOR * 0.004)
    b.check()
    b.spend(1e-6)
    with pytest.raises(OptionError, match="over its budget") as info:
        b.check()
    assert (info.value.code, info.value.param) == ("grammar_too_complex", "response_format")


def test_a_spent_budget_fails_that_answer_where_its_mask_is_read(compiler):
    from coverpruner.runtime.grammar import GrammarMatcher, start_masks

    g = compiler.compile(fmt({"type": "object", "properties": {"issue40-read": {"type": "integer"}}}))
    fine, spent = GrammarMatcher(g), GrammarMatcher(g)
    spent.budget.spend(10.0)
    masks = start_masks([fine, spent])
    assert masks.allowed(0).any()
    with pytest.raises(OptionError, match="over its budget"):
        masks.allowed(1)
    assert fine.budget.spent > 0  # its mask's CPU time was charged to it


def test_a_step_grants_from_its_cpu_time_not_its_wall_time(compiler):
    """The engine's thread waiting (descheduled on a busy machine, or held up by a mask competing for the cores)
    grants a grammar nothing: a 10 KB const's masks stretched the step's wall time they were measured against, so
    their budget grew with the delay they caused (issue 40: its neighbour took 2.3x its time alone)."""
    import time

    from coverpruner.runtime.grammar import MASK_FLOOR_S, MASK_START_S, GrammarMatcher, start_masks

    g = compiler.compile(fmt({"type": "object", "properties": {"issue40-cpu": {"type": "integer"}}}))
    m = GrammarMatcher(g)
    masks = start_masks([m])
    time.sleep(0.05)  # 50 ms of wall time, no CPU time of this thread
    masks.allowed(0)
    assert m.budget.allowed == pytest.approx(MASK_START_S + MASK_FLOOR_S)
