"""What Gemma 3's independent HF reference is made of (tests only; torch + transformers, never coverpruner's layout,
positions, masks or selectors): the processor's inputs of a conversation (its chat template, its image processor
with or without pan-and-scan, its placeholder expansion), the instruction tokens found in the processor's expanded
text, the HF model's merge of image features, its layer-0 attention with its own masks (token_type_ids: the image
block overlay; the sliding window) and a greedy loop whose prefill passes the pruned rows' token_type_ids, so that
transformers builds the block mask of the kept soft tokens itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def load(ckpt):
    """(Gemma3Processor, eager float32 Gemma3ForConditionalGeneration) of a checkpoint."""
    import transformers as tf

    model = tf.Gemma3ForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32,
                                                                attn_implementation="eager").eval()
    return tf.AutoProcessor.from_pretrained(str(ckpt)), model


def processor_kwargs(processor, pan: bool) -> dict:
    """The image kwargs of one call: Gemma3Processor's defaults (its images_kwargs), do_pan_and_scan set."""
    return {**type(processor).images_kwargs, "do_pan_and_scan": bool(pan)}


def processor_inputs(processor, text: str, images: list, pan: bool = False) -> dict:
    """The processor on rendered text (it renders <bos>: no second one is added, as apply_chat_template does)."""
    return processor(images=images or None, text=text, return_tensors="pt", add_special_tokens=False,
                     images_kwargs=processor_kwargs(processor, pan))


def expand(processor, text: str, images: list, pan: bool = False) -> tuple[str, list[tuple[int, int, int]], list]:
    """The processor's expanded text (each <start_of_image> replaced by its image's soft-token sequence), per
    replacement (start in ``text``, placeholder length, replacement length), and each image's pan-and-scan crops."""
    processed, replacements = processor._process_images(images, **processor_kwargs(processor, pan))
    expanded, _ = processor.get_text_with_replacements([text], list(replacements))
    marker, at, edits = processor.image_token, 0, []
    for r in replacements:
        at = text.index(marker, at)
        edits.append((at, len(marker), len(r)))
        at += len(marker)
    return expanded[0], edits, [int(c) for c in processed["num_crops"]]


def shift(span: tuple[int, int], edits) -> tuple[int, int]:
    """A character span of the unexpanded text (no placeholder inside) -> the same characters in the expanded one."""
    moved = sum(new - old for at, old, new in edits if at < span[0])
    return span[0] + moved, span[1] + moved


def instruction_positions(processor, expanded: str, spans, ids: torch.Tensor, image_id: int) -> np.ndarray:
    """int64 [T]: tokens of the expanded text whose non-empty offsets overlap any of ``spans`` (expanded-text
    character spans), image tokens never; checks the tokenization is the processor's ids."""
    enc = processor.tokenizer(expanded, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids.tolist(), "the processor's ids are not its expanded text's tokens"
    return np.asarray([i for i, (a, b) in enumerate(enc["offset_mapping"])
                       if b > a and enc["input_ids"][i] != image_id and any(a < e and b > s for s, e in spans)],
                      dtype=np.int64)


@dataclass
class Request:
    """One conversation laid out by HF: inputs (the processor's), embeds float32 [1,L,d] (HF's merge), visual int64
    [n] (the soft-token rows), features float32 [n,d] (HF's image features, crop after crop)."""

    inputs: dict
    embeds: torch.Tensor
    visual: np.ndarray
    features: torch.Tensor


def native(model, inputs: dict) -> Request:
    """HF's merge of the image features into the embedded ids (masked_scatter order: crop after crop)."""
    ids = inputs["input_ids"][0]
    visual = torch.nonzero(ids == model.config.image_token_id).flatten()
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids[None]).clone()
        feats = torch.zeros(0, embeds.shape[-1])
        if "pixel_values" in inputs:
            feats = model.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output
            feats = feats.reshape(-1, feats.shape[-1])
            embeds[0, visual] = feats
    return Request(inputs, embeds, visual.numpy(), feats)


def layer0_attention(model, inputs: dict) -> torch.Tensor:
    """[H, L, L] layer-0 attention of the whole model on the processor's inputs: transformers' own masks (the
    sliding window of layer 0 and the image block overlay from token_type_ids)."""
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    return out.attentions[0][0].float()


def token_types(ids: torch.Tensor, image_id: int) -> torch.Tensor:
    """int64 [1, L']: 1 at soft-token rows (what Gemma3Processor returns as token_type_ids)."""
    return (ids == image_id).long()[None]


def greedy(model, embeds: torch.Tensor, ids: torch.Tensor, steps: int, eos: set[int]) -> list[int]:
    """Greedy loop on HF's model: prefill embeds [1,L',d] at 0..L'-1 with token_type_ids of ``ids`` [L'] (HF
    builds the kept soft tokens' block mask from them), then token t at L' + t (as generate: no token types at
    decode). Stops after ``steps`` tokens or at EOS (included)."""
    out, length = [], embeds.shape[1]
    with torch.no_grad():
        res = model(inputs_embeds=embeds, token_type_ids=token_types(ids, model.config.image_token_id),
                    position_ids=torch.arange(length)[None], use_cache=True)
        for t in range(steps):
            tok = int(res.logits[0, -1].argmax())
            out.append(tok)
            if tok in eos or t == steps - 1:
                break
            res = model(input_ids=torch.tensor([[tok]]), position_ids=torch.tensor([[length + t]]),
                        cache=res.cache, use_cache=True)
    return out


def eos_ids(model) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, (list, tuple)) else [eos])
