"""Issue 30 part A through the official openai client on every family's tiny random-weight engine: response_format
json_schema / json_object and forced tool calls are generated under llguidance's token masks (runtime/grammar.py),
so even random weights answer JSON that parses and validates; a cached conversation turn under a schema equals the
same turn on a cache-off server.

Cost: one batched server (8 slots, ORT-form decoder) per family; each of the 20 seeds is sampled once per budget
(odd seeds streamed, even ones not); the schema bounds every value (enum, maxItems, maxLength, number and integer
ranges) so that the seeded samples close within max_tokens.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.family_matrix import STANDARD_MATRIX
from tests.serving.conftest import data_url, start_server, user_message

pytest.importorskip("llguidance", reason="constrained output needs llguidance (serve extra)")
pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["kind", "tags", "score", "box"],
    "properties": {
        "kind": {"enum": ["cat", "dog", "bird"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
        # multipleOf bounds the fraction's digits (a range alone does not: random weights write 4.3636363...)
        "score": {"type": "number", "minimum": 0, "maximum": 10, "multipleOf": 0.25},
        "box": {"type": "object", "additionalProperties": False, "required": ["x", "y"],
                "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99},
                               "y": {"type": "integer", "minimum": 0, "maximum": 99}}},
    },
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "scene", "schema": SCHEMA, "strict": True}}
TOOL = {"type": "function", "function": {"name": "locate", "description": "Report where the object is",
                                         "parameters": SCHEMA["properties"]["box"]}}
SEEDS = range(20)
MAX_TOKENS = 160


def check_scene(text: str) -> None:
    """Parse and validate against SCHEMA: jsonschema when installed, else literal checks of every rule."""
    value = json.loads(text)
    try:
        import jsonschema
    except ImportError:
        jsonschema = None
    if jsonschema is not None:
        jsonschema.validate(value, SCHEMA)
        return
    assert set(value) == {"kind", "tags", "score", "box"} and value["kind"] in ("cat", "dog", "bird")
    assert isinstance(value["tags"], list) and len(value["tags"]) <= 2
    assert all(isinstance(t, str) and len(t) <= 6 for t in value["tags"])
    assert isinstance(value["score"], (int, float)) and not isinstance(value["score"], bool)
    assert 0 <= value["score"] <= 10 and (value["score"] * 4).is_integer()
    check_box(value["box"])


def check_box(box) -> None:
    assert isinstance(box, dict) and set(box) == {"x", "y"}
    assert all(isinstance(box[k], int) and not isinstance(box[k], bool) and 0 <= box[k] <= 99 for k in box)


@pytest.fixture(scope="module", params=STANDARD_MATRIX, ids=[e.name for e in STANDARD_MATRIX])
def served(request, builds, demo_png):
    """(openai client, messages) of a batched server on the family's ORT-form engine dir."""
    from coverpruner.serving import ServerConfig

    config = ServerConfig(str(builds.export(request.param.preset, "ort")), workers=1, threads=1, max_queue=64,
                          model_name="tiny", max_batch=8, batch_context=1024)
    with start_server(config) as url:
        yield (openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120),
               user_message(data_url(demo_png), "Describe the image as JSON."))


def _ask(client, messages, stream: bool, **kwargs) -> tuple[str, str, list | None]:
    """(text, finish_reason, tool_calls) of one request, streamed or not (tool call deltas joined)."""
    if not stream:
        r = client.chat.completions.create(model="tiny", messages=messages, **kwargs)
        calls = r.choices[0].message.tool_calls
        return (r.choices[0].message.content, r.choices[0].finish_reason,
                None if calls is None else [c.model_dump() for c in calls])
    text, finish, calls = [], None, {}
    for chunk in client.chat.completions.create(model="tiny", messages=messages, stream=True, **kwargs):
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "type": None, "function": {"name": "", "arguments": ""}})
                call["id"] = d.id or call["id"]
                call["type"] = d.type or call["type"]
                call["function"]["name"] += (d.function.name or "") if d.function else ""
                call["function"]["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = choice.finish_reason or finish
    return "".join(text), finish, [calls[i] for i in sorted(calls)] or None


@pytest.mark.parametrize("budget", ["full", 8])
def test_json_schema_validates_for_every_seed(served, budget):
    client, messages = served

    def one(args):
        seed, stream = args
        return _ask(client, messages, stream, max_tokens=MAX_TOKENS, temperature=1.0, seed=seed,
                    response_format=FORMAT, extra_body={"budget": budget})

    # 20 seeded samples, the odd seeds streamed (CI time: each seed once), plus seed 0 streamed too
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, [(s, s % 2 == 1) for s in SEEDS] + [(0, True)]))
    for text, finish, _ in answers:
        assert finish == "stop", (finish, text)
        check_scene(text)
    assert answers[-1][0] == answers[0][0]  # streamed and not, one seed gives one answer
    assert len({a[0] for a in answers}) > 5  # the seeds do vary it


def test_json_object_parses_when_complete(served):
    """Any object: nothing bounds its keys or values, so a random-weight sample may run past max_tokens ("length",
    an unfinished prefix; the tiny Qwen engines' byte-level vocabularies mostly do); every one that ends by itself
    parses as an object."""
    client, messages = served
    for seed in range(5):
        text, finish, _ = _ask(client, messages, seed % 2 == 1, max_tokens=MAX_TOKENS, temperature=1.0, seed=seed,
                               response_format={"type": "json_object"}, extra_body={"budget": 8})
        assert finish in ("stop", "length") and text.startswith("{")
        if finish == "stop":
            assert isinstance(json.loads(text), dict)


def test_named_tool(served):
    client, messages = served
    for stream in (False, True):
        text, finish, calls = _ask(client, messages, stream, max_tokens=MAX_TOKENS, tools=[TOOL],
                                   tool_choice={"type": "function", "function": {"name": "locate"}},
                                   extra_body={"budget": 8})
        assert finish == "tool_calls" and not text and len(calls) == 1
        assert calls[0]["type"] == "function" and calls[0]["function"]["name"] == "locate"
        assert calls[0]["id"].startswith("call_")
        check_box(json.loads(calls[0]["function"]["arguments"]))


def test_truncated_json_says_length(served):
    client, messages = served
    text, finish, _ = _ask(client, messages, False, max_tokens=3, response_format=FORMAT, extra_body={"budget": 8})
    assert finish == "length"
    with pytest.raises(ValueError):
        json.loads(text)


def test_required_choice_over_two_tools(served):
    client, messages = served
    other = {"type": "function", "function": {"name": "label", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["kind"],
        "properties": {"kind": SCHEMA["properties"]["kind"]}}}}
    for stream in (False, True):
        text, finish, calls = _ask(client, messages, stream, max_tokens=MAX_TOKENS, tools=[TOOL, other],
                                   tool_choice="required", temperature=1.0, seed=3, extra_body={"budget": 8})
        assert finish == "tool_calls" and not text and len(calls) == 1, (finish, text, calls)
        name, args = calls[0]["function"]["name"], json.loads(calls[0]["function"]["arguments"])
        if name == "locate":
            check_box(args)
        else:
            assert name == "label" and args["kind"] in ("cat", "dog", "bird") and set(args) == {"kind"}


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"tools": [TOOL]}, "tool_choice"),  # no tool_choice with tools is OpenAI's "auto": refused by name
    ({"tools": [TOOL], "tool_choice": "auto"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "minProperties": "x"}}}],
      "tool_choice": "required"}, "tools[0].function.parameters"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_formats_name_their_field(client, demo_png, body, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=user_message(data_url(demo_png)), max_tokens=4,
                                       extra_body={"budget": 8, **body})
    assert info.value.body["param"] == param, info.value.body
    assert "\n" not in info.value.body["message"]


def test_cached_turn_under_a_schema_equals_cache_off(tiny_export, demo_png):
    """Turn 2 of a conversation under a json_schema reuses turn 1's pruned prefix (cached_tokens > 0) and answers
    exactly as a server without the prefix cache."""
    from coverpruner.serving import ServerConfig

    turn1 = user_message(data_url(demo_png), "Describe the image as JSON.")
    answers = {}
    for mb in (256, 0):
        config = ServerConfig(str(tiny_export), workers=1, threads=1, model_name="tiny", prefix_cache_mb=mb)
        with start_server(config) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
            first = client.chat.completions.create(model="tiny", messages=turn1, max_tokens=MAX_TOKENS,
                                                   response_format=FORMAT, extra_body={"budget": 8})
            check_scene(first.choices[0].message.content)
            turn2 = turn1 + [{"role": "assistant", "content": first.choices[0].message.content},
                             {"role": "user", "content": "Again, as JSON."}]
            second = client.chat.completions.create(model="tiny", messages=turn2, max_tokens=MAX_TOKENS,
                                                    response_format=FORMAT, extra_body={"budget": 8})
            check_scene(second.choices[0].message.content)
            answers[mb] = (first.choices[0].message.content, second.choices[0].message.content,
                           second.usage.prompt_tokens_details.cached_tokens)
    assert answers[256][2] > 0 and answers[0][2] == 0
    assert answers[256][:2] == answers[0][:2]
