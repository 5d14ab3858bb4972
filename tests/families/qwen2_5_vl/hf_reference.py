"""Qwen2.5-VL reference answers built directly on the HF PyTorch model (tests only; torch/transformers).

Independent of the code under test: HF's processor lays out the prompt, HF's get_rope_index gives the
positions, HF's layer-0 eager attention gives the demand, the selectors below are literal float64
transcriptions of the definitions (not coverpruner.selection), and generation is a plain greedy loop over
the HF model with explicit 3-D positions. Nothing here uses the exported graphs or the family adapter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tests.literal_selection import coverage_reference as literal_coverage  # literal float64 greedy, exact argmax
from tests.literal_selection import divprune_reference as literal_divprune
from tests.families.qwen2_5_vl.hf_qwen import hf_inputs


@dataclass
class Native:
    """One request laid out by HF: processor outputs, full inputs_embeds [1,L,d], 3-D positions [3,1,L],
    visual positions [n], instruction positions [T] (the tokens between <|vision_end|> and <|im_end|>)."""

    inputs: dict
    embeds: torch.Tensor
    positions: torch.Tensor
    visual: np.ndarray
    instruction: np.ndarray
    features: torch.Tensor


def native_request(model, ckpt, image, prompt) -> Native:
    inputs = hf_inputs(ckpt, image, prompt)
    ids = inputs["input_ids"][0]
    cfg = model.config
    visual = torch.nonzero(ids == cfg.image_token_id).flatten()
    end = int(torch.nonzero(ids == cfg.vision_end_token_id)[0])
    im_end = int(torch.nonzero(ids == cfg.text_config.eos_token_id).flatten()[-1])  # the user turn's <|im_end|>
    with torch.no_grad():
        feats = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output[0]
        embeds = model.model.get_input_embeddings()(inputs["input_ids"]).clone()
        embeds[0, visual] = feats
        positions, _ = model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                                  image_grid_thw=inputs["image_grid_thw"])
    return Native(inputs, embeds, positions, visual.numpy(), np.arange(end + 1, im_end), feats)


def layer0_relevance(model, req: Native) -> np.ndarray:
    """Mean over heads and instruction rows of HF's layer-0 attention at the visual columns (eager)."""
    with torch.no_grad():
        att = model(**req.inputs, output_attentions=True).attentions[0][0]  # [H, L, L]
    return att[:, req.instruction][:, :, req.visual].mean(dim=(0, 1)).numpy()


def select(model, req: Native, method: str, budget, tau: float = 0.3) -> np.ndarray:
    n = req.visual.size
    if budget is None or budget >= n:
        return np.arange(n)
    feats = req.features.float().numpy()
    if method == "coverpruner":
        return literal_coverage(feats, layer0_relevance(model, req), budget, tau)
    if method == "divprune":
        return literal_divprune(feats, budget)
    raise ValueError(method)


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
