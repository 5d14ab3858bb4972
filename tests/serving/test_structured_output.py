"""Issue 30 part A through the official openai client on every family's tiny random-weight engine: response_format
json_schema / json_object and forced tool calls are generated under llguidance's token masks (runtime/grammar.py),
so even random weights answer JSON that parses and validates; a cached conversation turn under a schema equals the
same turn on a cache-off server.

Cost: one batched server (8 slots, ORT-form decoder) per family; each of the 20 seeds is sampled streamed and not
(the 40 requests sent at once, so they batch) per budget under the schema and once under json_object; the schema
bounds every value (enum, maxItems, maxLength, number and integer ranges) so that the seeded samples close within
max_tokens (the longest measured: 77 of its 160 tokens).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import openai
import pytest

from tests.family_matrix import STANDARD_MATRIX
from tests.serving.conftest import data_url, start_server, thinking_off, thinking_switch, user_message

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


class Served(NamedTuple):
    client: openai.OpenAI
    messages: list
    engine: Path  # the engine dir (its tokenizer.json: token ids for logit_bias)

    def body(self, budget) -> dict:
        """extra_body of a request: the budget, and the thinking off where the template has the switch (the
        format applies to the content, after any thinking: test_schema_applies_after_the_thinking)."""
        return {"budget": budget, **thinking_off(self.engine)}


@pytest.fixture(scope="module", params=STANDARD_MATRIX, ids=[e.name for e in STANDARD_MATRIX])
def served(request, builds, demo_png) -> Served:
    """A batched server on the family's ORT-form engine dir (KV room for the longest full-budget prompt, Qwen3.5's
    930 tokens, and MAX_TOKENS)."""
    from coverpruner.serving import ServerConfig

    engine = builds.export(request.param.preset, "ort")
    config = ServerConfig(str(engine), workers=1, threads=1, max_queue=64, model_name="tiny", max_batch=8,
                          batch_context=1152)
    with start_server(config) as url:
        yield Served(openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120),
                     user_message(data_url(demo_png), "Describe the image as JSON."), engine)


def token_id(engine: Path, text: str) -> int:
    """The id of the one token that is exactly `text` in the engine dir's tokenizer (read with the tokenizers
    library, not the server's code)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(engine / "tokenizer.json"))
    tid = tokenizer.token_to_id(text)
    assert tid is not None and tokenizer.decode([tid]) == text, (text, tid)
    return tid


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


def _both_ways(client, messages, **kwargs) -> dict[int, tuple]:
    """{seed: ((text, finish) non-streamed, (text, finish) streamed)} of every seed of SEEDS, all 2 * 20 requests
    sent at once (the server batches them 8 at a time)."""
    def one(args):
        seed, stream = args
        return _ask(client, messages, stream, temperature=1.0, seed=seed, **kwargs)[:2]

    jobs = [(seed, stream) for seed in SEEDS for stream in (False, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = dict(zip(jobs, pool.map(one, jobs)))
    return {seed: (answers[seed, False], answers[seed, True]) for seed in SEEDS}


@pytest.mark.parametrize("budget", ["full", 8])
def test_json_schema_validates_for_every_seed(served, budget):
    """Every seed, streamed and not: the answer ends by itself, parses, validates, and is the same both ways."""
    client, messages, _ = served
    answers = _both_ways(client, messages, max_tokens=MAX_TOKENS, response_format=FORMAT,
                         extra_body=served.body(budget))
    for seed, (plain, streamed) in answers.items():
        for text, finish in (plain, streamed):
            assert finish == "stop", (seed, finish, text)
            check_scene(text)
        assert streamed == plain, seed  # one seed gives one answer, streamed or not
    assert len({plain[0] for plain, _ in answers.values()}) > 5  # the seeds do vary it


def test_schema_applies_after_the_thinking(served):
    """With the thinking on (the template's default), response_format constrains the answer after the reasoning
    closes, as vLLM's reasoning parsers do: the grammar lets the reasoning run free up to its closing marker, then
    asks for the schema. A random model never chooses to close its thinking; logit_bias +100 on the one token
    "</think>" (looked up in the engine dir's tokenizer) stands in for a trained model's wish to. So the content of
    every answer is a valid scene (a grammar from the first token would mask "</think>": the JSON would stay in the
    reasoning and the content would be empty), streamed and not alike."""
    if not thinking_switch(served.engine):
        pytest.skip("the chat template has no thinking switch (enable_thinking): its prompt opens no thinking")
    client, messages, engine = served
    bias = {str(token_id(engine, "</think>")): 100.0}
    for seed in range(2):
        kw = dict(model="tiny", messages=messages, max_tokens=MAX_TOKENS, response_format=FORMAT, logit_bias=bias,
                  temperature=1.0, seed=seed, extra_body={"budget": 8})
        r = client.chat.completions.create(**kw).choices[0]
        assert r.finish_reason == "stop", (r.finish_reason, r.message)
        check_scene(r.message.content)
        assert not (r.message.model_extra or {}).get("reasoning_content")  # closed at once: the bias is +100
        streamed = [c.delta.content or "" for chunk in client.chat.completions.create(**kw, stream=True)
                    for c in chunk.choices]
        assert "".join(streamed) == r.message.content

def test_json_object_parses_when_complete(served):
    """Any object: nothing bounds its keys or values, so a random-weight sample may run past max_tokens ("length",
    an unfinished prefix; the tiny Qwen engines' byte-level vocabularies mostly do); every one that ends by itself
    parses as an object."""
    client, messages, _ = served

    def one(seed):
        return _ask(client, messages, seed % 2 == 1, max_tokens=MAX_TOKENS, temperature=1.0, seed=seed,
                    response_format={"type": "json_object"}, extra_body=served.body(8))

    with ThreadPoolExecutor(5) as pool:
        for text, finish, _ in pool.map(one, range(5)):
            assert finish in ("stop", "length") and text.startswith("{")
            if finish == "stop":
                assert isinstance(json.loads(text), dict)


#: logit_bias on the tokens that close a string or an array ('"', ']') and an object ('}')
#: (test_json_object_parses_for_every_seed). '"' also opens a key, so right after '{' the object's '}' competes with
#: it: with one push on both, a model that happens to prefer '}' there answers {} for every seed (the tiny Qwen3.5's
#: random weights: P('}') ~ 10 x P('"'-led tokens) after '{'). Measured on the six tiny engines (20 seeds, budget 8):
#: +6 / +6 left Qwen3.5 with 0 keyed answers of 20 (the others 11..20); +6 / +3 ends every answer within 106 of the
#: 160 tokens (Gemma 3; the others within 71) with keys in 11..20 of 20 on each
CLOSING_BIAS = {'"': 6.0, "]": 6.0, "}": 3.0}


def test_json_object_parses_for_every_seed(served):
    """json_object answers that end and parse for every seed, streamed and not, on every family.

    A random-weight model has no preference for closing what it opened: inside a JSON string (no maxLength in "any
    object") it writes on until max_tokens, so test_json_object_parses_when_complete can only check the answers that
    happen to end. A trained model prefers to close; OpenAI's logit_bias (CLOSING_BIAS on the ids of '"', ']' and
    '}', looked up in the engine dir's tokenizer) stands in for that preference here. The bias only reweighs the
    tokens the grammar allows (runtime/sampling.py masks after the bias): what may follow is still llguidance's
    json_object grammar, the format clients asked for, unchanged. So every answer must end by itself
    (finish "stop"), parse as a JSON object, and be the same streamed and not; some carry keys and values (the bias
    does not just close the object at once) and the seeds vary them. The bias also presses on the mask: a '"', ']'
    or '}' that the grammar wrongly allowed would be taken, and the answer would not parse.

    Not chosen: bounding json_object's strings inside the grammar (llguidance's JSON options set separators and
    whitespace only; a maxLength would change what "any JSON object" means to clients), and greedy decoding (a
    random model's argmax may as well repeat a string's token until max_tokens: nothing makes it end)."""
    client, messages, engine = served
    bias = {str(token_id(engine, c)): b for c, b in CLOSING_BIAS.items()}
    answers = _both_ways(client, messages, max_tokens=MAX_TOKENS, response_format={"type": "json_object"},
                         logit_bias=bias, extra_body=served.body(8))
    objects = []
    for seed, (plain, streamed) in answers.items():
        for text, finish in (plain, streamed):
            assert finish == "stop", (seed, finish, text)
            assert isinstance(json.loads(text), dict), (seed, text)
        assert streamed == plain, seed
        objects.append(json.loads(plain[0]))
    assert any(objects) and len({json.dumps(o) for o in objects}) > 5, objects


def test_named_tool(served):
    client, messages, _ = served
    for stream in (False, True):
        text, finish, calls = _ask(client, messages, stream, max_tokens=MAX_TOKENS, tools=[TOOL],
                                   tool_choice={"type": "function", "function": {"name": "locate"}},
                                   parallel_tool_calls=False, extra_body=served.body(8))
        assert finish == "tool_calls" and not text and len(calls) == 1
        assert calls[0]["type"] == "function" and calls[0]["function"]["name"] == "locate"
        assert calls[0]["id"].startswith("call_")
        check_box(json.loads(calls[0]["function"]["arguments"]))


def test_truncated_json_says_length(served):
    client, messages, _ = served
    text, finish, _ = _ask(client, messages, False, max_tokens=3, response_format=FORMAT, extra_body=served.body(8))
    assert finish == "length"
    with pytest.raises(ValueError):
        json.loads(text)


def test_required_choice_over_two_tools(served):
    client, messages, _ = served
    other = {"type": "function", "function": {"name": "label", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["kind"],
        "properties": {"kind": SCHEMA["properties"]["kind"]}}}}
    for stream in (False, True):
        text, finish, calls = _ask(client, messages, stream, max_tokens=MAX_TOKENS, tools=[TOOL, other],
                                   tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=3,
                                   extra_body=served.body(8))
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
    ({"tools": [TOOL]}, "tool_choice"),  # OpenAI's "auto" on LLaVA, whose template renders no tools: refused
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


def test_refusals_say_why(client, demo_png):
    """LLaVA's template renders no tools: "auto" is refused saying so; a forced call whose tool names the tiny
    vocabulary cannot spell ("_") is refused at admission naming the name and the vocabulary, not response_format."""
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
             for name in ("get_weather", "final_result")]
    for body, param, words in [({"tools": tools}, "tool_choice", "renders no tools"),
                               ({"tools": tools, "tool_choice": "required"}, "tools[0].function.name",
                                "vocabulary cannot write '_'")]:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny", messages=user_message(data_url(demo_png)), max_tokens=4,
                                           **body)
        assert info.value.body["param"] == param and words in info.value.body["message"], info.value.body


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
