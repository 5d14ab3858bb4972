"""OpenAI's ``tools`` / ``tool_choice`` by constrained decoding (runtime/grammar.py), and the ``tool_calls`` answer.

A call the request forces is generated under a grammar, so its arguments always parse and validate:

    tool_choice {"type": "function", "function": {"name": f}}   the answer is f's arguments: JSON of f's ``parameters``
    tool_choice "required"                                      one tool: as named; several: {"name": one of them,
                                                                "arguments": that tool's parameters} (anyOf)
    tool_choice "none" (or no tools)                            plain text; the tools are ignored
    tool_choice "auto" (OpenAI's default when tools are given)  refused with a 400 naming tool_choice: deciding
                                                                between text and a call needs the model's own
                                                                tool-call format, which this server does not parse

The tools are not rendered into the prompt (the chat templates of the served families are rendered without them):
the grammar alone makes the call well-formed, so a model chooses the arguments from the conversation and the
tool's name. The answer is one ``tool_calls`` entry (id, type "function", function {name, arguments: the JSON
text}) with finish_reason "tool_calls"; cut short by max_tokens it keeps the partial arguments and says "length".

Bounded before any compile: at most MAX_TOOLS tools (OpenAI's own bound), each checked for its shape; only the
tools the tool_choice can reach are compiled (a named one: that tool; "required": each of them), each schema within
runtime.grammar's size limits and compiled once per distinct schema (its cache).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from coverpruner.runtime.errors import OptionError
from coverpruner.runtime.grammar import MAX_SCHEMA_CHARS, MAX_SCHEMA_NODES, check_schema_size
from coverpruner.serving.errors import bad_request, from_pipeline_error

#: most tools in one request (OpenAI's limit); counted before any tool is read
MAX_TOOLS = 128
#: most JSON values over all tools (names, descriptions, parameter schemas), counted while the body is read
#: (serving.app.body_caps) and before any tool is looked at: the reached tools' schemas are within
#: runtime.grammar.MAX_SCHEMA_NODES each, the others are never compiled but are still sent and parsed
MAX_TOOLS_VALUES = 8 * MAX_SCHEMA_NODES

#: a tool without ``parameters`` takes no arguments (OpenAI: an empty parameter list)
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass
class ToolPlan:
    """The call a request forces: ``named`` (the one tool whose arguments are the whole answer) or None (the answer
    is {"name", "arguments"} over ``names``); ``response_format`` the grammar's json_schema; ``id`` of the call."""

    names: list
    named: str | None
    response_format: dict
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


def plan(req, compiler) -> ToolPlan | None:
    """The request's tools and tool_choice -> its ToolPlan, or None when no call is forced (no tools, "none").
    400 naming the field for too many tools, a malformed tool or choice, an unknown named tool, "auto", and a
    response_format beside a forced call; then each tool the choice reaches is compiled by ``compiler``
    (runtime.grammar.GrammarCompiler), so a bad or too large schema is a 400 naming tools[i].function.parameters.
    The plan's own grammar (several tools: their union) is compiled by the caller (serving.app) before the
    request is queued."""
    tools, choice = req.tools, req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return None
    if not tools:
        raise bad_request(f"tool_choice {choice!r} needs tools", "tool_choice")
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"tools holds {len(tools):,} tools; at most {MAX_TOOLS}", "tools")
    try:
        check_schema_size(tools, "tools", MAX_TOOLS_VALUES + 1, 16 * MAX_SCHEMA_CHARS)  # + the list itself
    except OptionError as exc:
        raise from_pipeline_error(exc) from None
    params, index = {}, {}
    for i, tool in enumerate(tools):
        name, schema = _tool(tool, f"tools[{i}]")
        if name in params:
            raise bad_request(f"tools[{i}].function.name {name!r} is given twice", f"tools[{i}].function.name")
        params[name], index[name] = schema, i
    if choice == "auto":
        raise bad_request("tool_choice 'auto' is not supported: this server calls a tool only when the request "
                          "forces one (tool_choice 'required' or {'type': 'function', 'function': {'name': ...}}); "
                          "send one of those, or 'none'", "tool_choice")
    if req.response_format is not None and req.response_format.get("type") != "text":
        raise bad_request("response_format cannot be combined with a forced tool call (the call's arguments are the "
                          "answer's format)", "response_format")
    if choice == "required":
        reached = list(params)
    else:
        named = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
        if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(named, str):
            raise bad_request(f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', 'function': "
                              f"{{'name': ...}}}}, got {choice!r}", "tool_choice")
        if named not in params:
            raise bad_request(f"tool_choice names {named!r}, which is not among the tools {sorted(params)}",
                              "tool_choice.function.name")
        reached = [named]
    for name in reached:
        where = f"tools[{index[name]}].function.parameters"
        try:
            compiler.compile(_format(name, params[name]), param=where)
        except OptionError as exc:
            raise from_pipeline_error(exc) from None
    if len(reached) == 1:
        return ToolPlan(list(params), reached[0], _format(reached[0], params[reached[0]]))
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
              "properties": {"name": {"const": n}, "arguments": params[n]}} for n in reached]
    return ToolPlan(list(params), None, _format("tool_call", {"anyOf": calls}))


def _tool(tool, where: str) -> tuple[str, dict]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise bad_request(f"{where} must be {{'type': 'function', 'function': {{'name', 'parameters'}}}}", where)
    fn = tool["function"]
    name, schema = fn.get("name"), fn.get("parameters", _NO_PARAMETERS)
    if not isinstance(name, str) or not name:
        raise bad_request(f"{where}.function.name must be a non-empty string", f"{where}.function.name")
    if not isinstance(schema, dict):
        raise bad_request(f"{where}.function.parameters must be a JSON schema object", f"{where}.function.parameters")
    return name, schema


def _format(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _call(tool: ToolPlan, text: str, complete: bool) -> dict | None:
    """The tool_calls entry of the generated text; None when a several-tools call was cut short (no name yet)."""
    name, arguments = tool.named, text
    if name is None:
        if not complete:
            return None
        call = json.loads(text)  # complete: the grammar made it parse
        name, arguments = call["name"], json.dumps(call["arguments"], ensure_ascii=False)
    return {"id": tool.id, "type": "function", "function": {"name": name, "arguments": arguments}}


def message(tool: ToolPlan, text: str, finish: str) -> tuple[dict, str]:
    """(the assistant message's fields, finish_reason) of a forced call whose answer was ``text`` and whose
    OpenAI finish_reason was ``finish`` ("stop": the grammar completed)."""
    call = _call(tool, text, finish == "stop")
    if call is None:
        return {"content": text, "tool_calls": None}, finish
    return {"content": None, "tool_calls": [call]}, "tool_calls" if finish == "stop" else finish


class ToolStream:
    """Streamed tool_calls deltas: a named call streams its arguments as they decode (the first delta carries the
    id and name); a several-tools call is sent whole at the end (its name is known once it parses)."""

    def __init__(self, tool: ToolPlan):
        self.tool, self.text = tool, []

    def first(self) -> list | None:
        if self.tool.named is None:
            return None
        return [{"index": 0, "id": self.tool.id, "type": "function",
                 "function": {"name": self.tool.named, "arguments": ""}}]

    def push(self, piece: str) -> list | None:
        self.text.append(piece)
        if self.tool.named is None or not piece:
            return None
        return [{"index": 0, "function": {"arguments": piece}}]

    def end(self, finish: str) -> tuple[list | None, dict | None, str]:
        """(tool_calls delta, content delta, finish_reason) at the end of the answer."""
        fields, reason = message(self.tool, "".join(self.text), finish)
        if self.tool.named is not None:
            return None, None, reason
        if fields["tool_calls"] is None:
            return None, fields["content"], reason
        call = fields["tool_calls"][0]
        return [{"index": 0, **call}], None, reason
