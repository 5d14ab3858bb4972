"""/v1/responses: the body translated into a chat request (serving.schema's ChatCompletionRequest) and answered by
the chat path and the same engine loop; only the shapes differ.

Request: ``input`` a string or a list of items: messages (content a string or input_text / input_image parts; an
assistant's output_text parts), ``function_call`` items (the model's earlier calls: {call_id, name, arguments}),
``function_call_output`` items (a tool's result: {call_id, output}) and ``reasoning`` items (an earlier turn's
thinking); ``instructions`` (a system message first), ``max_output_tokens``, ``temperature``, ``top_p``, function
``tools`` ({"type": "function", "name", "description", "parameters"}), ``tool_choice`` ("auto", "none",
"required" or {"type": "function", "name"}), ``parallel_tool_calls``, and chat's extra fields (logit_bias, budget,
...). A function_call item joins the assistant message just before it (one turn: its text and its calls), a
function_call_output item is a chat ``tool`` message: the chat template renders them as chat's.

Response: the output items of the answer as runtime/answer_parts.py splits it (serving/tools.py): a ``reasoning``
item (a thinking model's), a ``message`` item (its text; also when it is empty and no call was made) and one
``function_call`` item per call. Streamed: response.created, response.in_progress, then per item
response.output_item.added, its deltas (response.reasoning_text.delta, response.content_part.added +
response.output_text.delta, response.function_call_arguments.delta), their .done events and
response.output_item.done, then response.completed (response.incomplete when max_output_tokens cut it).

Fields this server cannot honour get a 400 naming the field and why (RESPONSE_REFUSED).
"""

from __future__ import annotations

import copy
import json
import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from coverpruner.serving.choices import Delta, End
from coverpruner.serving.errors import APIError, bad_request
from coverpruner.runtime.answer_parts import AnswerSplitter
from coverpruner.runtime.messages import MAX_PARTS
from coverpruner.serving.tools import call_id

#: /v1/responses fields refused -> why; a null (or the value that asks for nothing, RESPONSE_OFF) is taken
RESPONSE_REFUSED = {
    "previous_response_id": "this server stores no responses; send the whole conversation in input",
    "conversation": "this server stores no conversations; send the whole conversation in input",
    "background": "background responses are not supported",
    "reasoning": "this model has no reasoning settings",
    "include": "no extra output items are produced",
    "prompt": "stored prompt templates are not supported",
    "text": "only text output (text.format type 'text') is offered on /v1/responses",
    "truncation": "the server never truncates input (only 'disabled')",
    "top_logprobs": "logprobs are offered on /v1/chat/completions and /v1/completions",
    "max_tool_calls": "a bound on tool calls is not supported (parallel_tool_calls false: at most one per answer)",
}
RESPONSE_OFF = {"background": False, "include": [], "text": {"format": {"type": "text"}}, "truncation": "disabled",
                "top_logprobs": 0}
#: /v1/responses fields taken that change nothing here
RESPONSE_NOOP = ("metadata", "store", "user", "service_tier", "safety_identifier", "prompt_cache_key")
#: request settings the response object repeats
ECHO = ("instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls")


def _refuse(body: dict) -> None:
    for name in sorted(set(body) & set(RESPONSE_REFUSED)):
        value = body.pop(name)
        if value is not None and value != RESPONSE_OFF.get(name, None):
            raise bad_request(f"{name} is not supported: {RESPONSE_REFUSED[name]}", name)


def _content(content, param: str):
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{param} must be a string or a list of content parts", param)
    parts = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text"):
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{kind} part needs a string field 'text'", f"{where}.text")
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise bad_request("input_image part needs image_url (a URL or data: URL string; file_id is not "
                                  "supported)", f"{where}.image_url")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise bad_request(f"content part type {kind!r} is not supported; expected 'input_text', "
                              "'input_image' or (assistant) 'output_text'", f"{where}.type")
    return parts


def _string(item: dict, name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise bad_request(f"{where}.{name} must be a non-empty string", f"{where}.{name}")
    return value


def _messages(items: list) -> list[dict]:
    """input items -> chat messages (module docstring); 400 naming input[i] for an item that cannot be taken."""
    messages, reasoning = [], None
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else type(item).__name__
        if kind == "message":
            if item.get("role") not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"{where}.role {item.get('role')!r} is not supported; expected user, system, "
                                  "developer or assistant", f"{where}.role")
            messages.append({"role": item["role"], "content": _content(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where), "arguments": item.get("arguments", "{}")}}
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant" or reasoning is not None:
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                             "content": _content(output, f"{where}.output") if output is not None else ""})
        elif kind == "reasoning":
            texts = item.get("content") or item.get("summary") or []
            reasoning = "".join(t.get("text", "") for t in texts if isinstance(t, dict))
            continue
        else:
            raise bad_request(f"input item type {kind!r} is not supported; expected message, function_call, "
                              "function_call_output or reasoning", f"{where}.type")
        if reasoning is not None and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning_content"] = reasoning
        reasoning = None
    return messages


def _tools(tools) -> list:
    """Responses' function tools ({"type": "function", "name", "description", "parameters", "strict"}) -> chat's
    ({"type": "function", "function": {...}}); 400 naming tools[i] for another kind of tool."""
    if not isinstance(tools, list):
        raise bad_request("tools must be a list of function tools", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise bad_request(f"tools[{i}].type {kind!r} is not supported: only function tools are offered",
                              f"tools[{i}].type")
        fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice):
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def response_body(body: dict) -> dict:
    """A /v1/responses body -> a chat body (400 naming the field for what cannot be taken)."""
    body = dict(body)
    _refuse(body)
    for name in RESPONSE_NOOP:
        body.pop(name, None)
    given = body.pop("input", None)
    if isinstance(given, str):
        messages = [{"role": "user", "content": given}]
    elif isinstance(given, list) and given:
        if len(given) > MAX_PARTS:  # before any item is translated: each is a message or a part of one
            raise bad_request(f"input holds {len(given):,} items; at most {MAX_PARTS:,} per request", "input",
                              "too_many_parts")
        messages = _messages(given)
    else:
        raise bad_request("input must be a string or a non-empty list of items", "input")
    instructions = body.pop("instructions", None)
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("instructions must be a string", "instructions")
        messages.insert(0, {"role": "system", "content": instructions})
    if "max_output_tokens" in body:
        body["max_tokens"] = body.pop("max_output_tokens")
    if body.get("tools") is not None:
        body["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        body["tool_choice"] = _tool_choice(body["tool_choice"])
    return {**body, "messages": messages}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _Items:
    """The output items of one answer, built from its split parts (runtime/answer_parts.py) and, when ``ev`` is
    given, streamed as events as they open, grow and close (push yields them; None without ``ev``)."""

    def __init__(self, request, ev=None):
        self.splitter, self.ev = AnswerSplitter(request.tool_plan, request.reasoning), ev
        self.items: list[dict] = []
        self.open: dict | None = None

    def push(self, text: str, end: bool = False):
        parts = self.splitter.push(text) if not end else self.splitter.finish()
        for part in parts:
            yield from self._reasoning_first()
            yield from self._part(part)
        if end:
            yield from self._reasoning_first()
            yield from self._close()
            if not any(item["type"] == "message" for item in self.items) and not self.splitter.calls:
                yield from self._start("message")
                yield from self._close()

    def _reasoning_first(self):
        """A thinking answer's output starts with its reasoning item (empty when the model closed it at once)."""
        if self.splitter.reasoning_format is not None and not self.items:
            yield from self._start("reasoning")

    def _part(self, part):
        if part.kind == "call":
            yield from self._close()
            yield from self._start("function_call", part.name)
        elif part.kind == "arguments":
            self.open["arguments"] += part.text
            yield self._event("response.function_call_arguments.delta", delta=part.text)
        elif part.kind == "reasoning":
            if self.open is None or self.open["type"] != "reasoning":
                yield from self._close()
                yield from self._start("reasoning")
            self.open["content"][0]["text"] += part.text
            yield self._event("response.reasoning_text.delta", content_index=0, delta=part.text)
        else:
            if self.open is None or self.open["type"] != "message":
                yield from self._close()
                yield from self._start("message")
            self.open["content"][0]["text"] += part.text
            yield self._event("response.output_text.delta", content_index=0, delta=part.text, logprobs=[])

    def _start(self, kind: str, name: str = ""):
        if kind == "message":
            item = {"type": "message", "id": _new_id("msg"), "status": "in_progress", "role": "assistant",
                    "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}
        elif kind == "reasoning":
            item = {"type": "reasoning", "id": _new_id("rs"), "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}
        else:
            item = {"type": "function_call", "id": _new_id("fc"), "call_id": call_id(), "name": name,
                    "arguments": "", "status": "in_progress"}
        self.open = item
        self.items.append(item)
        shown = {**item, "content": []} if kind == "message" else item
        yield self._event("response.output_item.added", item=copy.deepcopy(shown), with_item=False)
        if kind == "message":
            yield self._event("response.content_part.added", content_index=0,
                              part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})

    def _close(self):
        item, self.open = self.open, None
        if item is None:
            return
        item["status"] = "completed"
        if item["type"] == "message":
            part = item["content"][0]
            yield self._event("response.output_text.done", content_index=0, text=part["text"], logprobs=[],
                              at=item)
            yield self._event("response.content_part.done", content_index=0, part=part, at=item)
        elif item["type"] == "reasoning":
            yield self._event("response.reasoning_text.done", content_index=0, text=item["content"][0]["text"],
                              at=item)
        else:
            yield self._event("response.function_call_arguments.done", arguments=item["arguments"],
                              name=item["name"], at=item)
        yield self._event("response.output_item.done", item=item, with_item=False, at=item)

    def _event(self, kind: str, with_item: bool = True, at: dict | None = None, **fields):
        if self.ev is None:
            return None
        item = at or self.open
        where = {"output_index": self.items.index(item)}
        if with_item:
            where["item_id"] = item["id"]
        return self.ev(kind, **where, **fields)


def _response_object(meta, rid: str, status: str, items: list | None, result=None, chat=None,
                     request: dict | None = None) -> dict:
    out = {"id": rid, "object": "response", "created_at": meta.created, "status": status, "model": meta.model,
           "error": None, "incomplete_details": None, "output": items or [], "parallel_tool_calls": True,
           "tool_choice": "auto", "tools": [], "metadata": {}, "text": {"format": {"type": "text"}},
           "truncation": "disabled", **{k: v for k, v in (request or {}).items() if v is not None}}
    if result is not None:
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        usage = chat.usage([result])
        out["usage"] = {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
                        "total_tokens": usage.total_tokens,
                        "input_tokens_details": {"cached_tokens": int(result.cached_tokens)},
                        "output_tokens_details": {"reasoning_tokens": 0}}
        out["coverpruner"] = chat.coverpruner(result)
    return out


def response_render(chat, echo: dict):
    """(complete, stream) of /v1/responses; echo: request settings the response object repeats."""

    def status(end: End) -> str:
        return "incomplete" if chat.finish_reason(end) == "length" else "completed"

    async def complete(state, job, gen, event, meta):
        got = await chat.collect(state, job, gen, event)
        if got is None:
            return Response(status_code=499)
        (c,) = got
        items = _Items(gen.request)
        for _ in items.push(c.text):
            pass
        for _ in items.push("", end=True):
            pass
        return JSONResponse(_response_object(meta, meta.id.replace("chatcmpl-", "resp_"), status(c.end),
                                             items.items, c.end.result, chat, echo))

    async def stream(state, job, gen, event, meta, timer=None):
        rid = meta.id.replace("chatcmpl-", "resp_")
        seq = iter(range(1 << 62))

        def ev(kind: str, **fields) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(seq), **fields})}\n\n"

        items = _Items(gen.request, ev)
        try:
            yield ev("response.created", response=_response_object(meta, rid, "in_progress", None, request=echo))
            yield ev("response.in_progress", response=_response_object(meta, rid, "in_progress", None,
                                                                        request=echo))
            async for item in chat.answers(state, job, gen, event):
                if item is None:
                    break
                if isinstance(item, APIError):
                    state.count_error(item)
                    yield ev("error", code=item.code, message=item.message, param=item.param)
                    break
                if isinstance(item, Delta):
                    for line in items.push(item.text or ""):
                        yield line
                    continue
                for line in items.push("", end=True):
                    yield line
                done = _response_object(meta, rid, status(item), items.items, item.result, chat, echo)
                yield ev("response.completed" if done["status"] == "completed" else "response.incomplete",
                         response=done)
        finally:
            if timer is not None:
                timer.cancel()
            job.cancel()

    return complete, stream


async def responses(request: Request, body: dict, serve, chat):
    """POST /v1/responses. The body is translated and validated in a worker thread (as chat's: its input items are
    walked one by one), so the event loop keeps answering meanwhile."""
    arrived = time.monotonic()
    echo = {k: body.get(k) for k in ECHO}
    req = await run_in_threadpool(lambda: chat.validate_chat(response_body(body)))
    return await serve(request, req, arrived, response_render(chat, echo))
