"""serving/json_body.loads == json.loads: same values, same errors, on both of its paths (one json.loads call for a
body of few containers, the walk in short C calls above FAST_VALUES). The reference is the standard library's
json.loads itself, on the same bytes."""

from __future__ import annotations

import json

import pytest

from coverpruner.serving import json_body

CASES = ['{"a": [1, 2, {"b": [[[[1]]]]}], "c": "x\\"y", "d": NaN, "e": -Infinity}', " [ ] ", "[", "[1", "[1,",
         "[1 , 2 ]", "[1,\n2]", "{}", '{"a":1,}', "[1 2]", '{"a" 1}', '"\\ud800"', "[" * 5000 + "]" * 5000,
         '{"a":1} x', "", "\ufeff{}", '{"a": {"b": {"c": {"d": {"e": [1, [2]]}}}}}', "[1,]", "tru",
         "[[[[[1, 2], {}]]]]", "[1,  ]", '{"k": "\\u00e9\\n", "k": 2}', '{"a" : [ {"x" : "}"} , "]" ] }']


def _outcome(fn, raw: bytes):
    try:
        return "ok", json.dumps(fn(raw))
    except (ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("walk", [False, True], ids=["one json.loads", "walk"])
@pytest.mark.parametrize("text", CASES)
def test_same_value_or_error_as_json_loads(text, walk, monkeypatch):
    if walk:
        monkeypatch.setattr(json_body, "FAST_VALUES", -1)
    raw = text.encode("utf-8", "surrogatepass")
    assert _outcome(json_body.loads, raw) == _outcome(json.loads, raw)


def test_a_body_of_many_parts_takes_the_walk_and_equals_json_loads(monkeypatch):
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] *
                                                  (json_body.FAST_VALUES + 1)}]}).encode()
    calls = []
    monkeypatch.setattr(json_body, "_object", lambda *a, _f=json_body._object: calls.append(1) or _f(*a))
    assert json_body.loads(raw) == json.loads(raw)
    assert calls  # the walk ran (json.loads alone would not call it)
