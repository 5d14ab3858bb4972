"""Qwen3.5's run-time rules (numpy only): those of the Qwen3-VL vision tower (qwen3_vision_base.Qwen3VisionRuntime:
dynamic resolution, every merger output a candidate, native M-RoPE positions, timestamped videos) without DeepStack,
and the conversation as the Qwen3.5 chat template renders it.

The template differs from Qwen3-VL's in what it does to the text, which the layout reproduces before rendering (the
text parts go through the template as sentinels, so what the template would do to them is done here):
* every message's content is trimmed (jinja's ``trim``: leading / trailing whitespace of the whole content);
* then an assistant message before the last user message keeps only what follows its last ``</think>`` (its
  reasoning is dropped, the newlines after it too), as the template renders earlier turns.
"""

from __future__ import annotations

from coverpruner.families.qwen3_vision_base import Qwen3VisionRuntime

THINK_END = "</think>"


def _trimmed(parts: list[dict]) -> list[dict]:
    """A content's parts with the whitespace that the template's ``|trim`` removes removed: from the front of the
    leading text parts and the back of the trailing ones, up to the first / last visible character or medium."""
    parts = [dict(p) for p in parts]
    for order, strip in ((range(len(parts)), str.lstrip), (range(len(parts) - 1, -1, -1), str.rstrip)):
        for i in order:
            if parts[i]["type"] != "text":
                break
            parts[i]["text"] = strip(parts[i]["text"])
            if parts[i]["text"]:
                break
    return parts


def _without_reasoning(parts: list[dict]) -> list[dict]:
    """An earlier assistant turn's (trimmed) parts as the template renders them: the text after the last </think>,
    leading newlines dropped (a content of text parts only, as runtime/messages.py gives assistant turns)."""
    text = "".join(p["text"] for p in parts if p["type"] == "text")
    if THINK_END not in text or any(p["type"] != "text" for p in parts):
        return parts
    return [{"type": "text", "text": text.split(THINK_END)[-1].lstrip("\n")}]


class Qwen35Runtime(Qwen3VisionRuntime):
    """contract.FamilyRuntime for a Qwen3.5 engine dir."""

    def conversation_layout(self, tokenizer, messages: list[dict], rows_per_image: list[int],
                            media: list[dict] | None = None):
        """The Qwen3-VL tower's layout of ``messages`` as the Qwen3.5 template changes their text (module
        docstring)."""
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        last_user = users[-1] if users else -1
        shaped = []
        for i, m in enumerate(messages):
            parts = _trimmed(list(m["content"]))
            if m["role"] == "assistant" and i < last_user:
                parts = _without_reasoning(parts)
            shaped.append({**m, "content": parts})
        return super().conversation_layout(tokenizer, shaped, rows_per_image, media)
