"""serving/json_body.loads == json.loads: same values, same errors, on both of its paths (one json.loads call for a
body of few containers, the walk in short C calls above FAST_CONTAINERS). The reference is the standard library's
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
        monkeypatch.setattr(json_body, "FAST_CONTAINERS", -1)
    raw = text.encode("utf-8", "surrogatepass")
    assert _outcome(json_body.loads, raw) == _outcome(json.loads, raw)


def test_a_body_of_many_parts_takes_the_walk_and_equals_json_loads(monkeypatch):
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] *
                                                  (json_body.FAST_CONTAINERS + 1)}]}).encode()
    calls = []
    monkeypatch.setattr(json_body, "_object", lambda *a, _f=json_body._object: calls.append(1) or _f(*a))
    assert json_body.loads(raw) == json.loads(raw)
    assert calls  # the walk ran (json.loads alone would not call it)


# -- issue 40: big bodies walked with long strings in slices, capped fields refused while read -------------------

STRINGY = ['{"url": "' + r'ab/\\\"\u00e9\ud83d\ude00xyz' * 20 + '", "n": [1, "' + "q" * 50 + '"]}',
           '{"s": "' + "\\" * 60 + '"}', '{"s": "' + r"abc\u12" + '"}', '{"s": "' + "x" * 40 + '\x01"}',
           '{"s": "' + "x" * 40, '["' + "é" * 33 + '", "' + r"\n" * 21 + '"]']


@pytest.mark.parametrize("text", CASES + STRINGY)
def test_a_big_body_reads_every_value_as_json_loads(text, monkeypatch):
    """Above BIG_BODY every value is walked and a string longer than _SLICE is decoded a slice per C call; both
    made tiny here so that the cases cross slice boundaries inside escapes, surrogate pairs and backslash runs."""
    monkeypatch.setattr(json_body, "BIG_BODY", 0)
    monkeypatch.setattr(json_body, "_SLICE", 7)
    raw = text.encode("utf-8", "surrogatepass")
    got, want = _outcome(json_body.loads, raw), _outcome(json.loads, raw)
    assert got == want or got[0] == want[0] == "RecursionError"  # the walk's own frames say it in other words


def test_capped_fields_are_refused_while_read(monkeypatch):
    caps = {"logit_bias": (10, "invalid_value"), "tools": (20, "grammar_too_complex")}
    monkeypatch.setattr(json_body, "FAST_COMMAS", -1)  # the walk
    ok = {"model": "m", "logit_bias": {str(i): 1 for i in range(10)}, "tools": [{"a": [[1, 2], {"b": 3}]}] * 2}
    assert json_body.loads(json.dumps(ok).encode(), caps) == ok
    with pytest.raises(json_body.TooManyValues) as info:
        json_body.loads(json.dumps({**ok, "logit_bias": {str(i): 1 for i in range(11)}}).encode(), caps)
    assert (info.value.field, info.value.limit, info.value.code) == ("logit_bias", 10, "invalid_value")
    with pytest.raises(json_body.TooManyValues) as info:  # values inside nested containers count: 7 per tool here
        json_body.loads(json.dumps({**ok, "tools": [{"a": [[1, 2], {"b": 3}]}] * 3}).encode(), caps)
    assert info.value.field == "tools"


def test_many_commas_in_few_containers_take_the_walk(monkeypatch):
    """10^6 logit_bias entries are ONE object: json.loads held the GIL 0.6 s for it. Commas over FAST_COMMAS take
    the walk (as many containers do), where a cap stops the field early."""
    raw = json.dumps({"model": "m", "logit_bias": {str(i): 1 for i in range(json_body.FAST_COMMAS + 1)}}).encode()
    calls = []
    monkeypatch.setattr(json_body, "_object", lambda *a, _f=json_body._object: calls.append(1) or _f(*a))
    with pytest.raises(json_body.TooManyValues):
        json_body.loads(raw, {"logit_bias": (1024, "invalid_value")})
    assert calls


def test_dumps_equals_the_json_response_bytes():
    from starlette.responses import JSONResponse

    big = {"choices": [{"logprobs": {"content": [{"token": "é", "logprob": -0.5, "bytes": [195, 169]}] * 40}}],
           "usage": {"a": 1}, "x": [None, True, 1.5, "😀"]}
    for obj in (big, [], {}, "s", 3, None, [list(range(100))] * 3):
        assert json_body.dumps(obj) == JSONResponse(obj).body
