"""Qwen3.5 reference answers built directly on the HF PyTorch model (tests only; torch/transformers).

Independent of the code under test: HF's processor lays out the prompt (transformers loads Qwen3.5 with
Qwen3VLProcessor: tests/families/qwen3_vl/hf_qwen3.py's, around this checkpoint's tokenizer, image processor and
chat template), HF's get_rope_index gives the positions, HF's get_image_features the features, HF's eager attention
gives the demand (``output_attentions`` records the full-attention layers only, so attentions[0] is the FIRST
full-attention layer's softmax over the whole native sequence, after HF's own Gated DeltaNet layers before it:
exactly what the probe reads), tests/literal_selection.py's literal float64 selectors pick the rows, and generation
is a plain greedy loop over HF's Qwen3_5TextModel with explicit 3-D positions and HF's own hybrid cache (KV for the
full layers, conv and recurrent states for the linear ones). Nothing here uses the exported graphs or the adapter.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from transformers import DynamicCache

from tests.families.qwen3_vl.hf_qwen3 import hf_inputs, hf_processor  # noqa: F401 (Qwen3.5's processor class)
from tests.families.qwen_common import Native, layer0_relevance, select
from tests.families.qwen_common import native_request as _native_request
from tests.literal_selection import coverage_reference as literal_coverage  # literal float64 greedy, exact argmax
from tests.literal_selection import divprune_reference as literal_divprune

__all__ = ["Native", "greedy", "hf_model", "layer0_relevance", "literal_coverage", "literal_divprune",
           "native_request", "pruned_generate", "select"]


@lru_cache(maxsize=2)
def hf_model(ckpt: str):
    from transformers import Qwen3_5ForConditionalGeneration

    model = Qwen3_5ForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def native_request(model, ckpt, image, prompt) -> Native:
    """HF's processor, features and get_rope_index for one image request (no DeepStack in Qwen3.5)."""
    return _native_request(model, hf_inputs(ckpt, image, prompt))


def greedy(model, embeds, positions, steps: int, eos: set[int], start: int | None = None) -> list[int]:
    """Greedy loop on HF's text model + lm_head: prefill embeds [1,S,d] at positions [3,1,S] (HF's hybrid cache),
    then the t-th new token at start + t (default max(positions) + 1) in all three rows."""
    lm, head = model.model.language_model, model.lm_head
    out, cache = [], DynamicCache(config=lm.config)
    start = int(positions.max()) + 1 if start is None else start
    with torch.no_grad():
        hidden = lm(inputs_embeds=embeds, position_ids=positions, cache=cache, use_cache=True).last_hidden_state
        for t in range(steps):
            tok = int(head(hidden[0, -1]).argmax())
            out.append(tok)
            if tok in eos or t == steps - 1:
                break
            hidden = lm(inputs_embeds=model.model.get_input_embeddings()(torch.tensor([[tok]])),
                        position_ids=torch.full((3, 1, 1), start + t), cache=cache, use_cache=True).last_hidden_state
    return out


def pruned_rows(req: Native, keep: np.ndarray) -> np.ndarray:
    """int64 [L']: text rows + the kept visual rows, in native order."""
    dropped = np.setdiff1d(req.visual, req.visual[np.sort(np.asarray(keep))])
    return np.setdiff1d(np.arange(req.embeds.shape[1]), dropped)


def pruned_generate(model, req: Native, keep: np.ndarray, steps: int, eos: set[int]) -> list[int]:
    """Text rows + kept visual rows in native order at their native positions, decode at max(native) + 1 + t."""
    rows = torch.from_numpy(pruned_rows(req, keep))
    return greedy(model, req.embeds[:, rows], req.positions[:, :, rows], steps, eos, start=int(req.positions.max()) + 1)
