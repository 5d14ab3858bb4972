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
    """Attention demand: the attention instruction tokens place on each visual token, at the family's probe layer
    (layer 0; contract v5: the first full-attention layer f of a hybrid decoder, fed the hidden states that layers
    0..f-1 give the whole native sequence, ProbeParts.prefix).

    Inputs: inputs_embeds float [1,L,d] (native sequence, image rows = image_features), position_ids int64
    [1,L] (rank 1) or [R,1,L] (M-RoPE), visual_positions int64 [n], instruction_positions int64 [T] (sequence
    indices). The family's ProbeParts.rotary(x, position_ids) returns cos/sin [1,L,rd] whatever the rank
    (an M-RoPE family mixes its sections there; rd < hd for a partial rotary), so everything below is rank-free.
    Output: relevance float32 [n] = mean over heads and instruction rows of softmax_j(q_t k_j * scaling),
    causal (j <= t) over the whole sequence (and, for a sliding probe layer, j > t - window: ProbeParts.window),
    restricted to the visual columns. (Instruction rows are text: an image block overlay never unmasks their keys.)

    Only the T instruction rows get queries (the softmax of a row needs every key of that row, not
    other rows), so cost is O(T*L) instead of a full O(L^2) layer (plus, at layer f > 0, layers 0..f-1 over the
    sequence); no value/output projection, no MLP, and an output gate (ProbeParts.q_gate) is dropped: the scores
    do not read it. Scores and softmax are float32 even for fp16 graphs (HF eager upcasts the softmax the same way).
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
        self.q_gate = bool(parts.q_gate)
        self.layer, self.kind = int(parts.layer), parts.kind  # recorded as graphs.probe.layer / kind
        self.prefix = parts.prefix  # layers 0..f-1 (contract v5), None at layer 0
        self.project = parts.project  # a proxy's row-mixing projections (contract v5), else q_proj / k_proj

    def forward(self, inputs_embeds, position_ids, visual_positions, instruction_positions):
        if self.prefix is not None:
            inputs_embeds = self.prefix(inputs_embeds, position_ids)  # the hidden states entering layer f
        hidden = self.norm(inputs_embeds)  # [1,L,d]
        seq = hidden.shape[1]
        n_q = instruction_positions.shape[0]
        if self.project is not None:  # projections of every row (a proxy's convolution mixes neighbours)
            q_all, k_all = self.project(hidden)
            q, k_rows = q_all.index_select(1, instruction_positions).view(1, n_q, self.h, -1), k_all
        else:
            q = self.q_proj(hidden.index_select(1, instruction_positions)).view(1, n_q, self.h, -1)  # [1,T,H,*]
            k_rows = self.k_proj(hidden)
        if self.q_gate:  # per head: hd query values, then hd gate values (HF chunks them the same way)
            q = q[..., :self.hd]
        q = self.q_norm(q).transpose(1, 2)  # [1,H,T,hd]
        k = self.k_norm(k_rows.view(1, seq, self.hkv, self.hd)).transpose(1, 2)  # [1,Hkv,L,hd]
        if self.rotary is not None:
            cos, sin = self.rotary(hidden, position_ids)  # [1,L,rd], in hidden.dtype like HF
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
#: transformers' linear-attention cache layer (LinearAttentionLayer) holds a decoder state of each name in this slot
HF_STATE_SLOTS = {"conv": "conv_states", "recurrent": "recurrent_states"}


class DecoderGraph(nn.Module):
    """One graph for prefill (P=0) and decode (S=1) of the unchanged HF decoder stack.

    Inputs: inputs_embeds float [B,S,d], attention_mask int64 [B,P+S], position_ids int64 [B,S] or [R,B,S],
    past key/value float [B,Hkv,P,hd] per KV layer (flat: k0, v0, k1, v1, ...), then the decoder states that are
    not KV (contract v5) [B, *shape] per state and layer, then the decoder extras (contract v4) float [B,S,d] each,
    zero where a row has none, then (contract v5, attention.blocks) attention_blocks int64 [B,S]: each new row's
    block (-1: text; rows of one block see each other both ways).
    Outputs: logits float [B,1,V] of the last position, present key/value [B,Hkv,P+S,hd] per KV layer (sliding
    layers too: the window is in the mask), then each state after the call.
    The flat past tensors are wrapped in a transformers DynamicCache so HF's own layers, causal mask
    and cache update run unchanged; a state named in HF_STATE_SLOTS goes into the slot of transformers' linear-
    attention cache layer (its conv state cut to the K-1 inputs the convolution reads: the cache layer is told that
    width). A prefill passes zero states, which is what HF starts from. extras: contract.DecoderExtra items; extra k
    is added to the output of ``language_model.layers[after_layer]`` by a forward hook (HF's layers stay unchanged,
    as DeepStack adds it). spec: the family's contract.DecoderSpec (KV layers, states, attention); beyond causal,
    the masks are transformers' own (attention_masks).
    """

    def __init__(self, language_model, lm_head, extras=(), spec=None):
        super().__init__()
        self.lm, self.head = language_model, lm_head
        self.num_layers = language_model.config.num_hidden_layers
        self.kv_layers = spec.kv_layer_list(self.num_layers) if spec is not None else tuple(range(self.num_layers))
        self.states = tuple(spec.states) if spec is not None else ()
        for state in self.states:
            if state.name not in HF_STATE_SLOTS:
                raise ValueError(f"decoder state {state.name!r} has no slot in transformers' linear-attention cache "
                                 f"(known: {sorted(HF_STATE_SLOTS)}); the standard form cannot carry it")
        self.extras = tuple(extras)
        self.attention = spec.attention if spec is not None else None
        if self.states and not (self.attention is None or self.attention.plain):
            raise ValueError("a decoder with states and windowed / block attention is not exportable in the standard "
                             "form (no family declares both)")
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

    def forward(self, inputs_embeds, attention_mask, position_ids, past, *more):
        """``more``: the states tuple when the decoder has states, then the extras tuple (the extras' rows, then
        attention_blocks with attention.blocks) when it has either (never an empty tuple: torch.export reads one as
        a list against its dynamic shapes)."""
        from transformers import DynamicCache

        plain = self.attention is None or self.attention.plain
        blocks_in = self.attention is not None and self.attention.blocks
        states = more[0] if self.states else ()
        extras = tuple(more[-1]) if (self.extras or blocks_in) else ()
        blocks = None
        if blocks_in:
            *extras, blocks = extras
        kv = dict(zip(self.kv_layers, zip(past[0::2], past[1::2])))
        # a windowed stack keeps every layer's whole past (the flat present is P+S rows): no sliding cache layers
        cache = DynamicCache(ddp_cache_data=[kv.get(i, (None, None)) for i in range(self.num_layers)],
                             config=self.lm.config if plain else None)
        slots = self._load_states(cache, states)
        # With state layers HF gets no mask: it builds the causal one from the cache's length itself and gives the
        # state layers none, as it does for a mask of ones outside tracing (traced, it would slice the mask and
        # guard on its length, tying the graph to one relation of P, S and the mask); the input stays (all ones).
        if self.states:
            mask = None
        elif plain:
            mask = attention_mask
        else:
            mask = attention_masks(self.lm.config, self.attention, inputs_embeds, attention_mask, cache,
                                   position_ids, blocks)
        self._feeding = tuple(extras)
        try:
            out = self.lm(inputs_embeds=inputs_embeds, attention_mask=mask, position_ids=position_ids,
                          past_key_values=cache, use_cache=True)
        finally:
            self._feeding = ()
        logits = self.head(out.last_hidden_state[:, -1:, :])
        present = []
        for i in self.kv_layers:
            present += [cache.layers[i].keys, cache.layers[i].values]
        present += [getattr(cache.layers[i], slot)[0] for i, slot in slots]
        return (logits, *present)

    def _load_states(self, cache, states) -> list[tuple[int, str]]:
        """Put the flat past states into transformers' linear-attention cache layers -> (layer, slot) per state, in
        the order of ``states``. Each gets a copy (HF updates its slots in place, never a graph input)."""
        slots, it = [], iter(states)
        for state in self.states:
            slot = HF_STATE_SLOTS[state.name]
            for i in state.layers:
                layer, value = cache.layers[i], next(it).clone()
                getattr(layer, slot)[0] = value
                if slot == "conv_states":
                    layer.conv_kernel_size[0] = value.shape[-1]  # the K-1 inputs the convolution reads
                    layer.is_conv_states_initialized[0] = True
                else:
                    layer.is_recurrent_states_initialized[0] = True
                layer.has_previous_state[0] = True  # zeros at a prefill: what HF starts from
                slots.append((i, slot))
        return slots
