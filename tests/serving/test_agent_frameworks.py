"""Agent frameworks drive a two-step tool loop against the server as their users write it (docs/clients.md): the
model calls the tool, the framework runs it and sends the result back, the model answers. The openai SDK, LangChain
(bind_tools + ToolMessage), openai-agents (Runner.run with a Chat Completions model and with a Responses model),
pydantic-ai (Agent with one tool) and litellm (tools=), on the tiny Qwen2.5-VL engine with pruning on (budget 8).

Random weights never choose a tool: ``Preference``, an httpx transport under each framework's client, stands in for
a trained model's wish to call a tool while the user's question is unanswered: it adds a logit_bias on <tool_call>
to a request whose last message is the user's (none once a tool result came back), with a -100 on "\n" (what the
template writes between two calls: a trained model that wants one call ends its turn after it); to a request after a
tool result a +4 on <|im_end|> (a trained model answers briefly and ends: openai-agents' Responses model fails a
response cut by max_output_tokens); and the budget to every request. The grammar decides what follows <tool_call>. Each test skips when its library is not installed.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Literal

import httpx
import openai
import pytest

from tests.serving.conftest import start_server
from tests.serving.test_tool_calls import token_id

pytestmark = pytest.mark.slow

QUESTION = "What is the weather in Paris?"
WEATHER_REPORT = "sunny, 21 C"
MAX_TOKENS = 80
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
                                         "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                                                        "properties": {"city": {"enum": ["Paris", "Lyon"]}}}}}


def get_weather(city: Literal["Paris", "Lyon"]) -> str:
    """The weather of a city. (An enum, and strict schemas below, additionalProperties false: random weights write a
    string or further properties without end where the schema allows them.)"""
    return WEATHER_REPORT


def _wants_tool(body: dict) -> bool:
    """Whether the conversation's last turn is the user's (chat messages or /v1/responses input)."""
    turns = body.get("messages", body.get("input"))
    if isinstance(turns, str):
        return True
    last = turns[-1] if turns else {}
    return last.get("role") == "user" and last.get("type", "message") == "message"


class Preference(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """The module docstring's stand-in, around httpx's own transports."""

    def __init__(self, call_token: int, newline: int, end: int):
        self.call_token, self.newline, self.end = call_token, newline, end
        self.sync, self.aio = httpx.HTTPTransport(), httpx.AsyncHTTPTransport()
        self.biased = 0

    def _rewrite(self, request: httpx.Request) -> httpx.Request:
        body = json.loads(request.content)
        body["budget"] = 8
        if _wants_tool(body):
            body["logit_bias"] = {str(self.call_token): 100, str(self.newline): -100}
            self.biased += 1
        else:
            body["logit_bias"] = {str(self.end): 4}
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        return httpx.Request(request.method, request.url, headers=headers, content=json.dumps(body).encode())

    def handle_request(self, request):
        return self.sync.handle_request(self._rewrite(request))

    async def handle_async_request(self, request):
        return await self.aio.handle_async_request(self._rewrite(request))


class Server:
    def __init__(self, url: str, preference: Preference):
        self.url, self.base, self.preference = url, f"{url}/v1", preference

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base, api_key="unused", max_retries=0, timeout=120,
                             http_client=httpx.Client(transport=self.preference, timeout=120))

    def async_client(self) -> openai.AsyncOpenAI:
        """A client for one event loop (asyncio.run): its own connection pool."""
        p = self.preference
        fresh = Preference(p.call_token, p.newline, p.end)
        return openai.AsyncOpenAI(base_url=self.base, api_key="unused", max_retries=0, timeout=120,
                                  http_client=httpx.AsyncClient(transport=fresh, timeout=120))


@pytest.fixture(scope="module")
def server(builds):
    from coverpruner.serving import ServerConfig

    engine = builds.export("qwen2.5-vl-tiny", "ort")
    with start_server(ServerConfig(str(engine), workers=1, threads=1, model_name="tiny")) as url:
        yield Server(url, Preference(token_id(engine, "<tool_call>"), token_id(engine, "\n"),
                                     token_id(engine, "<|im_end|>")))


def test_openai_sdk_loop(server):
    client = server.client()
    messages = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model="tiny", messages=messages, tools=[TOOL], max_tokens=MAX_TOKENS)
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": get_weather(**json.loads(call.function.arguments))}]
    final = client.chat.completions.create(model="tiny", messages=messages, tools=[TOOL], max_tokens=MAX_TOKENS)
    assert final.choices[0].finish_reason in ("stop", "length") and final.choices[0].message.content
    assert final.usage.prompt_tokens_details.cached_tokens > 0


def test_langchain_bind_tools_loop(server):
    pytest.importorskip("langchain_openai", reason="langchain-openai is not installed")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    weather = tool(get_weather)
    llm = ChatOpenAI(model="tiny", base_url=server.base, api_key="unused", max_retries=0, max_tokens=MAX_TOKENS,
                     http_client=httpx.Client(transport=server.preference, timeout=120)).bind_tools([weather], strict=True)
    history = [HumanMessage(QUESTION)]
    ai = llm.invoke(history)
    assert [c["name"] for c in ai.tool_calls] == ["get_weather"], ai
    history += [ai, ToolMessage(weather.invoke(ai.tool_calls[0]["args"]), tool_call_id=ai.tool_calls[0]["id"])]
    final = llm.invoke(history)
    assert not final.tool_calls and final.content


@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_openai_agents_runner(server, kind):
    pytest.importorskip("agents", reason="openai-agents is not installed")
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner,
                        function_tool, set_tracing_disabled)
    from agents.items import ToolCallItem, ToolCallOutputItem

    set_tracing_disabled(True)
    make = OpenAIChatCompletionsModel if kind == "chat" else OpenAIResponsesModel
    agent = Agent(name="camera", instructions="Answer with the tools.", tools=[function_tool(get_weather)],
                  model=make(model="tiny", openai_client=server.async_client()),
                  model_settings=ModelSettings(max_tokens=MAX_TOKENS))
    result = asyncio.run(Runner.run(agent, QUESTION, max_turns=3))
    kinds = [type(item) for item in result.new_items]
    assert ToolCallItem in kinds and ToolCallOutputItem in kinds, result.new_items
    outputs = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    assert outputs == [WEATHER_REPORT] and isinstance(result.final_output, str) and result.final_output


def test_pydantic_ai_agent(server):
    pytest.importorskip("pydantic_ai", reason="pydantic-ai is not installed")
    from pydantic_ai import Agent, Tool
    from pydantic_ai.messages import ToolCallPart, ToolReturnPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("tiny", provider=OpenAIProvider(openai_client=server.async_client()))
    agent = Agent(model, output_type=str, tools=[Tool(get_weather, strict=True)], model_settings={"max_tokens": MAX_TOKENS})
    result = agent.run_sync(QUESTION)
    parts = [p for m in result.all_messages() for p in m.parts]
    assert any(isinstance(p, ToolCallPart) and p.tool_name == "get_weather" for p in parts), parts
    assert any(isinstance(p, ToolReturnPart) and p.content == WEATHER_REPORT for p in parts), parts
    assert isinstance(result.output, str) and result.output


def test_litellm_tools(server):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of the price list
    litellm = pytest.importorskip("litellm", reason="litellm is not installed")
    common = dict(model="openai/tiny", api_base=server.base, api_key="unused", tools=[TOOL], max_tokens=MAX_TOKENS,
                  client=server.client())
    messages = [{"role": "user", "content": QUESTION}]
    first = litellm.completion(messages=messages, **common)
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": get_weather(**json.loads(call.function.arguments))}]
    final = litellm.completion(messages=messages, **common)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls
