"""serving.choices and runtime.logprobs without a model: token strings / bytes of byte-level and Metaspace
vocabularies, log-probabilities against torch, a job's events as per-choice items."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from coverpruner.runtime.logprobs import token_logprob
from coverpruner.serving.choices import Delta, End, Finished, Piece, TokenText, items

TEXT = "héllo wörld, naïve café ✓ 東京 hello world"


def _trained(pre, decoder) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None if isinstance(pre, pre_tokenizers.ByteLevel) else "<unk>",
                               byte_fallback=not isinstance(pre, pre_tokenizers.ByteLevel)))
    tok.pre_tokenizer, tok.decoder = pre, decoder
    alphabet = pre_tokenizers.ByteLevel.alphabet() if isinstance(pre, pre_tokenizers.ByteLevel) else []
    special = [] if alphabet else ["<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    tok.train_from_iterator(["hello world", "hello there"] * 20, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=alphabet, special_tokens=special))
    return tok


def test_byte_level_token_bytes_join_to_the_text():
    tok = _trained(pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel())
    ids = tok.encode(TEXT).ids
    text = TokenText(tok)
    assert b"".join(bytes(text.of(i)[1]) for i in ids) == TEXT.encode("utf-8")
    # "東" is three bytes, none merged in training: each token holds part of a character
    partial = [text.of(i)[0] for i in ids if not bytes(text.of(i)[1]).decode("utf-8", "ignore")]
    assert partial and all(s.startswith("bytes:\\x") for s in partial)


def test_metaspace_tokens_carry_their_space_and_byte_fallback():
    tok = _trained(pre_tokenizers.Metaspace(), decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()]))
    ids = tok.encode(TEXT).ids
    joined = b"".join(bytes(TokenText(tok).of(i)[1]) for i in ids)
    assert joined.decode("utf-8").strip() == TEXT  # the decoder drops the first word's space
    assert any(tok.id_to_token(i).startswith("<0x") for i in ids)  # the unseen characters went byte by byte


def test_token_logprob_is_log_softmax():
    rng = np.random.default_rng(0)
    for scale in (1.0, 30.0):
        logits = (rng.normal(size=1000) * scale).astype(np.float32)
        logits[[5, 9]] = logits.max() + 1  # a tie at the top: lower id first
        ref = torch.log_softmax(torch.from_numpy(logits).double(), -1)
        got = token_logprob(logits, 9, 5)
        assert got.logprob == pytest.approx(float(ref[9]), abs=1e-12)
        want = sorted(range(1000), key=lambda i: (-float(ref[i]), i))[:5]
        assert [t for t, _ in got.top] == want and want[:2] == [5, 9]
        assert np.allclose([lp for _, lp in got.top], ref[want].numpy(), rtol=0, atol=1e-12)
    assert token_logprob(np.zeros(4, np.float32), 2, 0).top == ()


def test_items_of_job_events():
    lp = token_logprob(np.zeros(4, np.float32), 2, 0)
    assert items("piece", Piece("ab", 1)) == [Delta(1, "ab", [])]
    assert items("piece", Piece("", 0)) == []  # nothing to send
    assert items("piece", Piece("", 0, lp)) == [Delta(0, "", [lp])]  # a held-back token still reports its logprob
    assert items("done", Finished(1, "r1")) == [End(1, "r1")]


def test_chat_logprobs_json_is_the_entries_encoded_without_a_container_per_entry():
    """chat_logprobs_json (a large answer's logprobs, issue 40) is json.dumps of chat_logprobs' object, compact, and
    builds strings only: 2,000 entries of 20 alternatives as dicts ran the garbage collector hundreds of times
    (its full passes over them held the GIL ~0.1 s); as text, a handful at most."""
    import gc
    import json

    from coverpruner.runtime.logprobs import TokenLogprob
    from coverpruner.serving.choices import chat_logprobs, chat_logprobs_json

    tok = _trained(pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel())
    text = TokenText(tok)
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(0, tok.get_vocab_size(), 2000 * 21)]  # "東"'s partial bytes among them
    lps = [float(x) for x in -rng.random(2000 * 21) * 30]  # python floats, as runtime.logprobs gives them
    entries = [TokenLogprob(ids[k], lps[k], tuple(zip(ids[k + 1:k + 21], lps[k + 1:k + 21])))
               for k in range(0, len(ids), 21)]
    reference = json.dumps(chat_logprobs(entries, text), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    before = gc.get_stats()[0]["collections"]
    got = chat_logprobs_json(entries, text)
    collections = gc.get_stats()[0]["collections"] - before
    assert got == reference
    dict_collections = gc.get_stats()[0]["collections"]
    chat_logprobs(entries, text)
    dict_collections = gc.get_stats()[0]["collections"] - dict_collections
    assert collections <= 5 and dict_collections > 50, (collections, dict_collections)
    with pytest.raises(ValueError, match="not JSON compliant"):  # as json.dumps(allow_nan=False)
        chat_logprobs_json([TokenLogprob(1, float("-inf"))], text)
