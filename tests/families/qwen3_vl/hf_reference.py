"""Qwen3-VL reference answers built directly on the HF PyTorch model (tests only; torch/transformers).

Independent of the code under test: HF's processor lays out the prompt, HF's get_rope_index gives the positions,
HF's get_image_features gives the main features and the DeepStack levels, HF's layer-0 eager attention gives the
demand, tests/literal_selection.py's literal float64 selectors pick the rows, and generation is a plain greedy loop
over HF's Qwen3VLTextModel with explicit 3-D positions and HF's own DeepStack arguments (visual_pos_masks: the kept
visual rows of the pruned sequence; deepstack_visual_embeds: each level's rows gathered here with the kept
indices). Nothing here uses the exported graphs or the family adapter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from tests.families.qwen3_vl.hf_qwen3 import hf_inputs
from tests.literal_selection import coverage_reference as literal_coverage
from tests.literal_selection import divprune_reference as literal_divprune


@dataclass
class Native:
    """One request laid out by HF: processor outputs, inputs_embeds [1,L,d], positions [3,1,L], visual positions
    [n], instruction positions [T] (between <|vision_end|> and the user turn's <|im_end|>), main features [n,d] and
    the DeepStack levels (list of [n,d])."""

    inputs: dict
    embeds: torch.Tensor
    positions: torch.Tensor
    visual: np.ndarray
    instruction: np.ndarray
    features: torch.Tensor
    deepstack: list


def native_request(model, ckpt, image, prompt) -> Native:
    inputs = hf_inputs(ckpt, image, prompt)
    ids = inputs["input_ids"][0]
    cfg = model.config
    visual = torch.nonzero(ids == cfg.image_token_id).flatten()
    end = int(torch.nonzero(ids == cfg.vision_end_token_id)[0])
    im_end = int(torch.nonzero(ids == cfg.text_config.eos_token_id).flatten()[-1])
    with torch.no_grad():
        out = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
        feats = out.pooler_output[0]
        embeds = model.model.get_input_embeddings()(inputs["input_ids"]).clone()
        embeds[0, visual] = feats
        positions, _ = model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                                  image_grid_thw=inputs["image_grid_thw"])
    return Native(inputs, embeds, positions, visual.numpy(), np.arange(end + 1, im_end), feats,
                  [level[0] for level in out.deepstack_features])


def layer0_relevance(model, req: Native) -> np.ndarray:
    """Mean over heads and instruction rows of HF's layer-0 attention at the visual columns (eager)."""
    with torch.no_grad():
        att = model(**req.inputs, output_attentions=True).attentions[0][0]  # [H, L, L]
    return att[:, req.instruction][:, :, req.visual].mean(dim=(0, 1)).numpy()


def select(model, req: Native, method: str, budget, tau: float = 0.3) -> np.ndarray:
    n = req.visual.size
    if budget is None or budget == "full" or budget >= n:
        return np.arange(n)
    feats = req.features.float().numpy()
    if method == "coverpruner":
        return literal_coverage(feats, layer0_relevance(model, req), budget, tau)
    if method == "divprune":
        return literal_divprune(feats, budget)
    raise ValueError(method)


def greedy(model, embeds, positions, visual_mask, deepstack, steps: int, eos: set[int], mask=None,
           start: int | None = None) -> list[int]:
    """Greedy loop on HF's text model + lm_head: prefill embeds [1,S,d] at positions [3,1,S] with DeepStack rows
    (list of [k,d]) added at visual_mask [1,S] (k True entries) after layers 0, 1, ...; the t-th new token at
    start + t (default max(positions) + 1) in all three rows (no DeepStack there)."""
    lm, head = model.model.language_model, model.lm_head
    out, cache = [], DynamicCache(config=lm.config)
    start = int(positions.max()) + 1 if start is None else start
    mask = torch.ones(1, embeds.shape[1], dtype=torch.long) if mask is None else mask
    with torch.no_grad():
        hidden = lm(inputs_embeds=embeds, position_ids=positions, attention_mask=mask, cache=cache, use_cache=True,
                    visual_pos_masks=visual_mask, deepstack_visual_embeds=deepstack).last_hidden_state
        for t in range(steps):
            tok = int(head(hidden[0, -1]).argmax())
            out.append(tok)
            if tok in eos or t == steps - 1:
                break
            mask = torch.cat([mask, torch.ones(1, 1, dtype=mask.dtype)], 1)
            hidden = lm(inputs_embeds=model.model.get_input_embeddings()(torch.tensor([[tok]])),
                        position_ids=torch.full((3, 1, 1), start + t), attention_mask=mask, cache=cache,
                        use_cache=True).last_hidden_state
    return out


def pruned_generate(model, req: Native, keep: np.ndarray, steps: int, eos: set[int], zero_deepstack=False):
    """Text rows + kept visual rows in native order at their native positions; each DeepStack level gathered with
    the same kept indices (zeros with zero_deepstack)."""
    keep = np.sort(np.asarray(keep))
    length = req.embeds.shape[1]
    dropped = np.setdiff1d(req.visual, req.visual[keep])
    rows = np.setdiff1d(np.arange(length), dropped)
    visual_mask = torch.from_numpy(np.isin(rows, req.visual[keep]))[None]
    levels = [level[torch.from_numpy(keep)] for level in req.deepstack]
    if zero_deepstack:
        levels = [torch.zeros_like(level) for level in levels]
    rows = torch.from_numpy(rows)
    return greedy(model, req.embeds[:, rows], req.positions[:, :, rows], visual_mask, levels, steps, eos)


def masked_generate(model, req: Native, keep: np.ndarray, steps: int, eos: set[int]) -> list[int]:
    """The full native sequence with the dropped visual columns masked out (attention_mask 0), DeepStack at every
    visual row (a dropped row's sum never reaches a kept row: it is masked)."""
    mask = torch.ones(1, req.embeds.shape[1], dtype=torch.long)
    mask[0, np.setdiff1d(req.visual, req.visual[keep])] = 0
    visual_mask = torch.zeros(1, req.embeds.shape[1], dtype=torch.bool)
    visual_mask[0, req.visual] = True
    return greedy(model, req.embeds, req.positions, visual_mask, req.deepstack, steps, eos, mask)
