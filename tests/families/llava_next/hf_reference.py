"""HF PyTorch reference for LLaVA-NeXT pipeline tests (tests only; torch + transformers).

Independent of the code under test: HF's processor tokenizes and tiles, HF's get_image_features packs
(image_newline rows are found as the rows equal to the model's image_newline vector), layer-0 attention
comes from the eager HF model over the full native sequence, positions are HF's own (generate from
inputs_embeds counts 0..L'-1), and the selectors are literal float64 transcriptions of the method:
    coverpruner: M = cos(V, V); A = max(0, M - rowmean(M)); w = exp(tau * minmax(r));
                 c = 0; m times k* = argmax_{k not in S} sum_i w_i max(0, A_ik - c_i); c = max(c, A[:, k*])
    divprune:    D = 1 - cos; first = argmax_i min_{j != i} D_ij; then argmax_i min_{s in S} D_is
Ties: the lowest index wins (np.argmax), as the project's selectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class NativeRequest:
    """ids int64 [L]; embeds float [1,L,d] (HF merge); image_pos int64 [S]; newline bool [S];
    instr int64 [T]; inputs: the processor's output (for the unpruned generate)."""

    ids: torch.Tensor
    embeds: torch.Tensor
    image_pos: np.ndarray
    newline: np.ndarray
    instr: np.ndarray
    inputs: dict


def native_request(model, processor, image, prompt) -> NativeRequest:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=image, text=text, return_tensors="pt")
    ids = inputs["input_ids"][0]
    image_pos = torch.nonzero(ids == model.config.image_token_id).flatten().numpy()
    with torch.no_grad():
        rows = model.get_image_features(pixel_values=inputs["pixel_values"],
                                        image_sizes=inputs["image_sizes"]).pooler_output[0]
        embeds = model.get_input_embeddings()(ids[None]).clone()
    embeds[0, torch.from_numpy(image_pos)] = rows
    newline = (rows == model.model.image_newline[None]).all(dim=1).numpy()
    # instruction tokens: non-empty offsets overlapping the prompt's characters in the rendered text (one
    # <image> token there); the processor expands that token to S copies, which shifts later tokens by S-1.
    start, end = text.rindex(prompt), text.rindex(prompt) + len(prompt)
    enc = processor.tokenizer(text, return_offsets_mapping=True)
    image_id = model.config.image_token_id
    at = enc["input_ids"].index(image_id)
    expanded = enc["input_ids"][:at] + [image_id] * len(image_pos) + enc["input_ids"][at + 1:]
    assert expanded == ids.tolist(), "the processor's ids must be the template's with <image> expanded"
    instr = np.asarray([i + len(image_pos) - 1 for i, (a, b) in enumerate(enc["offset_mapping"])
                        if b > a and a < end and b > start and i > at], dtype=np.int64)
    return NativeRequest(ids, embeds, image_pos, newline, instr, inputs)


def layer0_relevance(eager_model, req: NativeRequest) -> np.ndarray:
    """Layer-0 attention from the instruction rows to the candidate rows, mean over heads and rows. f64 [n]."""
    with torch.no_grad():
        att = eager_model.model.language_model(inputs_embeds=req.embeds, output_attentions=True).attentions[0][0]
    cand = req.image_pos[~req.newline]
    return att[:, req.instr][:, :, cand].double().mean(dim=(0, 1)).numpy()


def _unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def coverage_literal(feats, relevance, budget, tau=0.3):
    v = _unit(feats)
    m = v @ v.T
    a = np.maximum(m - m.mean(axis=1, keepdims=True), 0.0)
    r = np.asarray(relevance, dtype=np.float64)
    span = r.max() - r.min()
    w = np.exp(tau * ((r - r.min()) / span if span > 0 else np.zeros_like(r)))
    n = len(v)
    c, chosen = np.zeros(n), []
    for _ in range(min(budget, n)):
        gain = np.array([np.sum(w * np.maximum(a[:, k] - c, 0.0)) for k in range(n)])
        gain[chosen] = -np.inf
        k = int(np.argmax(gain))
        chosen.append(k)
        c = np.maximum(c, a[:, k])
    return np.sort(np.asarray(chosen, dtype=np.int64))


def divprune_literal(feats, budget):
    v = _unit(feats)
    d = 1.0 - v @ v.T
    n = len(v)
    if budget >= n:
        return np.arange(n, dtype=np.int64)
    off = d + np.diag(np.full(n, np.inf))
    chosen = [int(np.argmax(off.min(axis=1)))]
    while len(chosen) < budget:
        near = d[:, chosen].min(axis=1)
        near[chosen] = -np.inf
        chosen.append(int(np.argmax(near)))
    return np.sort(np.asarray(chosen, dtype=np.int64))


def full_generate(model, req: NativeRequest, max_new_tokens: int) -> list[int]:
    """Unpruned HF generate on the processor's inputs: the new token ids."""
    with torch.no_grad():
        out = model.generate(**req.inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, req.ids.shape[0]:].tolist()


def pruned_generate(model, eager_model, req: NativeRequest, budget, method, newline_policy, max_new_tokens,
                    tau=0.3):
    """(new token ids, kept candidate indices, relevance or None) of the pruned request on the HF model."""
    cand = req.image_pos[~req.newline]
    feats = req.embeds[0, torch.from_numpy(cand)].numpy()
    relevance = None
    if method == "coverpruner":
        relevance = layer0_relevance(eager_model, req)
        keep = coverage_literal(feats, relevance, budget, tau)
    elif method == "divprune":
        keep = divprune_literal(feats, budget)
    else:
        raise ValueError(method)
    image_rows = set(cand[keep].tolist())
    if newline_policy == "keep":
        image_rows |= set(req.image_pos[req.newline].tolist())
    all_image = set(req.image_pos.tolist())
    rows = [i for i in range(req.ids.shape[0]) if i not in all_image or i in image_rows]
    pruned = req.embeds[:, torch.tensor(rows)]
    with torch.no_grad():  # generate from inputs_embeds: positions 0..L'-1, then L', L'+1, ... (compact)
        out = model.generate(inputs_embeds=pruned, attention_mask=torch.ones(pruned.shape[:2], dtype=torch.long),
                             max_new_tokens=max_new_tokens, do_sample=False)
    return out[0].tolist(), keep, relevance


def forced_first_token_generate(model, req: NativeRequest, first: int, max_new_tokens: int) -> list[int]:
    """HF prefill of the unpruned request, then `first` as the first answer token and greedy after it, each
    decode step a plain HF forward with input_ids and the cache (no pixel_values: the id is embedded as text)."""
    with torch.no_grad():
        out = model(**req.inputs, use_cache=True)
        tokens, cache = [first], out.past_key_values
        length = req.ids.shape[0]
        while len(tokens) < max_new_tokens:
            length += 1
            out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache,
                        attention_mask=torch.ones(1, length, dtype=torch.long), use_cache=True)
            cache = out.past_key_values
            tokens.append(int(out.logits[0, -1].argmax()))
    return tokens
