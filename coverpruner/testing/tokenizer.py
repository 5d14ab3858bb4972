"""A real fast BPE tokenizer trained locally with `tokenizers` for random-weight test checkpoints.

Llama-like: Metaspace pre-tokenization ("▁" marks word starts), newlines split off as their own
pieces, BOS added by the post-processor, and the LLaVA specials `<image>` / `<pad>` appended after
the trained vocabulary (as llava-hf appends them after Llama's 32000 pieces), then JSON's punctuation.
"""

from __future__ import annotations

import random

SPECIAL_BASE = ["<unk>", "<s>", "</s>"]
SPECIAL_ADDED = ["<image>", "<pad>"]
#: JSON's punctuation that the corpus lacks, appended as plain (non-special) tokens after the specials, as a real
#: vocabulary has them (Llama's through byte fallback): structured output (response_format) needs "{", '"', ...
#: Appended last, so every trained id stays; 1002 + 8 tokens still round up to the same 1024-row embedding.
JSON_ADDED = ["{", "}", "[", "]", '"', "-", "+", "\\"]

_WORDS = (
    "a an the this that these those is are was were be been has have had do does did what which who "
    "where when why how many much color colour shape size left right top bottom middle center front back "
    "image picture photo scene object person people man woman child dog cat bird car bus truck bicycle "
    "street road sign stop traffic light tree sky cloud water river sea beach mountain house building "
    "window door table chair cup bottle plate food pizza sandwich apple banana orange red green blue "
    "yellow black white brown gray pink purple small large big tall short old new open closed sitting "
    "standing walking running holding wearing looking playing eating drinking reading writing text "
    "number word letter label answer question describe detail short brief single phrase yes no there "
    "in on at of to from with without near above below behind between inside outside and or but not "
    "please using one two three four five six seven eight nine ten first second third last count"
).split()


def corpus(seed: int, lines: int = 4000) -> list[str]:
    """Deterministic English-like lines, including chat-template pieces, so merges look realistic."""
    rng = random.Random(seed)
    # The chat-template words appear often so they become single pieces, as in a real vocabulary.
    out = ["USER: <image>\nWhat is shown in this image? ASSISTANT:"] * 200
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        sentence = " ".join(words).capitalize() + rng.choice([".", "?", "!", ",", ":"])
        if rng.random() < 0.2:
            sentence += "\n" + " ".join(rng.choice(_WORDS) for _ in range(4))
        if rng.random() < 0.1:
            sentence += f" {rng.randint(0, 2025)}"
        out.append(sentence)
    return out


def train_tokenizer(vocab_size: int = 1000, seed: int = 0):
    """Train a BPE `tokenizers.Tokenizer` (ids: <unk>=0, <s>=1, </s>=2, trained pieces, <image>, <pad>).

    Returns the `tokenizers.Tokenizer`; its length is vocab_size + 2 (the appended specials) + len(JSON_ADDED).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    # Newline is isolated first so "\n" is a piece of its own (like Llama's <0x0A>), then Metaspace.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", behavior="isolated"), pre_tokenizers.Metaspace(prepend_scheme="first")]
    )
    tok.decoder = decoders.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_BASE, show_progress=False, initial_alphabet=["\n", "▁"]
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_ADDED])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in JSON_ADDED])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok
