"""Gemma 3's hooks for the conversation reference (tests/conversations/reference.py): how transformers loads,
prepares and embeds this family. Written from transformers (tests/families/gemma3/hf_gemma3.py), never from
coverpruner."""

from __future__ import annotations

from tests.families.gemma3 import hf_gemma3 as hf

#: pruned positions: compact 0..L'-1, decode at L'+t (Gemma's rotary is 1-D)
POSITIONS = "compact"


def load(ckpt):
    return hf.load(ckpt)


def processor_inputs(processor, text: str, images: list) -> dict:
    return hf.processor_inputs(processor, text, images)


def expanded_text(processor, text: str, images: list):
    """(the processor's expanded text, [(start, placeholder length, replacement length)] per image): the image
    placeholder <start_of_image> becomes text and soft tokens, not one token per row."""
    if not images:
        return text, []
    expanded, edits, _ = hf.expand(processor, text, images)
    return expanded, edits


def image_features(model, inputs: dict) -> list:
    """Per image (one crop each: no pan-and-scan here), its soft-token rows [T, d]."""
    return list(hf.native(model, inputs).features.reshape(-1, model.config.mm_tokens_per_image,
                                                          model.config.text_config.hidden_size))


def prefill_kwargs(model, ids) -> dict:
    """The pruned prefill's token_type_ids [1, L'] (ids: its token ids): transformers' own block mask of the kept
    soft tokens."""
    return {"token_type_ids": hf.token_types(ids, model.config.image_token_id)}


def single_image_reference(fam, img, prompt: str, budget: int, steps: int):
    """(tokens, kept indices, relevance) from tests/families/gemma3/hf_reference.py."""
    from tests.families.gemma3 import hf_reference as ref

    answer = ref.one_image(fam.model, fam.processor, img, prompt, budget, "coverpruner", steps)
    return answer.tokens, answer.keep[0], answer.relevance[0]
