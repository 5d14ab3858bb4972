"""LLaVA-NeXT's hooks for the conversation reference (tests/conversations/reference.py): how transformers loads,
prepares and embeds this family (anyres packing with image_newline rows). Written from transformers."""

from __future__ import annotations

import numpy as np

#: pruned positions: "compact" (0..L'-1, decode at L'+t)
POSITIONS = "compact"


def load(ckpt):
    import torch
    import transformers as tf

    model = tf.LlavaNextForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32,
                                                                 attn_implementation="eager").eval()
    return tf.AutoProcessor.from_pretrained(str(ckpt)), model


def processor_inputs(processor, text: str, images: list) -> dict:
    return processor(images=images or None, text=text, return_tensors="pt")


def image_features(model, inputs: dict) -> list:
    """Per image, its packed span rows [S_j, d] (base, unpadded grid, image_newline after each grid row)."""
    import torch

    with torch.no_grad():
        return list(model.get_image_features(pixel_values=inputs["pixel_values"],
                                             image_sizes=inputs["image_sizes"]).pooler_output)


def newline_rows(model, features) -> np.ndarray:
    """bool [S_j]: the rows that are HF's image_newline vector (not candidates; kept with newline_policy keep)."""
    return (features == model.model.image_newline[None]).all(dim=1).numpy()


def single_image_reference(fam, img, prompt: str, budget: int, steps: int):
    """(tokens, kept indices, relevance) from tests/families/llava_next/hf_reference.py."""
    from tests.families.llava_next import hf_reference as ref

    req = ref.native_request(fam.model, fam.processor, img, prompt)
    return ref.pruned_generate(fam.model, fam.model, req, budget, "coverpruner", "drop", steps)
