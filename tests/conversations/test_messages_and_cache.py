"""runtime/messages.py (OpenAI messages -> layout parts, one-line errors), families/hf.py's conversation rendering and
runtime/prefix_cache.py (identity prefixes, byte-bounded LRU), without a model."""

from __future__ import annotations

import numpy as np
import pytest

from coverpruner.engines.interfaces import KVSnapshot
from coverpruner.families.hf import render_conversation
from coverpruner.runtime.errors import ImageError, PromptError
from coverpruner.runtime.messages import normalize
from coverpruner.runtime.prefix_cache import PrefixCache, common_prefix, row_identity

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
    for i, want in enumerate(["S", "Q1", "A", "Q2"]):
        (a, b), = r.text_spans[i]
        assert r.text[a:b] == want
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[0\]: the text must not contain the image token"):
        render_conversation(LLAVA_TEMPLATE, [{"role": "user", "content": [{"type": "text", "text": "<image>"}]}],
                            "<image>", [])


def _snap(length, value=0.0):
    k = tuple(np.full((1, 2, length, 4), value + i, np.float32) for i in range(2))
    return KVSnapshot(length, k, k)


def test_prefix_cache_longest_prefix_capped_and_truncated():
    cache = PrefixCache(1 << 20)
    ids = np.arange(10, dtype=np.int64)
    ident = row_identity(ids, np.arange(10), np.arange(10)[None], {3: (77, 0)})
    assert ident[3, :2].tolist() == [77, 0] and ident[4, :2].tolist() == [-1, 4]
    cache.insert(ident[:6], _snap(6))
    p, snap = cache.lookup(ident)  # the whole entry matches
    assert p == 6 and snap.length == 6
    p, snap = cache.lookup(ident[:6])  # the last row is always prefilled
    assert p == 5 and snap.keys[0].shape == (1, 2, 5, 4)
    other = ident.copy()
    other[4, 1] = 99  # a different token at row 4
    assert cache.lookup(other)[0] == 4
    assert common_prefix(ident, other) == 4 and cache.lookup(ident[:1])[0] == 0


def test_prefix_cache_evicts_least_recently_used_and_refuses_oversize():
    one = _snap(8).nbytes + 8 * 3 * 8
    cache = PrefixCache(2 * one + 10)
    idents = [np.stack([np.full(8, -1), np.arange(8) + 100 * k, np.arange(8)], 1).astype(np.int64) for k in range(3)]
    cache.insert(idents[0], _snap(8))
    cache.insert(idents[1], _snap(8))
    assert cache.lookup(idents[0])[0] == 7  # touches entry 0: entry 1 is now the least recent
    cache.insert(idents[2], _snap(8))
    assert cache.lookup(idents[1])[0] == 0 and cache.lookup(idents[0])[0] == 7 and cache.nbytes <= cache.max_bytes
    small = PrefixCache(100)
    small.insert(idents[0], _snap(8))
    assert small.nbytes == 0 and small.lookup(idents[0])[0] == 0
    off = PrefixCache(0)
    off.insert(idents[0], _snap(8))
    assert not off.enabled and off.lookup(idents[0])[0] == 0


def test_prefix_cache_index_survives_shared_prefixes_and_extensions():
    """Two entries share 5 rows; dropping one keeps the other findable through the shared chain keys; an entry
    that extends another replaces it; a wrong row anywhere in the prefix stops the walk there."""
    cache = PrefixCache(1 << 20)
    base = np.stack([np.full(12, -1), np.arange(12) + 7, np.arange(12)], 1).astype(np.int64)
    other = base.copy()
    other[5:, 1] += 100  # agrees with base on rows 0..4 only
    cache.insert(base[:8], _snap(8, 1.0))
    cache.insert(other[:9], _snap(9, 2.0))
    p, snap = cache.lookup(other)
    assert p == 9 and float(snap.keys[0][0, 0, 0, 0]) == 2.0
    assert cache.lookup(base)[0] == 8
    cache.kv.remove(max(cache.kv.items))  # drop the entry of `other`
    p, snap = cache.lookup(other)
    assert p == 5 and float(snap.keys[0][0, 0, 0, 0]) == 1.0  # base's entry still serves the shared rows
    cache.insert(base[:11], _snap(11, 3.0))  # extends base[:8]: replaces it
    assert len(cache.kv.items) == 1 and cache.lookup(base)[0] == 11
    broken = base.copy()
    broken[2, 1] = -5
    assert cache.lookup(broken)[0] == 2


def test_prefix_cache_stores_share_one_budget():
    """A vision output inserted past the budget evicts the least recently used entry of another store."""
    snap = _snap(8)
    ident = np.stack([np.full(8, -1), np.arange(8), np.arange(8)], 1).astype(np.int64)
    entry = snap.nbytes + ident.nbytes
    cache = PrefixCache(entry + 340)
    cache.insert(ident, snap)
    cache.put_selection(b"s", np.arange(4, dtype=np.int64), None)
    assert cache.lookup(ident)[0] == 7 and cache.nbytes == entry + 32
    cache.put_vision(b"v", {"image_features": np.zeros(80, np.float32)})  # 320 bytes: something must go
    assert cache.get_selection(b"s") is None  # the least recently used (the KV entry was just looked up)
    assert cache.lookup(ident)[0] == 7 and cache.get_vision(b"v") is not None
    assert cache.nbytes == entry + 320 <= cache.max_bytes
    cache.clear()
    assert cache.nbytes == 0 and cache.lookup(ident)[0] == 0
