"""LLaVA-1.5's hooks for the conversation reference (tests/conversations/reference.py): how transformers loads,
prepares and embeds this family. Written from transformers, never from coverpruner."""

from __future__ import annotations

#: pruned positions: "compact" (0..L'-1, decode at L'+t) or "native" (kept rows keep theirs, decode after the max)
POSITIONS = "compact"


def load(ckpt):
    """(HF processor, eager float32 model)."""
    import torch
    import transformers as tf

    model = tf.LlavaForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    return tf.AutoProcessor.from_pretrained(str(ckpt)), model


def processor_inputs(processor, text: str, images: list) -> dict:
    return processor(images=images or None, text=text, return_tensors="pt")


def image_features(model, inputs: dict) -> list:
    """Per image, its span rows [S_j, d] as HF computes them."""
    import torch

    cfg = model.config
    with torch.no_grad():
        out = model.get_image_features(pixel_values=inputs["pixel_values"],
                                       vision_feature_layer=cfg.vision_feature_layer,
                                       vision_feature_select_strategy=cfg.vision_feature_select_strategy)
    feats = out.pooler_output if hasattr(out, "pooler_output") else out
    return list(feats)


def single_image_reference(fam, img, prompt: str, budget: int, steps: int):
    """(tokens, kept indices, relevance) from tests/families/llava/hf_reference.py."""
    from tests.families.llava import hf_reference as ref

    tokens, keep, relevance, _ = ref.pruned_generate(fam.model, fam.processor, img, prompt, budget, "coverpruner",
                                                     steps)
    return tokens, keep, relevance
