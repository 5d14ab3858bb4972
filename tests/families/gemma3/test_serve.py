"""Gemma 3 behind the default coverpruner-serve (ORT-form dir: a batch of 8 slots, the prefix cache, admission with
its staging prefill beside the decode steps): several concurrent requests with bidirectional image blocks answer as
a server that neither batches nor caches (--max-batch 1 --prefix-cache-mb 0), again with their prefixes cached, and
the admission worker's staging calls (256 rows, which would cut the 144-row blocks of a full pan-and-scan prompt)
never split a block."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.families.gemma3.fixtures import wide_image

pytestmark = pytest.mark.slow
pytest.importorskip("openai", reason="the serving tests talk through the openai client")

NEW = 8
#: (image, question, extra body): pan-and-scan in full (~600 prompt rows, four blocks of 144), pan-and-scan at 64, a
#: one-crop image at 16 with DivPrune
CASES = [(wide_image(2, (300, 800)), "Which colour is it?", {"budget": "full", "pan_and_scan": True}),
         (wide_image(0, (300, 800)), "What is shown in this image?", {"budget": 64, "pan_and_scan": True}),
         (wide_image(1, (240, 200)), "Describe it.", {"budget": 16, "method": "divprune"})]


def _png(image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _ask(url: str, case) -> tuple[str, int]:
    """(answer text, cached prompt tokens) of one case, greedy."""
    import openai

    from tests.serving.conftest import data_url

    image, question, extra = case
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    r = client.chat.completions.create(
        model="gemma", max_tokens=NEW, temperature=0, extra_body={**extra, "ignore_eos": True},
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(_png(image))}},
                                               {"type": "text", "text": question}]}])
    details = r.usage.prompt_tokens_details
    return r.choices[0].message.content, (details.cached_tokens if details else 0) or 0


def test_default_server_answers_as_one_at_a_time_with_staged_blocks_whole(gemma3_ort_export, monkeypatch):
    from coverpruner.engine_dir import ATTENTION_BLOCKS
    from coverpruner.runtime.slots import BatchSlots
    from coverpruner.serving import ServerConfig
    from tests.serving.conftest import start_server

    staged = []  # per staged request, the block ids of each of its staging calls
    stage, stage_rows = BatchSlots.stage, BatchSlots.stage_rows
    monkeypatch.setattr(BatchSlots, "stage", lambda self, *args: (staged.append([]), stage(self, *args))[1])
    monkeypatch.setattr(BatchSlots, "stage_rows",
                        lambda self, rows: (staged[-1].append(rows.extras[ATTENTION_BLOCKS]), stage_rows(self, rows)))

    plain = ServerConfig(str(gemma3_ort_export), threads=1, model_name="gemma", max_batch=1, prefix_cache_mb=0)
    with start_server(plain) as url:
        want = [_ask(url, case)[0] for case in CASES]
    assert not staged  # one slot: no staging
    with start_server(ServerConfig(str(gemma3_ort_export), threads=1, model_name="gemma")) as url:
        for round in range(2):  # cold, then with the first round's prefixes cached
            with ThreadPoolExecutor(len(CASES)) as ex:
                got = list(ex.map(lambda case: _ask(url, case), CASES))
            assert [text for text, _ in got] == want
            assert all(cached > 0 for _, cached in got) == (round == 1)
    assert any(len(calls) > 1 for calls in staged)  # the full pan-and-scan prompt took several staging calls
    for calls in staged:
        seen = {}
        for k, ids in enumerate(calls):
            for b in np.unique(ids[ids >= 0]).tolist():
                assert seen.setdefault(b, k) == k, f"block {b} split between staging calls {seen[b]} and {k}"
