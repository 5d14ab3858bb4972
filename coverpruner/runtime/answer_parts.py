"""An answer's text split into its reasoning, its content and its tool calls, incrementally (for streaming) and
whole, by the family's formats (contract.ReasoningFormat, ToolCallFormat) and the request's tool plan.

    splitter = AnswerSplitter(request.tool_plan, request.reasoning)
    for piece in pieces:                      # each EngineEvent's text
        for part in splitter.push(piece): ... # Part("reasoning" | "content", text) / Part("call", index, name) /
                                              # Part("arguments", index, text)
    parts = splitter.finish()                 # the text held back; splitter.reasoning / .content / .calls

The grammar the answer was generated under (runtime/tool_calls.py) makes the split exact: reasoning never spells
its closing marker, content never spells the call-opening marker, a call is the format's markers around one of the
tools' names and a JSON object. What the chat template does with an assistant turn is undone the same way:
reasoning loses its surrounding newlines and content its leading ones (Qwen3's split at </think>), and the one
separator the template writes between content and the first call is not content. Text that might still turn out
to be a marker is held back until the next piece decides (as stop strings are, runtime/stop.py), so a streamed
answer never shows part of a marker as content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class Part(NamedTuple):
    """One piece of a split answer: kind "reasoning" / "content" (text), "call" (call ``index`` starts: ``name``)
    or "arguments" (text of call ``index``'s arguments)."""

    kind: str
    text: str = ""
    index: int = 0
    name: str = ""


class _Scan:
    """Finds the first of ``patterns`` in text pushed piece by piece: push(piece) -> (text before it, safe to emit;
    the pattern found or None; the text after it). Without a match, the longest tail that could start a pattern is
    held back (flush() gives it up)."""

    def __init__(self, patterns: list[str]):
        self.patterns = [p for p in patterns if p]
        self.pending = ""

    def push(self, piece: str) -> tuple[str, str | None, str]:
        text = self.pending + piece
        found = [(text.find(p), -len(p), p) for p in self.patterns if p in text]
        if found:
            at, _, pattern = min(found)
            self.pending = ""
            return text[:at], pattern, text[at + len(pattern):]
        hold = max((k for p in self.patterns for k in range(min(len(p) - 1, len(text)), 0, -1)
                    if text.endswith(p[:k])), default=0)
        self.pending = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold], None, ""

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class _JsonEnd:
    """Where a JSON value written character by character ends: push(text) -> the length of ``text`` inside the value
    (all of it while the value goes on). Objects, arrays and strings end at their closing character; a bare
    number / literal never ends here (its end is the format's closing marker)."""

    def __init__(self):
        self.depth, self.in_string, self.escaped, self.started, self.done = 0, False, False, False, False

    def push(self, text: str) -> int:
        for k, ch in enumerate(text):
            if self.done:
                return k
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    self.done = self.depth == 0
                continue
            if ch == '"':
                self.in_string, self.started = True, True
            elif ch in "{[":
                self.depth, self.started = self.depth + 1, True
            elif ch in "}]":
                self.depth -= 1
                self.done = self.depth == 0
            elif not ch.isspace():
                self.started = True
        return len(text)


@dataclass
class AnswerSplitter:
    """Splits one answer's text (module docstring). tool_plan: the request's runtime.tool_calls.ToolPlan (None: no
    calls); reasoning: the family's ReasoningFormat when the prompt opened the thinking (None: no reasoning)."""

    tool_plan: object = None
    reasoning_format: object = None
    reasoning: str = ""
    content: str = ""
    calls: list = field(default_factory=list)  # [name, arguments, complete] per call, in order
    state: str = field(init=False)

    def __post_init__(self):
        self._lead = True  # reasoning / content still at their start (leading newlines are not theirs)
        self._newlines = ""  # newlines at the reasoning's end so far (kept only if more reasoning follows)
        fmt = None if self.tool_plan is None else self.tool_plan.format
        self._fmt = fmt
        self._content_scan = _Scan([fmt.separator + fmt.open, fmt.open] if fmt is not None else [])
        if self.reasoning_format is not None:
            self.state, self._scan = "reasoning", _Scan([self.reasoning_format.close])
        else:
            self.state, self._scan = "content", self._content_scan
            self._lead = False

    @property
    def calls_made(self) -> int:
        """Calls written whole."""
        return sum(1 for c in self.calls if c[2])

    def push(self, piece: str) -> list[Part]:
        out: list[Part] = []
        while piece:
            piece = getattr(self, "_in_" + self.state)(piece, out)
        return out

    def finish(self) -> list[Part]:
        """The answer ended: the text held back is given up (a call cut short keeps its partial arguments; one cut
        before its name is complete is dropped)."""
        out: list[Part] = []
        held = self._scan.flush()
        if self.state == "reasoning":
            self._reasoning_text(held, out)
        elif self.state == "content":
            self._content_text(held, out)
        elif self.state == "head":
            self.calls.pop()
        return out

    # -- states: each takes the text of a piece, appends its parts and returns the text left for the next state --
    def _in_reasoning(self, piece: str, out: list) -> str:
        text, found, rest = self._scan.push(piece)
        self._reasoning_text(text, out)
        if found is None:
            return ""
        self.state, self._scan, self._lead = "content", self._content_scan, True
        return rest

    def _reasoning_text(self, text: str, out: list) -> None:
        """Reasoning without its leading and trailing newlines (the template's strip("\\n")): trailing newlines wait
        for more reasoning."""
        if self._lead:
            text = text.lstrip("\n")
            self._lead = not text
        if not text:
            return
        body = text.rstrip("\n")
        if body:
            self._emit("reasoning", self._newlines + body, out)
            self._newlines = ""
        self._newlines += text[len(body):]

    def _in_content(self, piece: str, out: list) -> str:
        text, found, rest = self._scan.push(piece)
        self._content_text(text, out)
        if found is None:
            return ""
        self.calls.append(["", "", False])
        self.state, self._head, self._json = "head", "", _JsonEnd()
        return rest

    def _content_text(self, text: str, out: list) -> None:
        if self._lead:  # after the reasoning: the template's lstrip("\n")
            text = text.lstrip("\n")
            self._lead = not text
        if text:
            self._emit("content", text, out)

    def _in_head(self, piece: str, out: list) -> str:
        """After a call's opening marker: its name, up to the format's text before the arguments."""
        fmt = self._fmt
        self._head += piece
        head = self._head[len(fmt.before_name):]
        at = head.find(fmt.before_arguments) if len(self._head) >= len(fmt.before_name) else -1
        if at < 0:
            return ""
        name, index = head[:at], len(self.calls) - 1
        self.calls[index][0] = name
        out.append(Part("call", index=index, name=name))
        self.state = "arguments"
        return head[at + len(fmt.before_arguments):]

    def _in_arguments(self, piece: str, out: list) -> str:
        inside = self._json.push(piece)
        if inside:
            index = len(self.calls) - 1
            self.calls[index][1] += piece[:inside]
            out.append(Part("arguments", piece[:inside], index=index))
        if not self._json.done:
            return ""
        self.state, self._tail = "close", ""
        return piece[inside:]

    def _in_close(self, piece: str, out: list) -> str:
        """After a call's arguments: its closing marker, then the separator and the next call's opening marker."""
        fmt = self._fmt
        self._tail += piece
        if len(self._tail) < len(fmt.close):
            return ""
        self.calls[-1][2] = True
        rest = self._tail[len(fmt.close):]
        self.state, self._scan = "between", _Scan([fmt.separator + fmt.open])
        return rest

    def _in_between(self, piece: str, out: list) -> str:
        _, found, rest = self._scan.push(piece)  # nothing else may stand between calls (the grammar's rule)
        if found is None:
            return ""
        self.calls.append(["", "", False])
        self.state, self._head, self._json = "head", "", _JsonEnd()
        return rest

    def _emit(self, kind: str, text: str, out: list) -> None:
        if kind == "reasoning":
            self.reasoning += text
        else:
            self.content += text
        out.append(Part(kind, text))


def split_answer(text: str, tool_plan=None, reasoning=None) -> AnswerSplitter:
    """The whole answer ``text`` split (AnswerSplitter after push(text) and finish())."""
    splitter = AnswerSplitter(tool_plan, reasoning)
    splitter.push(text)
    splitter.finish()
    return splitter
