"""Gemma 3's independent reference answers on the HF PyTorch model (tests only; imports torch/transformers).

conversation(): the chat template and the processor (pan-and-scan or not) -> HF image features merged into the
embedded ids -> layer-0 attention of the whole model with transformers' own masks (sliding window, block overlay),
instruction rows of each image's message (offsets in the processor's expanded text) x that image's soft-token
columns, mean over heads and rows -> the literal float64 greedy / literal DivPrune of tests/literal_selection.py per
image (one budget over all crops of an image) -> pruned rows (text + kept soft tokens, native order, gathered here)
-> a greedy loop with compact positions whose prefill gives HF the pruned token_type_ids (its own block mask of the
kept rows) -> tokens. Nothing here uses the exported graphs, coverpruner.selection or the pipeline's encoder.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tests.families.gemma3 import hf_gemma3 as hf
from tests.literal_selection import coverage_reference, divprune_reference

_SENTINEL = "\u2063GEMMA{}\u2063"  # marks a text part while rendering; no template or text here contains it


def render(processor, messages: list[dict]) -> tuple[str, list[list[tuple[int, int]]]]:
    """The chat template's text and, per message, its text parts' character spans (the template trims them)."""
    marked, texts = [], []
    for i, msg in enumerate(messages):
        parts = []
        for part in msg["content"]:
            if part["type"] == "text":
                parts.append({"type": "text", "text": _SENTINEL.format(len(texts))})
                texts.append((i, part["text"].strip()))
            else:
                parts.append({"type": "image"})
        marked.append({"role": msg["role"], "content": parts})
    text = processor.apply_chat_template(marked, add_generation_prompt=True, tokenize=False)
    spans: list[list[tuple[int, int]]] = [[] for _ in messages]
    for k, (i, part) in enumerate(texts):
        at = text.index(_SENTINEL.format(k))
        text = text[:at] + part + text[at + len(_SENTINEL.format(k)):]
        spans[i].append((at, at + len(part)))
    return text, spans


@dataclass
class Answer:
    tokens: list[int]
    keep: list[np.ndarray]
    relevance: list[np.ndarray | None]
    instruction: list[np.ndarray]
    rows: np.ndarray


def conversation(model, processor, messages: list[dict], images: list, budget, method: str = "coverpruner",
                 steps: int = 8, pan: bool = False, tau: float = 0.3) -> Answer:
    """The reference answer: messages with {"type": "image"} parts (images: the PIL images in order); budget an
    int per image or "full"."""
    text, spans = render(processor, messages)
    inputs = hf.processor_inputs(processor, text, images, pan)
    req = hf.native(model, inputs)
    ids = inputs["input_ids"][0]
    image_id = model.config.image_token_id
    expanded, edits, crops = hf.expand(processor, text, images, pan) if images else (text, [], [])
    holders = [i for i, m in enumerate(messages) for p in m["content"] if p["type"] == "image"]
    instr = [hf.instruction_positions(processor, expanded, [hf.shift(s, edits) for s in spans[i]], ids, image_id)
             for i in holders]
    # each image's soft-token rows: its 1 + crops runs of image_seq_length rows, in order
    bounds = np.cumsum([0, *[(1 + c) * processor.image_seq_length for c in crops]])
    assert bounds[-1] == len(req.visual)
    per_image = [req.visual[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    att = hf.layer0_attention(model, inputs) if method == "coverpruner" and budget != "full" else None
    keep, rel, kept_rows = [], [], []
    for j, cols in enumerate(per_image):
        feats = req.features[np.searchsorted(req.visual, cols)].double().numpy()
        if budget == "full":
            k, r = np.arange(len(cols)), None
        elif method == "coverpruner":
            r = att[:, instr[j]][:, :, cols].double().mean(dim=(0, 1)).numpy() if instr[j].size else None
            k = coverage_reference(feats, r, budget, tau)
        elif method == "divprune":
            k, r = divprune_reference(feats, budget), None
        else:
            raise ValueError(f"no literal reference for method {method!r}")
        keep.append(np.asarray(k))
        rel.append(r)
        kept_rows.append(cols[np.asarray(k, dtype=np.int64)])
    text_rows = np.flatnonzero(ids.numpy() != image_id)
    rows = np.sort(np.concatenate([text_rows, *kept_rows])).astype(np.int64)
    tokens = hf.greedy(model, req.embeds[:, torch.from_numpy(rows)], ids[torch.from_numpy(rows)], steps,
                       hf.eos_ids(model))
    return Answer(tokens, keep, rel, instr, rows)


def one_image(model, processor, image, prompt: str, budget, method: str, steps: int, pan: bool = False) -> Answer:
    """The reference of a one-image request [image, prompt]."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    return conversation(model, processor, messages, [image], budget, method, steps, pan)


def hf_generate(model, processor, image, prompt: str, steps: int, pan: bool = False) -> list[int]:
    """transformers' own generate on the processor's apply_chat_template inputs: the new token ids."""
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": prompt}]}]
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt", processor_kwargs={"do_pan_and_scan": pan})
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=steps, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()
