"""Qwen3.5's run-time rules (numpy only): those of the Qwen3-VL vision tower (qwen3_vision_base.Qwen3VisionRuntime:
dynamic resolution, every merger output a candidate, native M-RoPE positions, timestamped videos) without DeepStack,
and the conversation as the Qwen3.5 chat template renders it.

The template differs from Qwen3-VL's in what it does to the text, which the layout reproduces before rendering (the
text parts go through the template as sentinels, so what the template would do to them is done here):
* every message's content is trimmed (jinja's ``trim``: leading / trailing whitespace of the whole content);
* an assistant message before the last user message keeps only what follows its last ``</think>``: assistant turns
  reach the template as given (hf.LOCATED_ROLES), so the template does that itself.
"""

from __future__ import annotations

from coverpruner.families.hf import LOCATED_ROLES
from coverpruner.families.qwen3_vision_base import Qwen3VisionRuntime

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


class Qwen35Runtime(Qwen3VisionRuntime):
    """contract.FamilyRuntime for a Qwen3.5 engine dir."""

    def conversation_layout(self, tokenizer, messages: list[dict], rows_per_image: list[int],
                            media: list[dict] | None = None, tools: list | None = None,
                            template_kwargs: dict | None = None):
        """The Qwen3-VL tower's layout of ``messages`` as the Qwen3.5 template changes their text (module
        docstring). Only the turns whose text goes through the template as sentinels (hf.LOCATED_ROLES: system and
        user) are reshaped here; assistant and tool turns reach the template as given, which trims them and drops an
        earlier turn's reasoning itself."""
        shaped = [{**m, "content": _trimmed(list(m["content"]))} if m["role"] in LOCATED_ROLES else m
                  for m in messages]
        return super().conversation_layout(tokenizer, shaped, rows_per_image, media, tools, template_kwargs)
