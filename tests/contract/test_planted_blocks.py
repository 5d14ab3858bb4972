"""Contract v5 proof: a family planted in a temporary package declares attention masks beyond causal (its image
rows in two bidirectional prefill blocks, a sliding window on every decoder layer and on the probe's layer 0) and
runs export -> Pipeline -> tokens equal to an independent torch reference, in both decoder forms, with no file
outside its package (tests/contract/planted_blocks/, copied to tmp_path).

The reference is written here on the HF LLaVA model with masks built here from the rule, one pair at a time: key k is
seen by row q when k > q - WINDOW and (k <= q or both are rows of one block). HF image features, HF eager layer-0
attention under that mask (instruction rows x image columns), the literal float64 selector, its own pruned rows and
compact positions, HF's layers prefilled with the pruned rows' mask and decoded with the window.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

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


@pytest.fixture(scope="module")
def image():
    from tests.contract.planting import noise_image

    return noise_image()


@pytest.fixture(scope="module")
def want(planted, image):
    return reference(planted[0], image)


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
