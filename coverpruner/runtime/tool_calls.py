"""OpenAI's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` as one grammar over the family's call format.

A request's tools are read and bounded here (runtime-side, so Pipeline.chat and the server refuse the same way,
each refusal an OptionError naming ``tools[i]...`` or ``tool_choice``); ``plan`` decides what the answer may be:

    tool_choice          the family's chat template renders tools          it does not (no tool-call format)
    "auto" (or absent)   text, or calls in the family's format             refused: the model has no format
    "required"           one call or more (one with parallel false)        one call, written as bare JSON
    a named function     that function's call(s)                           its call, bare JSON
    "none"               plain text (the tools are still rendered)         plain text

``grammar`` writes the llguidance (lark) grammar of a plan: free text that never spells the format's opening
marker, then the calls, each ``open + before_name + NAME + before_arguments + ARGUMENTS + close`` with the name one
of the reachable tools' and the arguments generated under that tool's parameters schema (OpenAI's spacing, as
runtime/grammar.py's JSON), calls joined by the format's separator. A marker that is one token of the vocabulary
(Qwen's <tool_call>) is that token in the grammar, so a model opens a call only with it; a marker of characters
ends the free text as llguidance's stop string (tests/runtime/test_tool_calls.py plants such a format). When the
prompt opened the thinking (ReasoningFormat), the grammar starts with the reasoning (text that never spells the
closing marker) and its closing marker. The text of an answer is split back into reasoning, text and calls by runtime/answer_parts.py.

Bounds (docs/serving.md): at most MAX_TOOLS tools and MAX_TOOLS_VALUES JSON values over all tools, counted before
any tool is read; each reached tool's schema within runtime.grammar's limits; a tool name, a marker or a schema
literal the vocabulary cannot spell is refused at admission (GrammarCompiler.unspellable).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Mapping

from coverpruner.families.contract import ChatFeatures, ReasoningFormat, ToolCallFormat
from coverpruner.integers import brief
from coverpruner.runtime.errors import OptionError
from coverpruner.runtime.grammar import (JSON_OPTIONS, MAX_SCHEMA_CHARS, MAX_SCHEMA_NODES, check_schema_size,
                                        schema_literals)

#: most tools in one request (OpenAI's limit); counted before any tool is read
MAX_TOOLS = 128
#: most JSON values over all tools (names, descriptions, parameter schemas), counted while the body is read
#: (serving.app.body_caps) and before any tool is looked at: the reached tools' schemas are within
#: runtime.grammar.MAX_SCHEMA_NODES each, the others are never compiled but are still sent and rendered
MAX_TOOLS_VALUES = 8 * MAX_SCHEMA_NODES
#: OpenAI's rule for a function's name (it is written into the answer between quotes, unescaped, by the templates)
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: a tool without ``parameters`` takes no arguments (OpenAI: an empty parameter list)
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
#: how a forced call is written when the family's template renders no tools: bare JSON, the model never having seen
#: the tools (the grammar alone makes the call)
JSON_CALL = ToolCallFormat(open='{"name": "', before_name="", before_arguments='", "arguments": ', close="}")
CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class Tool:
    """One function tool: its name, its parameters schema and its index in the request's tools."""

    name: str
    parameters: dict
    index: int

    @property
    def param(self) -> str:
        return f"tools[{self.index}].function"


@dataclass(frozen=True)
class ToolPlan:
    """What an answer may be: calls of ``tools`` (the ones the choice reaches) in ``format``, after free text unless
    ``forced``, several when ``parallel``; ``rendered``: the chat template showed the model the tools."""

    tools: tuple[Tool, ...]
    forced: bool
    parallel: bool
    format: ToolCallFormat
    rendered: bool


def read_tools(tools) -> list[Tool]:
    """OpenAI's tools ([{"type": "function", "function": {"name", "description"?, "parameters"?}}]) -> [Tool];
    OptionError naming the field for too many tools or values, a malformed tool, a bad or repeated name."""
    if not isinstance(tools, (list, tuple)):
        raise OptionError(f"tools must be a list of function tools, got {brief(tools)}", param="tools")
    if len(tools) > MAX_TOOLS:
        raise OptionError(f"tools holds {len(tools):,} tools; at most {MAX_TOOLS}", param="tools")
    check_schema_size(list(tools), "tools", MAX_TOOLS_VALUES + 1, 16 * MAX_SCHEMA_CHARS)  # + the list itself
    out, names = [], {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(fn, Mapping):
            raise OptionError(f"{where} must be {{'type': 'function', 'function': {{'name', 'parameters'}}}}",
                              param=where)
        name, schema = fn.get("name"), fn.get("parameters", NO_PARAMETERS)
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise OptionError(f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-' (OpenAI's rule), "
                              f"got {brief(name)}", param=f"{where}.function.name")
        if name in names:
            raise OptionError(f"{where}.function.name {name!r} is given twice (also tools[{names[name]}])",
                              param=f"{where}.function.name")
        if not isinstance(schema, Mapping):
            raise OptionError(f"{where}.function.parameters must be a JSON schema object",
                              param=f"{where}.function.parameters")
        names[name] = i
        out.append(Tool(name, dict(schema), i))
    return out


def plan(tools, tool_choice, parallel: bool, features: ChatFeatures, response_format=None) -> ToolPlan | None:
    """The request's tools and choice -> its ToolPlan, or None when no call may be made (no tools, "none").
    OptionError naming tool_choice for a malformed choice, a choice without tools, an unknown named tool or "auto"
    on a template that renders no tools; naming response_format beside a call."""
    given = read_tools(tools) if tools else []
    choice = tool_choice if tool_choice is not None else ("auto" if given else "none")
    if choice == "none":
        return None
    named = None
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        named = fn.get("name") if isinstance(fn, Mapping) else None
        if choice.get("type") != "function" or not isinstance(named, str):
            named = None
            choice = repr(choice)
    if named is None and choice not in CHOICES:
        raise OptionError(f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', 'function': "
                          f"{{'name': ...}}}}, got {brief(tool_choice)}", param="tool_choice")
    if not given:
        raise OptionError(f"tool_choice {brief(tool_choice)} needs tools", param="tool_choice")
    fmt = features.tool_calls
    if choice == "auto" and fmt is None:
        raise OptionError("tool_choice 'auto' (the default with tools) needs the model's own tool-call format, and "
                          "this model's chat template renders no tools; send tool_choice 'required' or a named "
                          "function (the call is then generated under a grammar), or 'none'", param="tool_choice")
    if response_format is not None and response_format.get("type") != "text":
        raise OptionError("response_format cannot be combined with tool calls (a call's arguments are its tool's "
                          "format; send tool_choice 'none' for a formatted answer)", param="response_format")
    if named is not None:
        reached = [t for t in given if t.name == named]
        if not reached:
            raise OptionError(f"tool_choice names {named!r}, which is not among the tools "
                              f"{sorted(t.name for t in given)}", param="tool_choice.function.name")
    else:
        reached = given
    rendered = fmt is not None
    return ToolPlan(tuple(reached), choice != "auto", bool(parallel) and rendered, fmt or JSON_CALL, rendered)


def grammar(tool_plan: ToolPlan | None, reasoning: ReasoningFormat | None, literal, schema=None) -> str:
    """The lark grammar (llguidance) of an answer: ``reasoning`` (the prompt opened the thinking) first, then the
    tool plan's text and calls, or the ``schema`` (a JSON schema: response_format) after the reasoning.
    literal(text) -> the grammar expression of a fixed text (GrammarCompiler.literal: a marker that is one token
    becomes that token)."""
    lines = ["%llguidance {}"]
    head = ""
    if reasoning is not None:
        head = f"REASONING {literal(reasoning.close)} "
        lines.append(f"REASONING: {_never(reasoning.close)}")
    if tool_plan is None:
        lines.insert(1, f"start: {head}/\\n*/ answer")
        lines.append(f"answer: %json {_json(schema)}")
        return "\n".join(lines) + "\n"
    fmt = tool_plan.format
    opener = literal(fmt.open)
    rest = f" ({'SEPARATOR ' if fmt.separator else ''}{opener} body)*" if tool_plan.parallel else ""
    if tool_plan.forced:
        newlines = "/\\n*/ " if reasoning is not None else ""  # what a model writes between its thinking and a call
        lines.insert(1, f"start: {head}{newlines}{opener} body{rest}")
    else:
        # text, then optionally calls. A marker that is one token opens a call only as that token (the text, a
        # lexeme of characters, cannot hold it); a marker of characters ends the text as a stop string (a greedy
        # text lexeme would swallow its first characters)
        opened = f"TEXT {opener}" if opener.startswith("<[") else "opened"
        lines.insert(1, f"start: {head}TEXT | {head}{opened} body{rest}")
        lines.append(f"TEXT: {_never(fmt.open)}")
        if opened == "opened":
            lines.append(f"opened[stop={json.dumps(fmt.open)}]: /(?s:.*)/")
    lines.append("body: " + " | ".join(f"body_{k}" for k in range(len(tool_plan.tools))))
    if tool_plan.parallel and fmt.separator:
        lines.append(f"SEPARATOR: {json.dumps(fmt.separator)}")
    for k, tool in enumerate(tool_plan.tools):
        lines.append(f"body_{k}: {literal(fmt.before_name + tool.name + fmt.before_arguments)} "
                     f"%json {_json(tool.parameters)} {literal(fmt.close)}")
    return "\n".join(lines) + "\n"


#: characters with a meaning in llguidance's regexes (Rust's regex syntax, inside lark's /.../)
_REGEX_META = set("\\.^$|?*+()[]{}/")


def _never(marker: str) -> str:
    """A lark terminal of any text that never spells ``marker`` (so the text cannot be mistaken for it)."""
    escaped = "".join("\\" + c if c in _REGEX_META else c for c in marker)
    return f"/(?s:.*)/ & ~/(?s:.*){escaped}(?s:.*)/"


def _json(schema) -> str:
    """A schema inlined with the server's JSON options (runtime.grammar.JSON_OPTIONS: OpenAI's spacing)."""
    return json.dumps({**schema, "x-guidance": JSON_OPTIONS}, allow_nan=False)


def literals(tool_plan: ToolPlan) -> list[tuple[str, str, str]]:
    """(text, param, what) of every fixed text the plan's calls must write: the format's markers, each reached
    tool's name and the literals its schema requires (its required property names, its consts)."""
    fmt = tool_plan.format
    out = [(s, "tools", "the model's tool-call format") for s in (fmt.open, fmt.before_name, fmt.before_arguments,
                                                                  fmt.close, fmt.separator) if s]
    for tool in tool_plan.tools:
        out.append((tool.name, f"{tool.param}.name", "the function's name"))
        out += [(text, f"{tool.param}.parameters", what) for text, what in schema_literals(tool.parameters)]
    return out
