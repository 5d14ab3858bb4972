"""runtime/messages.py (OpenAI messages -> layout parts, one-line errors) and families/hf.py's conversation rendering,
without a model (the prefix cache's own tests: tests/runtime/test_prefix_blocks.py)."""

from __future__ import annotations

import numpy as np
import pytest

from coverpruner.families.hf import render_conversation
from coverpruner.runtime.errors import ImageError, PromptError
from coverpruner.runtime.messages import normalize

# llava-hf's template, as the tiny presets ship it: no role prefix for system, a message's images first
LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% if message['role'] == 'assistant' %}{% generation %}{% for content in message['content'] | "
    "selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}{% endfor %}{% endgeneration %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")


def test_normalize_strings_image_urls_and_order():
    img = np.zeros((4, 4, 3), np.uint8)
    conv = normalize([{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "image", "image": img},
                                                   {"type": "image_url", "image_url": {"url": "file:///x.png"}}]}])
    assert conv.messages == [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                             {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "image"},
                                                          {"type": "image"}]}]
    assert conv.images[0] is img and conv.images[1] == "/x.png"


@pytest.mark.parametrize("messages,error,match", [
    ([], PromptError, "non-empty list"),
    ([{"role": "robot", "content": "x"}], PromptError, r"messages\[0\]\.role"),
    ([{"role": "user", "content": [{"type": "audio"}]}], PromptError, r"messages\[0\]\.content\[0\]: part type"),
    # video parts arrived with issue 20; one without its field is named like an image part without its own
    ([{"role": "user", "content": [{"type": "video"}]}], PromptError,
     r"messages\[0\]\.content\[0\]: video part needs the field 'video'"),
    ([{"role": "assistant", "content": [{"type": "video", "video": ["a.png"]}]}, {"role": "user", "content": "q"}],
     PromptError, "videos belong in user messages"),
    ([{"role": "user", "content": [{"type": "video", "video": ["a.png"], "max_frames": 1}]}], PromptError,
     r"messages\[0\]\.content\[0\]: max_frames must be an integer >= 2"),
    ([{"role": "user", "content": [{"type": "text"}]}], PromptError, r"messages\[0\]\.content\[0\]: text part"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], PromptError, "last message"),
    ([{"role": "assistant", "content": [{"type": "image", "image": "a.png"}]}, {"role": "user", "content": "q"}],
     PromptError, "images belong in user messages"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}]}],
     ImageError, r"messages\[0\]\.content\[0\]: data URL payload"),
    ([{"role": "user", "content": [{"type": "image", "image": "a.png"}] * 3}], PromptError,
     r"3 images; at most 2 per request \(max_images\)"),
])
def test_normalize_errors_are_one_line_naming_the_field(messages, error, match):
    with pytest.raises(error, match=match) as info:
        normalize(messages, max_images=2)
    assert "\n" not in str(info.value)


def test_render_conversation_spans_and_expansion():
    messages = [{"role": "system", "content": [{"type": "text", "text": "S"}]},
                {"role": "user", "content": [{"type": "text", "text": "Q1"}, {"type": "image"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "A"}]},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q2"}]}]
    r = render_conversation(LLAVA_TEMPLATE, messages, "<image>", [2, 3])
    assert r.text == "S USER: <image><image>\nQ1 ASSISTANT: A USER: <image><image><image>\nQ2 ASSISTANT:"
    for i, want in [(0, "S"), (1, "Q1"), (3, "Q2")]:
        (a, b), = r.text_spans[i]
        assert r.text[a:b] == want
    assert r.text_spans[2] == ()  # an assistant turn passes through whole (templates read its text: LOCATED_ROLES)
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[0\]: the text must not contain the image token"):
        render_conversation(LLAVA_TEMPLATE, [{"role": "user", "content": [{"type": "text", "text": "<image>"}]}],
                            "<image>", [])

