"""Helpers every checkpoint writer shares: creating weights in their dtype, re-drawing them, rounding sizes,
and wrapping a trained `tokenizers.Tokenizer` for save_pretrained."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def default_dtype(dtype):
    """Create parameters directly in `dtype` so a 7B-width model never exists in fp32 first."""
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def round_up(x: int, multiple: int) -> int:
    return (x + multiple - 1) // multiple * multiple


def fast_tokenizer(tokenizer):
    """PreTrainedTokenizerFast over a trained `tokenizers.Tokenizer`, with the LLaVA specials declared."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        model_max_length=4096, padding_side="left",
    )
    fast.add_special_tokens({"additional_special_tokens": ["<image>"]})
    return fast


def randomize(model, std: float) -> None:
    """Re-draw every weight: HF's init leaves norms at 1 and biases at 0; random values exercise them."""
    import torch

    for name, param in model.named_parameters():
        if name.endswith("norm.weight") or "layer_norm" in name or "layrnorm" in name:
            param.copy_(1.0 + std * torch.randn_like(param))
        else:
            param.normal_(0.0, std)
