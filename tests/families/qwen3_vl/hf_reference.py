"""Qwen3-VL reference answers built directly on the HF PyTorch model (tests only; torch/transformers).

Independent of the code under test: HF's processor lays out the prompt, HF's get_rope_index gives the positions,
HF's get_image_features gives the main features and the DeepStack levels, HF's layer-0 eager attention gives the
demand, tests/literal_selection.py's literal float64 selectors pick the rows, and generation is a plain greedy loop
over HF's Qwen3VLTextModel with explicit 3-D positions and HF's own DeepStack arguments (visual_pos_masks: the kept
visual rows of the pruned sequence; deepstack_visual_embeds: each level's rows gathered here with the kept
indices). Nothing here uses the exported graphs or the family adapter.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache

from tests.families.qwen3_vl.hf_qwen3 import hf_inputs
# the shared HF reference parts (tests/families/qwen_common.py): HF's layout, demand and literal selectors
from tests.families.qwen_common import Native, layer0_relevance, select
from tests.families.qwen_common import native_request as _native_request
from tests.literal_selection import coverage_reference as literal_coverage  # literal float64 greedy, exact argmax
from tests.literal_selection import divprune_reference as literal_divprune

__all__ = ["Native", "greedy", "layer0_relevance", "literal_coverage", "literal_divprune", "masked_generate",
           "native_request", "pruned_generate", "select"]


def native_request(model, ckpt, image, prompt) -> Native:
    """HF's processor, main features, DeepStack levels and get_rope_index for one image request."""
    return _native_request(model, hf_inputs(ckpt, image, prompt), deepstack=True)


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
