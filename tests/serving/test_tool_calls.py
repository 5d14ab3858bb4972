"""Issue 36 through the official openai client on the tiny Qwen2.5-VL and Qwen3-VL engines: tools with the default
tool_choice ("auto"), a call constrained by the tool plan's grammar (runtime/tool_calls.py) once the model opens it,
streamed as OpenAI streams tool-call deltas, the round trip (the assistant's call and the tool's result sent back)
and parallel_tool_calls; the answers equal the same requests on a --max-batch 1 --prefix-cache-mb 0 server.

Random weights never choose a tool by themselves: a logit_bias on the family's call-opening token (<tool_call>, one
token of the vocabulary) stands in for a trained model's preference; the grammar decides what follows it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import openai
import pytest

from tests.serving.conftest import data_url, start_server, user_message

pytest.importorskip("llguidance", reason="tool calls are generated under llguidance's masks (serve extra)")
pytestmark = pytest.mark.slow

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"type": "string", "maxLength": 8},
                          "days": {"type": "integer", "minimum": 0, "maximum": 9}}}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
                                         "parameters": WEATHER}}
MAX_TOKENS = 64
QWEN_PRESETS = ("qwen2.5-vl-tiny", "qwen3-vl-tiny")


def check_weather(arguments: str) -> dict:
    """The call's arguments parse and validate against WEATHER (jsonschema when installed, else each rule)."""
    value = json.loads(arguments)
    try:
        import jsonschema
    except ImportError:
        assert set(value) == {"city", "days"} and isinstance(value["city"], str) and len(value["city"]) <= 8
        assert isinstance(value["days"], int) and not isinstance(value["days"], bool) and 0 <= value["days"] <= 9
    else:
        jsonschema.validate(value, WEATHER)
    return value


class Served(NamedTuple):
    client: openai.OpenAI  # a batched server with the prefix cache
    plain: openai.OpenAI  # --max-batch 1 --prefix-cache-mb 0
    messages: list
    call_token: int  # the id of <tool_call> (read with the tokenizers library)
    newline: int  # the id of "\n" alone (what Qwen's template writes between two calls)


def token_id(engine: Path, text: str) -> int:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(engine / "tokenizer.json"))
    tid = tokenizer.token_to_id(text)
    if tid is None:  # byte-level: "\n" is the piece "Ċ"
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert len(ids) == 1, (text, ids)
        tid = ids[0]
    assert tokenizer.decode([tid], skip_special_tokens=False) == text, (text, tid)
    return tid


@pytest.fixture(scope="module", params=QWEN_PRESETS)
def served(request, builds, demo_png) -> Served:
    from coverpruner.serving import ServerConfig

    engine = builds.export(request.param, "ort")
    batched = ServerConfig(str(engine), workers=1, threads=1, max_queue=64, model_name="tiny", max_batch=4,
                           batch_context=1024)
    plain = ServerConfig(str(engine), workers=1, threads=1, max_queue=64, model_name="tiny", max_batch=1,
                         prefix_cache_mb=0)
    with start_server(batched) as url, start_server(plain) as plain_url:
        yield Served(*(openai.OpenAI(base_url=f"{u}/v1", api_key="unused", max_retries=0, timeout=120)
                       for u in (url, plain_url)),
                     user_message(data_url(demo_png), "What is the weather where this was taken?"),
                     token_id(engine, "<tool_call>"), token_id(engine, "\n"))


def ask(client, messages, stream: bool, **kwargs) -> tuple[str | None, str, list, object]:
    """(content, finish_reason, tool_calls as dicts, usage) of one request, streamed or not (deltas joined as the
    openai SDK's users join them)."""
    if not stream:
        r = client.chat.completions.create(model="tiny", messages=messages, **kwargs)
        m = r.choices[0].message
        return m.content, r.choices[0].finish_reason, [c.model_dump() for c in m.tool_calls or []], r.usage
    text, finish, calls, usage = [], None, {}, None
    for chunk in client.chat.completions.create(model="tiny", messages=messages, stream=True,
                                                stream_options={"include_usage": True}, **kwargs):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            for d in choice.delta.tool_calls or []:
                if d.index not in calls:  # OpenAI's first delta of a call: id, type and the whole name
                    assert d.id and d.type == "function" and d.function.name, d
                    calls[d.index] = {"id": d.id, "type": "function",
                                      "function": {"name": d.function.name, "arguments": ""}}
                else:
                    assert d.id is None and not (d.function and d.function.name), d
                calls[d.index]["function"]["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = choice.finish_reason or finish
    return "".join(text) or None, finish, [calls[i] for i in sorted(calls)], usage


def _without_ids(calls: list) -> list:
    return [c["function"] for c in calls]


def test_auto_without_bias_answers_text_or_a_valid_call(served):
    """tools with no tool_choice (OpenAI's "auto"): 200, either text or calls whose arguments validate."""
    for budget in (8, "full"):
        content, finish, calls, _ = ask(served.client, served.messages, False, tools=[TOOL], max_tokens=24,
                                        extra_body={"budget": budget})
        assert finish in ("stop", "length", "tool_calls")
        assert calls or content
        for call in calls:
            assert call["function"]["name"] == "get_weather"
            check_weather(call["function"]["arguments"])


@pytest.mark.parametrize("budget", [8, "full"])
def test_biased_call_streamed_and_not_and_the_round_trip(served, budget):
    """With the bias the answer is one call (parallel_tool_calls false) whose arguments validate, the same streamed
    and not and on the plain server; the call and a tool result sent back give 200, an answer and cached rows."""
    kwargs = dict(tools=[TOOL], max_tokens=MAX_TOKENS, logit_bias={str(served.call_token): 100},
                  parallel_tool_calls=False, extra_body={"budget": budget})
    got = [ask(client, served.messages, stream, **kwargs) for client in (served.client, served.plain)
           for stream in (False, True)]
    for content, finish, calls, _ in got:
        assert finish == "tool_calls" and content is None and len(calls) == 1, (content, finish, calls)
        assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
        check_weather(calls[0]["function"]["arguments"])
    assert all(_without_ids(g[2]) == _without_ids(got[0][2]) for g in got)

    call = got[0][2][0]
    history = served.messages + [{"role": "assistant", "content": None, "tool_calls": [call]},
                                 {"role": "tool", "tool_call_id": call["id"], "content": '{"sky": "clear"}'}]
    answers = [ask(client, history, stream, tools=[TOOL], max_tokens=12, extra_body={"budget": budget})
               for client in (served.client, served.plain) for stream in (False, True)]
    assert all(a[:3] == answers[0][:3] for a in answers), answers
    assert answers[0][1] in ("stop", "length", "tool_calls")
    cached = answers[0][3].prompt_tokens_details.cached_tokens
    first = got[0][3]
    # the first turn's prompt blocks (16 rows each) all serve the second, and the answer's blocks up to where the
    # re-tokenized call first differs from the tokens the model chose (random weights may spell a string with other
    # pieces than the tokenizer's; measured: all of the answer's blocks in 3 of the 4 cases)
    assert cached > 16 * (first.model_extra["prefill_tokens"] // 16), (cached, first)
    assert (answers[2][3].prompt_tokens_details.cached_tokens or 0) == 0  # the plain server caches nothing


def test_parallel_calls(served):
    """parallel_tool_calls true: with the newline between calls biased too the model writes several calls in one
    turn (each valid, each its own id); false: one call and the answer ends."""
    bias = {str(served.call_token): 100, str(served.newline): 8}
    for stream in (False, True):
        _, finish, calls, _ = ask(served.client, served.messages, stream, tools=[TOOL], max_tokens=96,
                                  logit_bias=bias, extra_body={"budget": 8})
        assert len(calls) >= 2, (finish, calls)
        complete = calls if finish == "tool_calls" else calls[:-1]
        for call in complete:
            check_weather(call["function"]["arguments"])
        assert len({c["id"] for c in calls}) == len(calls)
        _, finish, calls, _ = ask(served.client, served.messages, stream, tools=[TOOL], max_tokens=96,
                                  logit_bias=bias, parallel_tool_calls=False, extra_body={"budget": 8})
        assert finish == "tool_calls" and len(calls) == 1


def test_round_trip_errors(served):
    """A tool message must answer a call of the assistant turn before it; each refusal names its field."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "x"}'}}
    cases = [
        ([{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "call_2", "content": "r"}],
         "messages[2].tool_call_id"),
        ([{"role": "assistant", "content": "hi"}, {"role": "tool", "tool_call_id": "call_1", "content": "r"}],
         "messages[2].tool_call_id"),
        ([{"role": "assistant", "tool_calls": [{**call, "function": {"name": "get_weather", "arguments": "{"}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "r"}], "messages[1].tool_calls[0].function.arguments"),
    ]
    for tail, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            served.client.chat.completions.create(model="tiny", messages=served.messages + tail, tools=[TOOL],
                                                  max_tokens=4)
        assert err.value.body["param"] == param, err.value.body


def test_responses_function_call_and_round_trip(served):
    """/v1/responses: a function tool, the biased call as a function_call item (streamed: output_item.added with
    the name, function_call_arguments.delta pieces, .done), equal to chat's call; the call and its
    function_call_output sent back give a message item."""
    tool = {"type": "function", "name": "get_weather", "description": "The weather of a city", "parameters": WEATHER}
    image, text = served.messages[0]["content"]
    given = [{"role": "user", "content": [{"type": "input_image", "image_url": image["image_url"]["url"]},
                                          {"type": "input_text", "text": text["text"]}]}]
    extra = {"logit_bias": {str(served.call_token): 100}, "budget": 8}
    resp = served.client.responses.create(model="tiny", input=given, tools=[tool], parallel_tool_calls=False,
                                          max_output_tokens=MAX_TOKENS, extra_body=extra)
    assert resp.status == "completed" and [o.type for o in resp.output] == ["function_call"], resp.output
    call = resp.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    check_weather(call.arguments)
    _, _, chat_calls, _ = ask(served.client, served.messages, False, tools=[TOOL], max_tokens=MAX_TOKENS,
                              parallel_tool_calls=False, logit_bias=extra["logit_bias"], extra_body={"budget": 8})
    assert chat_calls[0]["function"] == {"name": call.name, "arguments": call.arguments}

    events = list(served.client.responses.create(model="tiny", input=given, tools=[tool], parallel_tool_calls=False,
                                                 max_output_tokens=MAX_TOKENS, stream=True, extra_body=extra))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"], kinds
    assert events[2].item.type == "function_call" and events[2].item.name == "get_weather"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == call.arguments and len(done) == 1 and done[0].arguments == call.arguments
    assert kinds[-2:] == ["response.output_item.done", "response.completed"]
    assert events[-1].response.output[0].arguments == call.arguments

    back = given + [{"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                    {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'}]
    answer = served.client.responses.create(model="tiny", input=back, tools=[tool], max_output_tokens=8,
                                            extra_body={"budget": 8})
    assert answer.output and answer.output[0].type in ("message", "function_call")
    assert answer.usage.input_tokens_details.cached_tokens > 0
