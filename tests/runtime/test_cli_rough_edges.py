"""Issue 30 item 7: coverpruner-run --json is compact (number lists on one line, relevance behind --json-full), a
bare string inside a content list is named as such."""

from __future__ import annotations

import json

import pytest

from coverpruner.runtime.cli import result_json
from coverpruner.runtime.errors import PromptError
from coverpruner.runtime.messages import normalize

RESULT = {"text": "a cat", "token_ids": [5, 6, 7], "kept_indices": list(range(16)), "relevance": [0.5] * 144,
          "timings_ms": {"vision": 1.5}, "images": [{"kept_indices": [1, 2], "relevance": [0.25, -1e-05, None]}]}


def test_json_compact_by_default_full_on_request():
    compact = result_json(RESULT)
    parsed = json.loads(compact)
    assert "relevance" not in parsed and "relevance" not in parsed["images"][0]
    assert parsed["kept_indices"] == RESULT["kept_indices"]
    assert '"kept_indices": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]' in compact
    assert len(compact.splitlines()) < 20
    full = result_json(RESULT, full=True)
    assert json.loads(full) == RESULT  # nothing lost, nothing changed
    assert len(full.splitlines()) < 25  # 144 scores on one line, not 144 lines


def test_bare_string_in_a_content_list_is_named():
    with pytest.raises(PromptError) as info:
        normalize([{"role": "user", "content": [{"type": "text", "text": "hi"}, "what is this?"]}])
    message = str(info.value)
    assert message.startswith("messages[0].content[1]: a content list holds parts, not bare strings")
    assert "'what is this?'" in message and "None" not in message
