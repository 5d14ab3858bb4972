"""Pins the conversation references themselves (no pipeline): budget "full" is transformers' generate; demand
"turn" is causal; the instruction spans are the questions; the pruned sequence has the documented shape.

Each HF model is loaded once per session (tiny presets, float32, eager attention), so the unpruned reference and
model.generate run the same weights; only the path differs (the reference's own positions, packing and loop).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conversations import reference as R
from tests.conversations.conversations import (CONVERSATIONS, QUESTION_A, QUESTION_B, first_turn, three_images,
                                               two_turns)

pytestmark = pytest.mark.slow  # runs the tiny HF models
STEPS = 6


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("fam_name", R.FAMILIES)
def test_full_budget_is_transformers_generate(hf_family, fam_name, conversation):
    fam = hf_family(fam_name)
    messages = CONVERSATIONS[conversation]()
    ref = R.chat(fam, messages, budget="full", max_new_tokens=STEPS)
    assert ref.tokens == R.hf_generate(fam, messages, STEPS)
    nat = R.native(fam, messages)
    assert ref.rows.tolist() == list(range(nat.ids.numel())), "budget full keeps every row"


@pytest.mark.parametrize("fam_name", R.FAMILIES)
def test_turn_demand_is_causal(hf_family, fam_name):
    """Image A's demand and kept indices are the same with and without the later turns (layer 0 is causal), and
    the first request up to its generation prompt is a prefix of the second (what prefix reuse relies on; Qwen3.5's
    generation prompt opens a <think> block that the answer, rendered as an earlier turn, does not have)."""
    fam = hf_family(fam_name)
    one, two = R.native(fam, first_turn()), R.native(fam, two_turns())
    hf_messages, _ = R.normalize(first_turn())
    with_prompt, without = (fam.processor.apply_chat_template(hf_messages, add_generation_prompt=g, tokenize=False)
                            for g in (True, False))
    assert with_prompt.startswith(without)
    prompt = len(fam.processor.tokenizer(with_prompt[len(without):], add_special_tokens=False)["input_ids"])
    shared = one.ids.numel() - prompt
    assert two.ids[:shared].tolist() == one.ids[:shared].tolist()
    sel_one = R.select(fam, one, 16, demand="turn")
    sel_two = R.select(fam, two, 16, demand="turn")
    assert sel_one.keep[0].tolist() == sel_two.keep[0].tolist()
    # Same rows, same keys: the extra columns are causally masked (exact zeros after the softmax); only the
    # blocking of the float32 matmuls over a longer sequence can move the last bits (a few ulps of 1.2e-7).
    np.testing.assert_allclose(sel_two.relevance[0], sel_one.relevance[0], rtol=1e-5, atol=0)
    assert len(sel_two.keep) == 2 and all(k.size == 16 for k in sel_two.keep)


@pytest.mark.parametrize("fam_name", R.FAMILIES)
def test_latest_demand_reselects_with_the_new_question(hf_family, fam_name):
    fam = hf_family(fam_name)
    nat = R.native(fam, two_turns())
    tok = fam.processor.tokenizer
    assert tok.decode(nat.ids[nat.instr_turn[0]]).strip() == QUESTION_A
    assert tok.decode(nat.ids[nat.instr_turn[1]]).strip() == QUESTION_B
    assert nat.instr_latest.tolist() == nat.instr_turn[1].tolist()
    assert nat.image_message == [1, 3]
    turn, latest = R.select(fam, nat, 16, demand="turn"), R.select(fam, nat, 16, demand="latest")
    assert not np.allclose(turn.relevance[0], latest.relevance[0]), "image A's demand must follow the question"
    np.testing.assert_array_equal(turn.relevance[1], latest.relevance[1])  # image B: same question, same rows
    # image A's columns precede both questions, so "latest" reads them from the second question's rows
    assert nat.instr_latest.min() > nat.spans[1].max() > nat.spans[0].max()


@pytest.mark.parametrize("fam_name", R.FAMILIES)
def test_three_images_share_one_message(hf_family, fam_name):
    fam = hf_family(fam_name)
    nat = R.native(fam, three_images())
    assert len(nat.spans) == 3 and nat.image_message == [0, 0, 0]
    assert all(t.tolist() == nat.instr_latest.tolist() for t in nat.instr_turn)
    assert all(a.max() < b.min() for a, b in zip(nat.spans, nat.spans[1:])), "spans in image order"
    ans = R.chat(fam, three_images(), budget=16, max_new_tokens=STEPS)
    assert [k.size for k in ans.selection.keep] == [16, 16, 16]
    assert ans.rows.size == nat.ids.numel() - sum(s.size for s in nat.spans) + 3 * 16
    assert 1 <= len(ans.tokens) <= STEPS


@pytest.mark.parametrize("fam_name", R.FAMILIES)
def test_pruned_rows_are_text_plus_kept_rows_in_native_order(hf_family, fam_name):
    fam = hf_family(fam_name)
    nat = R.native(fam, two_turns())
    sel = R.select(fam, nat, 16, demand="turn")
    rows = R.pruned_rows(nat, sel)
    image = np.concatenate(nat.spans)
    kept = np.concatenate([span[cand[k]] for span, cand, k in zip(nat.spans, nat.candidates, sel.keep)])
    assert rows.tolist() == sorted(set(range(nat.ids.numel())) - set(image.tolist()) | set(kept.tolist()))
    positions, start = R.pruned_positions(fam, nat, rows)
    if fam.hooks.POSITIONS == "native":  # Qwen2.5-VL, Qwen3-VL
        assert torch.equal(positions, nat.positions[:, torch.from_numpy(rows)])
        assert start == int(nat.positions.max()) + 1
    else:
        assert positions.tolist() == [list(range(rows.size))] and start == rows.size


@pytest.mark.parametrize("fam_name", ["llava_next"])
def test_next_newline_rows(hf_family, fam_name):
    """Newline rows are not candidates; "drop" prunes them with the rest, "keep" keeps every one of them."""
    fam = hf_family(fam_name)
    nat = R.native(fam, two_turns())
    assert all(nl.any() for nl in nat.newline)
    drop = R.select(fam, nat, 16, newline_policy="drop")
    keep = R.select(fam, nat, 16, newline_policy="keep")
    for j, nl in enumerate(nat.newline):
        assert not nl[drop.rows[j]].any()
        assert keep.rows[j].size == 16 + int(nl.sum()) and nl[keep.rows[j]].sum() == nl.sum()


@pytest.mark.parametrize("fam_name", ["qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("conversation", ["two_turns", "three_images"])
def test_qwen_pruning_is_masking(hf_family, fam_name, conversation):
    """With native positions, dropping rows == masking their columns in the full sequence (Qwen2.5-VL rule; Qwen3-VL
    with its DeepStack rows gathered with the kept rows, and added at every row of the masked sequence)."""
    fam = hf_family(fam_name)
    nat = R.native(fam, CONVERSATIONS[conversation]())
    sel = R.select(fam, nat, 16)
    ans = R.chat(fam, CONVERSATIONS[conversation](), budget=16, max_new_tokens=STEPS)
    assert ans.tokens == R.masked_chat(fam, nat, sel, STEPS)


@pytest.mark.parametrize("fam_name", R.FAMILIES)
def test_image_without_text_has_uniform_weights(hf_family, fam_name):
    """A user message with an image and no text has no instruction rows: no demand, uniform weights (the literal
    greedy with relevance None); under "latest" the last user message's question gives it a demand."""
    from tests.literal_selection import coverage_reference

    fam = hf_family(fam_name)
    messages = [{"role": "user", "content": [{"type": "image", "image": two_turns()[1]["content"][0]["image"]}]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": QUESTION_B}]
    nat = R.native(fam, messages)
    assert nat.instr_turn[0].size == 0 and nat.instr_latest.size > 0
    sel = R.select(fam, nat, 16, demand="turn")
    feats = nat.features[0][torch.from_numpy(nat.candidates[0])].double().numpy()
    assert sel.relevance[0] is None and sel.keep[0].tolist() == coverage_reference(feats, None, 16).tolist()
    assert R.select(fam, nat, 16, demand="latest").relevance[0] is not None
