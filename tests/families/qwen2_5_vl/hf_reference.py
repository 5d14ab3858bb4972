"""Qwen2.5-VL reference answers built directly on the HF PyTorch model (tests only; torch/transformers).

Independent of the code under test: HF's processor lays out the prompt, HF's get_rope_index gives the
positions, HF's layer-0 eager attention gives the demand, the selectors are literal float64 transcriptions of
the definitions (tests/literal_selection.py, not coverpruner.selection; these parts are shared with Qwen3-VL's
reference in tests/families/qwen_common.py), and generation is a plain greedy loop over the HF model with explicit
3-D positions. Nothing here uses the exported graphs or the family adapter.
"""

from __future__ import annotations

import numpy as np
import torch

from tests.families.qwen2_5_vl.hf_qwen import hf_inputs
# the shared HF reference parts (tests/families/qwen_common.py): HF's layout, demand and literal selectors
from tests.families.qwen_common import Native, layer0_relevance, select
from tests.families.qwen_common import native_request as _native_request
from tests.literal_selection import coverage_reference as literal_coverage  # literal float64 greedy, exact argmax
from tests.literal_selection import divprune_reference as literal_divprune

__all__ = ["Native", "greedy", "layer0_relevance", "literal_coverage", "literal_divprune", "masked_generate",
           "native_request", "pruned_generate", "select"]


def native_request(model, ckpt, image, prompt) -> Native:
    """HF's processor, image features and get_rope_index for one image request."""
    return _native_request(model, hf_inputs(ckpt, image, prompt))


def greedy(model, embeds, positions, mask, steps: int, eos: set[int]) -> list[int]:
    """Greedy loop on the HF model: prefill embeds [1,S,d] at positions [3,1,S] (attention_mask [1,S]), then
    the t-th new token at max(positions) + 1 + t in all three rows."""
    out, cache = [], None
    start = int(positions.max()) + 1
    with torch.no_grad():
        res = model(inputs_embeds=embeds, position_ids=positions, attention_mask=mask, use_cache=True)
        for t in range(steps):
            tok = int(res.logits[0, -1].argmax())
            out.append(tok)
            if tok in eos or t == steps - 1:
                break
            cache = res.past_key_values
            mask = torch.cat([mask, torch.ones(1, 1, dtype=mask.dtype)], 1)
            res = model(inputs_embeds=model.model.get_input_embeddings()(torch.tensor([[tok]])),
                        position_ids=torch.full((3, 1, 1), start + t), attention_mask=mask, past_key_values=cache,
                        use_cache=True)
    return out


def pruned_generate(model, req: Native, keep: np.ndarray, steps: int, eos: set[int]) -> list[int]:
    """Text rows + kept visual rows in native order, each at its native 3-D position."""
    length = req.embeds.shape[1]
    dropped = np.setdiff1d(req.visual, req.visual[keep])
    rows = torch.from_numpy(np.setdiff1d(np.arange(length), dropped))
    return greedy(model, req.embeds[:, rows], req.positions[:, :, rows], torch.ones(1, rows.numel(), dtype=torch.long),
                  steps, eos)


def masked_generate(model, req: Native, keep: np.ndarray, steps: int, eos: set[int]) -> list[int]:
    """The full native sequence with the dropped visual columns masked out (attention_mask 0)."""
    mask = torch.ones(1, req.embeds.shape[1], dtype=torch.long)
    mask[0, np.setdiff1d(req.visual, req.visual[keep])] = 0
    return greedy(model, req.embeds, req.positions, mask, steps, eos)
