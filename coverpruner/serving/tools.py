"""An answer in OpenAI's chat shapes: its content, its ``tool_calls`` and its ``reasoning_content``, whole (the
message of a chat completion) and as stream deltas, from the runtime's split of the answer's text
(runtime/answer_parts.py) by the request's tool plan and reasoning (runtime/tool_calls.py: what the grammar let the
model write).

Whole: ``message(request, text, finish)`` -> (message fields, finish_reason): content (None when the answer is calls
only), tool_calls [{"id": "call_...", "type": "function", "function": {"name", "arguments": the JSON text}}] and
finish_reason "tool_calls" when the answer made a call and ended by itself ("length" when max_tokens cut it: a call
cut short keeps its partial arguments), reasoning_content when the prompt opened the thinking.

Streamed (``ChatStream``): deltas as OpenAI streams them: reasoning_content and content pieces as they decode (text
that may still open a call is held back), each call's first delta {index, id, type, function: {name, arguments: ""}}
once its name is written, then its arguments in pieces {index, function: {arguments}}.
"""

from __future__ import annotations

import uuid

from coverpruner.runtime.answer_parts import AnswerSplitter


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def finish_reason(splitter: AnswerSplitter, finish: str) -> str:
    """OpenAI's finish_reason: "tool_calls" for an answer that made calls and ended by itself."""
    return "tool_calls" if finish == "stop" and splitter.calls_made else finish


def message(request, text: str, finish: str) -> tuple[dict, str]:
    """(the assistant message's fields, finish_reason) of the answer ``text`` whose OpenAI finish_reason (before
    tool calls) was ``finish``."""
    stream = ChatStream(request)
    stream.push(text)
    stream.end()
    return stream.fields(), finish_reason(stream.splitter, finish)


class ChatStream:
    """One answer's stream deltas (module docstring); ``fields()`` gives the whole message once it ended."""

    def __init__(self, request):
        self.splitter = AnswerSplitter(request.tool_plan, request.reasoning)
        self.reasoning = request.reasoning is not None
        self.ids: list[str] = []

    def push(self, piece: str) -> list[dict]:
        """The deltas of one piece of text (possibly none: held back)."""
        return self._deltas(self.splitter.push(piece))

    def end(self) -> list[dict]:
        """The deltas of the text held back at the answer's end."""
        return self._deltas(self.splitter.finish())

    def fields(self) -> dict:
        sp = self.splitter
        calls = [{"id": self.ids[k], "type": "function", "function": {"name": name, "arguments": arguments}}
                 for k, (name, arguments, _) in enumerate(sp.calls)]
        out = {"content": sp.content if sp.content or not calls else None, "tool_calls": calls or None}
        if self.reasoning:
            out["reasoning_content"] = sp.reasoning
        return out

    def _deltas(self, parts) -> list[dict]:
        out = []
        for part in parts:
            if part.kind == "call":
                self.ids.append(call_id())
                out.append({"tool_calls": [{"index": part.index, "id": self.ids[part.index], "type": "function",
                                            "function": {"name": part.name, "arguments": ""}}]})
            elif part.kind == "arguments":
                out.append({"tool_calls": [{"index": part.index, "function": {"arguments": part.text}}]})
            elif part.kind == "reasoning":
                out.append({"reasoning_content": part.text})
            else:
                out.append({"content": part.text})
        return out
