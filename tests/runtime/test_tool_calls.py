"""The tool plan's grammar and the answer splitter, family-neutral: Qwen's format (<tool_call> one added token of the
tiny Qwen vocabulary) and a planted format of another shape (a text marker, no closing marker, no separator) are
each written by runtime/tool_calls.py and split by runtime/answer_parts.py; nothing in either names a family.

The grammar is checked by llguidance itself on token ids (the tiny Qwen checkpoint's tokenizer, read with the
tokenizers library): valid answers are accepted whole, answers that break a rule are refused at the first bad token.
"""

from __future__ import annotations

import json

import pytest

from coverpruner.families.contract import ChatFeatures, ReasoningFormat, ToolCallFormat
from coverpruner.runtime import tool_calls
from coverpruner.runtime.answer_parts import split_answer

llg = pytest.importorskip("llguidance", reason="the grammar is llguidance's")

QWEN = ToolCallFormat(open="<tool_call>", before_name='\n{"name": "', before_arguments='", "arguments": ',
                      close="}\n</tool_call>", separator="\n")
PLANTED = ToolCallFormat(open="CALL:", before_name="", before_arguments="(", close=")")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city"], "properties": {"city": {"enum": ["Oslo"]}}}}},
         {"type": "function", "function": {"name": "zoom", "parameters": {
             "type": "object", "additionalProperties": False, "required": ["x"],
             "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}}}}]


def _plan(fmt, choice=None, parallel=True):
    return tool_calls.plan(TOOLS, choice, parallel, ChatFeatures(tool_calls=fmt))


@pytest.fixture(scope="module")
def compiler(builds):
    from tokenizers import Tokenizer

    from coverpruner.runtime.grammar import GrammarCompiler

    tokenizer = Tokenizer.from_file(str(builds.checkpoint("qwen2.5-vl-tiny") / "tokenizer.json"))
    end = tokenizer.token_to_id("<|im_end|>")
    return GrammarCompiler(tokenizer, tokenizer.get_vocab_size(), [end]), tokenizer, end


def _accepts(compiler, plan, text: str, reasoning=None) -> bool:
    """Whether llguidance takes the tokens of ``text`` and then the end of the answer."""
    comp, tokenizer, end = compiler
    grammar = comp.compile_lark(tool_calls.grammar(plan, reasoning, comp.literal))
    matcher = grammar.matcher.deep_copy()
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return all(matcher.consume_token(t) for t in ids) and matcher.consume_token(end)


@pytest.mark.parametrize("text, ok", [
    ("Plain text.", True),
    ('Looking.\n<tool_call>\n{"name": "zoom", "arguments": {"x": 3}}\n</tool_call>', True),
    ('<tool_call>\n{"name": "zoom", "arguments": {"x": 3}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
     '"arguments": {"city": "Oslo"}}\n</tool_call>', True),
    ('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', False),  # not a tool
    ('<tool_call>\n{"name": "zoom", "arguments": {"x": 12}}\n</tool_call>', False),  # arguments do not validate
    ('<tool_call>\n{"name": "zoom", "arguments": {"x": 3}}\n</tool_call> and text after', False),
])
def test_qwen_grammar(compiler, text, ok):
    assert _accepts(compiler, _plan(QWEN), text) is ok


def test_choices_and_parallel(compiler):
    one = '<tool_call>\n{"name": "zoom", "arguments": {"x": 3}}\n</tool_call>'
    two = one + "\n" + one
    assert _accepts(compiler, _plan(QWEN, parallel=False), one)
    assert not _accepts(compiler, _plan(QWEN, parallel=False), two)  # parallel_tool_calls false: one call
    assert not _accepts(compiler, _plan(QWEN, "required"), "Text.")  # required: a call
    named = _plan(QWEN, {"type": "function", "function": {"name": "get_weather"}})
    assert not _accepts(compiler, named, one)
    assert _plan(QWEN, "none") is None


def test_planted_format_and_reasoning(compiler):
    plan = _plan(PLANTED)
    think = ReasoningFormat(open="<think>", close="</think>")
    assert _accepts(compiler, plan, 'Sure. CALL:zoom({"x": 4})')
    assert not _accepts(compiler, plan, 'CALL:zoom({"x": 4}) more')
    assert _accepts(compiler, plan, 'hmm</think>\n\nText CALL:zoom({"x": 4})', think)
    assert not _accepts(compiler, plan, 'CALL:zoom({"x": 4})', think)  # the thinking comes first


@pytest.mark.parametrize("fmt, text, want", [
    (QWEN, 'Looking.\n<tool_call>\n{"name": "zoom", "arguments": {"x": 3}}\n</tool_call>\n<tool_call>\n{"name": '
           '"get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
     ("", "Looking.", [["zoom", '{"x": 3}', True], ["get_weather", '{"city": "Oslo"}', True]])),
    (PLANTED, 'Sure. CALL:zoom({"x": 4})', ("", "Sure. ", [["zoom", '{"x": 4}', True]])),
    (QWEN, '<tool_call>\n{"name": "zoom", "arguments": {"x"', ("", "", [["zoom", '{"x"', False]])),  # cut short
    (QWEN, "a < b <tool", ("", "a < b <tool", [])),  # held back, then given up at the end
])
def test_splitter_streamed_equals_whole(fmt, text, want):
    """Split whole and fed one character at a time: the same reasoning, content and calls (an independent literal
    expectation per case)."""
    plan = _plan(fmt)
    whole = split_answer(text, plan)
    assert (whole.reasoning, whole.content, whole.calls) == want
    pieces = split_answer("", plan)
    for ch in text:
        pieces.push(ch)
    pieces.finish()
    assert (pieces.reasoning, pieces.content, pieces.calls) == want


def test_splitter_reasoning():
    think = ReasoningFormat(open="<think>", close="</think>")
    got = split_answer("\nI should look.\n</think>\n\nIt is a cat.", None, think)
    assert (got.reasoning, got.content) == ("I should look.", "It is a cat.")
    assert json.loads('{"x": 3}') == {"x": 3}
