"""torch modules that wrap HF parts into the graph contracts of docs/engine-dir.md.

The text graphs' wrappers (the vision wrappers are the families': families/hf_graphs.py and each family
package's own). Each wrapper holds references to the family adapter's HF submodules (no copies of weights) and does
only the glue: tensor names, shapes and the flat KV-cache interface. Import requires torch.
"""

from __future__ import annotations

import torch
from torch import nn


class EmbedGraph(nn.Module):
    """input_ids int64 [B,S] -> inputs_embeds float [B,S,d] (the decoder's token embedding table)."""

    def __init__(self, embed: nn.Embedding):
        super().__init__()
        self.embed = embed

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class ProbeGraph(nn.Module):
    """Layer-0 attention demand: the attention instruction tokens place on each visual token.

    Inputs: inputs_embeds float [1,L,d] (native sequence, image rows = image_features), position_ids int64
    [1,L] (rank 1) or [R,1,L] (M-RoPE), visual_positions int64 [n], instruction_positions int64 [T] (sequence
    indices). The family's ProbeParts.rotary(x, position_ids) returns cos/sin [1,L,hd] whatever the rank
    (an M-RoPE family mixes its sections there), so everything below is rank-free.
    Output: relevance float32 [n] = mean over heads and instruction rows of softmax_j(q_t k_j * scaling),
    causal (j <= t) over the whole sequence (and, for a sliding layer 0, j > t - window: ProbeParts.window),
    restricted to the visual columns. (Instruction rows are text: an image block overlay never unmasks their keys.)

    Only the T instruction rows get queries (the softmax of a row needs every key of that row, not
    other rows), so cost is O(T*L) instead of a full O(L^2) layer; no value/output projection, no MLP.
    Scores and softmax are float32 even for fp16 graphs (HF eager upcasts the softmax the same way).
    """

    def __init__(self, parts):
        super().__init__()
        self.norm, self.q_proj, self.k_proj, self.rotary = parts.norm, parts.q_proj, parts.k_proj, parts.rotary
        self.apply_rope = parts.apply_rope
        # the q/k-norm attention variant: per-head RMSNorm over hd before rotary (identity for plain attention)
        self.q_norm = parts.q_norm if parts.q_norm is not None else nn.Identity()
        self.k_norm = parts.k_norm if parts.k_norm is not None else nn.Identity()
        self.h, self.hkv, self.hd, self.scaling = parts.num_heads, parts.num_kv_heads, parts.head_dim, parts.scaling
        self.window = parts.window

    def forward(self, inputs_embeds, position_ids, visual_positions, instruction_positions):
        hidden = self.norm(inputs_embeds)  # [1,L,d]
        seq = hidden.shape[1]
        n_q = instruction_positions.shape[0]
        cos, sin = self.rotary(hidden, position_ids)  # [1,L,hd], in hidden.dtype like HF
        q_in = hidden.index_select(1, instruction_positions)  # [1,T,d]
        q = self.q_norm(self.q_proj(q_in).view(1, n_q, self.h, self.hd)).transpose(1, 2)  # [1,H,T,hd]
        k = self.k_norm(self.k_proj(hidden).view(1, seq, self.hkv, self.hd)).transpose(1, 2)  # [1,Hkv,L,hd]
        cos_q, sin_q = cos.index_select(1, instruction_positions), sin.index_select(1, instruction_positions)
        q, _ = self.apply_rope(q, q, cos_q, sin_q)
        k, _ = self.apply_rope(k, k, cos, sin)
        # GQA: query head h reads kv head h // (H/Hkv), as HF's repeat_kv.
        k = k[:, :, None].expand(1, self.hkv, self.h // self.hkv, seq, self.hd).reshape(1, self.h, seq, self.hd)
        scores = torch.matmul(q.float(), k.float().transpose(2, 3)) * self.scaling  # [1,H,T,L] f32
        keys = torch.arange(seq, device=scores.device)
        future = keys[None, :] > instruction_positions[:, None]  # [T,L] causal by sequence index
        if self.window is not None:  # a sliding layer 0 sees the keys less than `window` rows back
            future = future | (keys[None, :] <= instruction_positions[:, None] - self.window)
        scores = scores.masked_fill(future, torch.finfo(torch.float32).min)
        probs = torch.softmax(scores, dim=-1)
        visual = probs.index_select(3, visual_positions)  # [1,H,T,n]
        return visual.mean(dim=(0, 1, 2))  # [n] f32


def attention_masks(config, attention, inputs_embeds, attention_mask, cache, position_ids, blocks):
    """The masks of a decoder with contract-v5 attention, built by transformers' own mask functions (as Gemma 3's
    create_masks_for_vision_model composes them): full layers OR(causal, same block), sliding layers AND(window,
    OR(causal, same block)), padding from attention_mask [B,P+S]. blocks int64 [B,S]: the new rows' block ids (-1:
    text; the cached rows are never in a block of this call's, so they count as -1). -> {layer type: 4-D mask} for
    a stack that reads its masks by config.layer_types, else the one 4-D mask (every layer alike)."""
    from transformers.masking_utils import blockwise_overlay, create_causal_mask, sliding_window_overlay

    kw = {"config": config, "inputs_embeds": inputs_embeds, "attention_mask": attention_mask, "cache": cache,
          "position_ids": position_ids}
    overlay = None
    if attention.blocks:  # indexed by absolute key / query position: the cached rows (-1) first
        # the past length from the cache (the past tensors' rows), not attention_mask's length minus S: TensorRT's
        # profile shapes need not be consistent at "opt", where that difference is negative
        ids = nn.functional.pad(blocks, (cache.get_seq_length(), 0), value=-1)
        overlay = blockwise_overlay(ids)

    def mask(window):
        return create_causal_mask(**kw, or_mask_function=overlay,
                                  and_mask_function=None if window is None else sliding_window_overlay(window))

    types = getattr(config, "layer_types", None)
    windows = attention.windows or (None,) * config.num_hidden_layers
    if not types:
        if len(set(windows)) > 1:
            raise ValueError("a decoder with per-layer windows needs config.layer_types to route its masks")
        return mask(windows[0])
    return {t: mask(w) for t, w in dict(zip(types, windows)).items()}


class DecoderGraph(nn.Module):
    """One graph for prefill (P=0) and decode (S=1) of the unchanged HF decoder stack.

    Inputs: inputs_embeds float [B,S,d], attention_mask int64 [B,P+S], position_ids int64 [B,S] or [R,B,S],
    past key/value float [B,Hkv,P,hd] per layer (flat: k0, v0, k1, v1, ...), then the decoder extras
    (contract v4) float [B,S,d] each, zero where a row has none, then (contract v5, attention.blocks) attention_blocks
    int64 [B,S]: each new row's block (-1: text; rows of one block see each other both ways).
    Outputs: logits float [B,1,V] of the last position, present key/value [B,Hkv,P+S,hd] per layer (every layer,
    sliding ones too: the window is in the mask).
    The flat past tensors are wrapped in a transformers DynamicCache so HF's own layers, causal mask
    and cache update run unchanged. extras: contract.DecoderExtra items; extra k is added to the output of
    ``language_model.layers[after_layer]`` by a forward hook (HF's layers stay unchanged, as DeepStack adds it).
    attention: contract.AttentionSpec; beyond causal, the masks are transformers' own (attention_masks).
    """

    def __init__(self, language_model, lm_head, extras=(), attention=None):
        super().__init__()
        self.lm, self.head = language_model, lm_head
        self.num_layers = language_model.config.num_hidden_layers
        self.extras = tuple(extras)
        self.attention = attention
        self._feeding: tuple = ()
        for k, extra in enumerate(self.extras):
            if not 0 <= extra.after_layer < self.num_layers:
                raise ValueError(f"decoder extra {extra.name!r} enters after layer {extra.after_layer}; the decoder "
                                 f"has {self.num_layers} layers")
            language_model.layers[extra.after_layer].register_forward_hook(self._adder(k))

    def _adder(self, k: int):
        def hook(module, args, output):
            if not self._feeding:  # the HF stack run outside this graph (e.g. the probe's reference)
                return output
            if isinstance(output, tuple):  # transformers versions whose layers return (hidden, ...)
                return (output[0] + self._feeding[k].to(output[0].dtype), *output[1:])
            return output + self._feeding[k].to(output.dtype)
        return hook

    def forward(self, inputs_embeds, attention_mask, position_ids, past, extras=()):
        """extras: the decoder extras' rows, then (attention.blocks) attention_blocks."""
        from transformers import DynamicCache

        plain = self.attention is None or self.attention.plain
        blocks = None
        if self.attention is not None and self.attention.blocks:
            *extras, blocks = extras
        # a windowed stack keeps every layer's whole past (the flat present is P+S rows): no sliding cache layers
        cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(self.num_layers)],
                             config=self.lm.config if plain else None)
        mask = attention_mask if plain else attention_masks(self.lm.config, self.attention, inputs_embeds,
                                                            attention_mask, cache, position_ids, blocks)
        self._feeding = tuple(extras)
        try:
            out = self.lm(inputs_embeds=inputs_embeds, attention_mask=mask, position_ids=position_ids,
                          past_key_values=cache, use_cache=True)
        finally:
            self._feeding = ()
        logits = self.head(out.last_hidden_state[:, -1:, :])
        present = []
        for layer in cache.layers:
            present += [layer.keys, layer.values]
        return (logits, *present)
