"""Contract v5 proof: a family planted in a temporary package declares attention masks beyond causal (its image
rows in two bidirectional prefill blocks, a sliding window on every decoder layer and on the probe's layer 0) and
runs export -> Pipeline -> tokens equal to an independent torch reference, in both decoder forms, with no file
outside its package (tests/contract/planted_blocks/, copied to tmp_path).

The reference is written here on the HF LLaVA model with masks built here from the rule, one pair at a time: key k is
seen by row q when k > q - WINDOW and (k <= q or both are rows of one block). HF image features, HF eager layer-0
attention under that mask (instruction rows x image columns), the literal float64 selector, its own pruned rows and
compact positions, HF's layers prefilled with the pruned rows' mask and decoded with the window. The engine loop's
cuts (prefill chunks under a step budget, the admission worker's staging calls) move to the blocks' edges from the
declaration alone, with the same tokens.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tests.contract.planting import image, want  # noqa: F401 - the planted tests' shared fixtures

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch", reason="the reference runs the PyTorch model")

PROMPT = "What is shown in this image?"
NEW = 8
BUDGET = 32  # pruned prompt ~47 rows: past the window
WINDOW = 40  # planted_blocks/runtime.py


@pytest.fixture(scope="module")
def planted(builds, tmp_path_factory):
    """(checkpoint, {form: engine dir}) exported with the planted family registered."""
    from tests.contract import planted_blocks
    from tests.contract.planting import planted as plant

    root = tmp_path_factory.mktemp("planted_blocks")
    checkpoint = root / "checkpoint"
    shutil.copytree(builds.checkpoint("tiny"), checkpoint)
    with plant(planted_blocks, checkpoint, root) as exports:
        yield checkpoint, exports


def mask(blocks: np.ndarray, past: int, window: int) -> torch.Tensor:
    """float [1, 1, S, past + S] additive mask of S new rows after ``past`` rows; blocks int [past + S] (-1 text)."""
    total = len(blocks)
    out = torch.full((1, 1, total - past, total), torch.finfo(torch.float32).min)
    for s in range(total - past):
        q = past + s
        for k in range(total):
            same = blocks[q] >= 0 and blocks[k] == blocks[q]
            if k > q - window and (k <= q or same):
                out[0, 0, s, k] = 0.0
    return out


def reference(checkpoint, image, blocks_on: bool = True):
    """(new token ids, kept indices, pruned length, first logits float32 [V])."""
    from tests.contract.planting import llava_request
    from tests.literal_selection import coverage_reference

    model, ids, vpos, instr, feats, embeds = llava_request(checkpoint, image, PROMPT)
    image_id = model.config.image_token_id
    lm = model.model.language_model
    with torch.no_grad():
        blocks = np.full(len(ids), -1)
        blocks[vpos.numpy()] = (np.arange(len(vpos)) >= len(vpos) // 2).astype(int)
        att = lm(inputs_embeds=embeds, attention_mask=mask(blocks, 0, WINDOW), output_attentions=True).attentions[0]
    relevance = att[0][:, instr][:, :, vpos].double().mean(dim=(0, 1)).numpy()
    keep = coverage_reference(feats.numpy(), relevance, BUDGET, 0.3)
    rows = torch.sort(torch.cat([torch.nonzero(ids != image_id).flatten(), vpos[torch.from_numpy(keep)]])).values
    kept_blocks = blocks[rows.numpy()] if blocks_on else np.full(len(rows), -1)
    out, length, first = [], len(rows), None
    with torch.no_grad():
        res = lm(inputs_embeds=embeds[:, rows], attention_mask=mask(kept_blocks, 0, WINDOW),
                 position_ids=torch.arange(length)[None], use_cache=True)
        for t in range(NEW):
            logits = model.lm_head(res.last_hidden_state[:, -1])[0]
            first = logits.numpy() if first is None else first
            token = int(logits.argmax())
            out.append(token)
            step = np.concatenate([kept_blocks, np.full(t + 1, -1)])
            res = lm(inputs_embeds=model.get_input_embeddings()(torch.tensor([[token]])),
                     attention_mask=mask(step, length + t, WINDOW), position_ids=torch.tensor([[length + t]]),
                     past_key_values=res.past_key_values, use_cache=True)
    return out, keep, len(rows), first


def test_manifest_records_the_attention(planted):
    from coverpruner.engine_dir import load_manifest

    for form, path in planted[1].items():
        manifest = load_manifest(path, verify=False)
        attention = manifest.graphs["decoder"].attention
        assert manifest.family == "planted_blocks" and attention.blocks and attention.windows == (WINDOW, WINDOW)
        inputs = {t.name for t in manifest.graphs["decoder"].inputs}
        # standard: the rows' block ids (HF's own masks inside); ORT: the host's additive mask per window
        assert ("attention_blocks" in inputs) == (form == "standard")
        assert (f"attention_bias.{WINDOW}" in inputs) == (form == "ort")


@pytest.mark.parametrize("form", ["ort", "standard"])
def test_planted_family_equals_torch_reference(planted, image, want, form):
    from coverpruner.runtime import Pipeline

    tokens, keep, length, _ = want
    pipe = Pipeline.load(planted[1][form], provider="cpu", threads=1)
    got = pipe.generate(image, PROMPT, budget=BUDGET, method="coverpruner", max_new_tokens=NEW)
    assert got.kept_indices.tolist() == keep.tolist()
    assert got.prefill_tokens == length > WINDOW
    assert got.token_ids == tokens


def test_blocks_change_the_logits(planted, image, want):
    """The blocks matter: with the same kept rows but causal image rows the first logits move by far more than the
    float32 rounding the token comparison above could hide behind (~1e-6)."""
    _, keep, _, plain = reference(planted[0], image, blocks_on=False)
    assert keep.tolist() == want[1].tolist() and np.abs(plain - want[3]).max() > 1e-2


def _ranges(planted, image, keep) -> list[tuple[int, int]]:
    """The planted rule's ranges [lo, hi) of pruned rows that one decoder call must hold, from the HF processor's
    ids and the reference's kept indices: the image's kept rows follow the text before it, in index order; indices
    < n/2 are block 0, the rest block 1 (planted_blocks/runtime.py); a block of one kept row needs no range."""
    import transformers

    from tests.families.llava import hf_reference as ref

    processor = transformers.AutoProcessor.from_pretrained(str(planted[0]))
    ids = ref.hf_inputs(processor, image, PROMPT)[0]["input_ids"][0].numpy()
    vpos = np.flatnonzero(ids == processor.tokenizer.convert_tokens_to_ids(processor.image_token))
    a, half = int(vpos[0]), len(vpos) // 2
    first = int((np.asarray(keep) < half).sum())
    return [(lo, hi) for lo, hi in ((a, a + first), (a + first, a + len(keep))) if hi - lo > 1]


def _held_whole(calls, ranges) -> None:
    """calls: (start, stop) of one request's decoder calls in order -> every range inside one call."""
    for lo, hi in ranges:
        assert any(start <= lo and hi <= stop for start, stop in calls), (lo, hi, calls)


def test_chunks_and_staging_calls_end_at_block_edges(planted, image, want, monkeypatch):
    """The engine's cuts follow the declaration, never the family: with a 6-token step budget (the planted blocks
    hold ~16 kept rows each) a second request's prefill chunks beside the first one's decodes end at block edges
    (each chunk's rows but its last in one call, its last row alone in the decode call, never a block's row), a
    block runs whole over the budget; the admission worker's staging calls (cut to 6 rows here) hold each block
    whole too. Every answer equals the torch reference."""
    import coverpruner.runtime.engine as engine_mod
    from coverpruner.runtime import Pipeline
    from coverpruner.runtime.slots import BatchSlots

    tokens, keep, length, _ = want
    ranges = _ranges(planted, image, keep)
    assert ranges and all(hi - lo > 6 for lo, hi in ranges)  # the budget below would cut every block
    pipe = Pipeline.load(planted[1]["ort"], provider="cpu", threads=1)
    kw = dict(budget=BUDGET, method="coverpruner", max_new_tokens=NEW)

    engine = pipe.engine(max_batch=2, capacity=256, max_step_tokens=6)
    first = engine.submit(pipe.request(image, PROMPT, **kw))
    results, calls, beside, second = {}, [], False, None
    while engine.pending:
        for event in engine.step():
            assert event.error is None
            if event.result is not None:
                results[event.request_id] = event.result
            elif second is None and event.request_id == first:  # its first token: the next prefill runs beside
                second = engine.submit(pipe.request(image, PROMPT, **kw))
        for chunk in engine.last_plan.prefills:
            if chunk.rid == second:
                calls += [(chunk.start, chunk.stop - 1), (chunk.stop - 1, chunk.stop)]
                beside |= bool(engine.last_plan.decodes)
    assert beside and calls[-1][1] == length
    _held_whole(calls, ranges)
    assert any(stop - start > 6 for start, stop in calls)  # a block ran whole, over the step's budget
    assert [results[first].token_ids, results[second].token_ids] == [tokens, tokens]

    staged = []
    monkeypatch.setattr(engine_mod, "STAGE_ROWS", 6)
    stage_rows = BatchSlots.stage_rows
    monkeypatch.setattr(BatchSlots, "stage_rows", lambda self, rows: (staged.append(len(rows.embeds)),
                                                                      stage_rows(self, rows))[1])
    engine = pipe.engine(max_batch=2, capacity=256, threaded=True)
    try:
        rid = engine.submit(pipe.request(image, PROMPT, **kw))
        got = None
        while engine.pending:
            for event in engine.step(wait=0.05):
                assert event.error is None
                got = event.result if event.request_id == rid and event.result is not None else got
    finally:
        engine.close()
    ends = np.cumsum([0, *staged])
    assert ends[-1] == length - 1 and len(staged) > 2  # rows but the last, in several staging calls
    _held_whole(list(zip(ends[:-1].tolist(), ends[1:].tolist())), ranges)
    assert got.token_ids == tokens
