"""A tool round trip in the history (an assistant turn with tool_calls, tool results) and the request's tools render
exactly as transformers' apply_chat_template renders them (an independent reference: the checkpoint's tokenizer,
its own jinja environment), on the tiny Qwen2.5-VL and Qwen3-VL engines and the Qwen3-VL Thinking template.

The conversations are sent as the openai SDK sends them (arguments a JSON text, content null beside calls); the
reference gets them as transformers documents them (arguments a JSON object). Token ids are compared whole.
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest

pytest.importorskip("transformers", reason="the reference is transformers' apply_chat_template")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
                                           "parameters": {"type": "object", "required": ["city"],
                                                          "properties": {"city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "zoom", "description": "Crop the image",
                                           "parameters": {"type": "object", "properties": {
                                               "box": {"type": "array", "items": {"type": "integer"}}}}}}]


def _call(cid: str, name: str, arguments: dict) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


CONVERSATIONS = {
    "one call, content null": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1", "get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "clear", "celsius": 21}'}],
    "text and two calls, then a user turn": [
        {"role": "system", "content": "You are a camera assistant."},
        {"role": "user", "content": [{"type": "text", "text": "Zoom and tell me the weather."}]},
        {"role": "assistant", "content": "Let me check.",
         "tool_calls": [_call("c1", "zoom", {"box": [1, 2, 30, 40]}), _call("c2", "get_weather", {"city": "Nice"})]},
        {"role": "tool", "tool_call_id": "c1", "content": "zoomed"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "assistant", "content": "It rains in Nice."},
        {"role": "user", "content": "Thanks, and in Lyon?"}],
}
THINKING = {
    "reasoning before a call": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
         "tool_calls": [_call("c1", "get_weather", {"city": "Oslo"})]},
        {"role": "tool", "tool_call_id": "c1", "content": "snow"}],
    "an earlier answer with its thinking inline": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHello!"},
        {"role": "user", "content": "Weather in Rome?"}],
}


def _reference_messages(messages: list[dict]) -> list[dict]:
    """transformers' documented form: each call's arguments a JSON object."""
    out = copy.deepcopy(messages)
    for m in out:
        for call in m.get("tool_calls", []):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def _check(engine, checkpoint, conversations: dict, template: str | None = None) -> None:
    from transformers import AutoTokenizer

    from coverpruner.runtime import Pipeline

    pipe = Pipeline.load(engine, provider="cpu", threads=1)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    for name, messages in conversations.items():
        conv = pipe.chat_request(messages, tools=TOOLS, max_new_tokens=4).conversation
        ours = pipe.encoder.encode_conversation(conv.messages, [], None, conv.tools, conv.template_kwargs)
        text = tokenizer.apply_chat_template(_reference_messages(messages), tools=TOOLS, add_generation_prompt=True,
                                             tokenize=False, **({"chat_template": template} if template else {}))
        want = tokenizer(text, add_special_tokens=False).input_ids
        assert "<tool_call>" in text or "<think>" in text, text
        assert ours.input_ids.tolist() == want, (name, tokenizer.decode(ours.input_ids.tolist()), text)


@pytest.mark.parametrize("preset", ["qwen2.5-vl-tiny", "qwen3-vl-tiny"])
def test_tool_turns_render_as_transformers(builds, preset):
    _check(builds.export(preset, "ort"), builds.checkpoint(preset), CONVERSATIONS)


def test_thinking_template_renders_as_transformers(builds, tmp_path):
    """The Qwen3-VL Thinking template (coverpruner.testing's copy) on the same weights: reasoning_content and inline
    <think> of earlier turns rendered as transformers renders them."""
    from coverpruner.testing.qwen3_vl_checkpoints import QWEN3_VL_THINKING_CHAT_TEMPLATE

    engine = tmp_path / "thinking"
    shutil.copytree(builds.export("qwen3-vl-tiny", "ort"), engine)
    manifest = json.loads((engine / "manifest.json").read_text())
    manifest["chat_template"] = QWEN3_VL_THINKING_CHAT_TEMPLATE
    (engine / "manifest.json").write_text(json.dumps(manifest))
    _check(engine, builds.checkpoint("qwen3-vl-tiny"), {**CONVERSATIONS, **THINKING}, QWEN3_VL_THINKING_CHAT_TEMPLATE)
