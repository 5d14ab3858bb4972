"""Reference answers built directly on the HF PyTorch model (tests only; imports torch/transformers).

pruned_generate: HF processor -> HF image features -> HF layer-0 attention demand from instruction positions found
here from the HF tokenizer's own offsets -> the literal float64 greedy / literal DivPrune of
tests/literal_selection.py -> pruned inputs_embeds with compact positions -> HF generate. Nothing here uses the
exported graphs, coverpruner.selection or the pipeline's prompt encoder.
"""

import numpy as np
import torch

from tests.literal_selection import coverage_reference, divprune_reference


def hf_inputs(processor, image, prompt):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    return processor(images=image, text=text, return_tensors="pt"), text


def hf_full_generate(model, processor, image, prompt, max_new_tokens):
    """Unpruned HF generate with the HF processor; returns the new token ids."""
    inputs, _ = hf_inputs(processor, image, prompt)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def hf_image_features(model, pixel_values):
    cfg = model.config
    with torch.no_grad():
        out = model.get_image_features(pixel_values=pixel_values, vision_feature_layer=cfg.vision_feature_layer,
                                       vision_feature_select_strategy=cfg.vision_feature_select_strategy)
    feats = out.pooler_output if hasattr(out, "pooler_output") else out
    return feats[0] if isinstance(feats, (list, tuple)) else feats[0]


def hf_layer0_relevance(model, inputs_embeds, visual_pos, instr_pos):
    """Layer-0 attention (eager, softmax in float32) from instruction rows to visual columns,
    averaged over heads and rows. inputs_embeds [1,L,d] -> float32 [n]."""
    lm = model.model.language_model
    with torch.no_grad():
        out = lm(inputs_embeds=inputs_embeds, output_attentions=True)
    att = out.attentions[0][0].float()  # [H, L, L]
    return att[:, instr_pos][:, :, visual_pos].mean(dim=(0, 1)).numpy().astype(np.float32)


def instruction_positions(processor, text, prompt, input_ids, image_token_id):
    """Positions in the processor's input_ids [L] (image token expanded to n copies) of the tokens whose character
    span (HF tokenizer offsets, non-empty) overlaps the user's prompt inside the rendered chat template `text`.

    The rendered text holds one image placeholder; tokenized alone it gives the same ids as input_ids with that
    one token in place of the n copies (checked), so positions after it shift by n - 1."""
    enc = processor.tokenizer(text, return_offsets_mapping=True)  # special tokens as the processor adds them
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    start = text.rindex(prompt)  # the user's turn is the last place the prompt appears
    end = start + len(prompt)
    native = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
    full = input_ids.tolist()
    n = full.count(image_token_id)
    at = ids.index(image_token_id)
    assert ids.count(image_token_id) == 1 and full == ids[:at] + [image_token_id] * n + ids[at + 1:], \
        "the processor's input_ids are not the rendered text's tokens with the image token expanded"
    return np.asarray([i if i < at else i + n - 1 for i in native], dtype=np.int64)


def pruned_generate(model, processor, image, prompt, budget, method, max_new_tokens, tau=0.3):
    """Returns (new token ids, kept indices, relevance or None, instruction positions)."""
    inputs, text = hf_inputs(processor, image, prompt)
    ids = inputs["input_ids"][0]
    image_id = model.config.image_token_id
    vpos = torch.nonzero(ids == image_id).flatten()
    instr_pos = instruction_positions(processor, text, prompt, ids, image_id)
    feats = hf_image_features(model, inputs["pixel_values"])  # [n, d]
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids[None]).clone()
    embeds[0, vpos] = feats.to(embeds.dtype)
    relevance = None
    features = feats.float().numpy()
    if method == "coverpruner":
        relevance = hf_layer0_relevance(model, embeds, vpos.numpy(), instr_pos)
        keep = coverage_reference(features, relevance, budget, tau)
    elif method == "divprune":
        keep = divprune_reference(features, budget)
    else:
        raise ValueError(f"no literal reference for method {method!r}")
    text_rows = torch.nonzero(ids != image_id).flatten()
    rows = torch.sort(torch.cat([text_rows, vpos[torch.from_numpy(keep)]])).values
    pruned = embeds[:, rows]
    mask = torch.ones(pruned.shape[:2], dtype=torch.long)
    with torch.no_grad():  # positions default to 0..L'-1 from the cache: compact
        out = model.generate(inputs_embeds=pruned, attention_mask=mask, max_new_tokens=max_new_tokens,
                             do_sample=False)
    return out[0].tolist(), keep, relevance, instr_pos
