"""Hybrid decoders of Gated DeltaNet (linear attention) and gated full-attention layers, as transformers writes them
(Qwen3.5's text model; Qwen3-Next's has the same layers): what a family on such a decoder hands to export (torch is
imported inside the functions only; importing this module does not import it).

* ``decoder_spec``: contract v5's declaration. The full-attention layers keep a KV cache; each Gated DeltaNet layer
  carries a conv state (its last K-1 projected q/k/v inputs, [C, K-1] in the model dtype, C = 2*Hk*dk + Hv*dv) and
  a recurrent state ([Hv, dk, dv] float32: transformers keeps it in float32 whatever the model dtype).
* ``probe_parts``: the probe reads the FIRST full-attention layer f (a Gated DeltaNet layer has no attention matrix):
  the hidden states entering f come from layers 0..f-1 run on the full native sequence (``ProbeParts.prefix``),
  then f's own input norm, q projection (its output gate dropped: the scores do not depend on it), k projection,
  per-head q/k RMSNorm and (partial, interleaved M-RoPE) rotary, as HF's attention computes them.
* ``decoder_weights``: the layers as arrays (contract.GatedDeltaWeights for the linear ones); transformers' zero-
  centred RMSNorm scales (1 + w) are written as their effective scale.
* ``make_exportable``: HF's chunked gated delta rule loops over the chunks in Python (``for i in range(n)``), which
  torch.export cannot trace with a dynamic sequence length; each Gated DeltaNet instance of the loaded model is
  given ``chunk_gated_delta_rule`` below instead, the same arithmetic with the chunk loop as a torch scan (ONNX Scan,
  which ONNX Runtime and TensorRT's parser take) and the per-chunk triangular solve by recursive block inversion
  (6 levels of batched matmuls for 64 rows, where HF's export branch unrolls 63 row steps).
"""

from __future__ import annotations

import inspect

from coverpruner.families.contract import (DecoderExtra, DecoderLayerWeights, DecoderSpec, DecoderState,
                                           DecoderWeights, GatedDeltaWeights, ProbeParts)

FULL, LINEAR = "full_attention", "linear_attention"
#: tokens per chunk of the chunked rule (HF's and flash-linear-attention's default)
CHUNK = 64


def layer_types(text_config) -> list[str]:
    """Each decoder layer's type ("linear_attention" | "full_attention"), the text config's layer_types."""
    return list(text_config.layer_types[:text_config.num_hidden_layers])


def probe_layer(text_config) -> int:
    """The first full-attention layer (the probe's); ValueError (one line) for a decoder without one."""
    types = layer_types(text_config)
    if FULL not in types:
        raise ValueError(f"the decoder has no full-attention layer ({types}); the probe needs one")
    return types.index(FULL)


def conv_channels(text_config) -> int:
    """C = 2*Hk*dk + Hv*dv: the channels of a Gated DeltaNet layer's convolution (q, k, v)."""
    t = text_config
    return 2 * t.linear_num_key_heads * t.linear_key_head_dim + t.linear_num_value_heads * t.linear_value_head_dim


def decoder_spec(text_config, extras: tuple[DecoderExtra, ...] = ()) -> DecoderSpec:
    """KV at the full-attention layers; conv [C, K-1] (model dtype) and recurrent [Hv, dk, dv] (float32) states at
    the Gated DeltaNet layers."""
    t = text_config
    types = layer_types(t)
    full = tuple(i for i, kind in enumerate(types) if kind == FULL)
    linear = tuple(i for i, kind in enumerate(types) if kind == LINEAR)
    states = ()
    if linear:
        states = (DecoderState("conv", linear, (conv_channels(t), t.linear_conv_kernel_dim - 1), "model"),
                  DecoderState("recurrent", linear,
                               (t.linear_num_value_heads, t.linear_key_head_dim, t.linear_value_head_dim), "float32"))
    return DecoderSpec(extras, kv_layers=full, states=states)


def rotary_dim(text_config) -> int:
    """The dims a partial rotary turns: head_dim x partial_rotary_factor (as transformers' rope init)."""
    t = text_config
    factor = (t.rope_parameters or {}).get("partial_rotary_factor", 1.0)
    return int(t.head_dim * factor)


def _scale(norm):
    """float32 effective scale of one of transformers' zero-centred RMSNorms (output = normed x * (1 + w))."""
    return 1.0 + norm.weight.detach().float().numpy()


def _arr(t):
    return None if t is None else t.detach().float().numpy().copy()


def decoder_weights(lm, lm_head, mrope_interleaved: bool = True) -> DecoderWeights:
    """contract.DecoderWeights of a hybrid text model ``lm`` (layers with ``linear_attn`` or ``self_attn``) and its
    lm_head; ValueError (one line) for a rope the ORT form's host rows do not compute."""
    cfg = lm.config
    rope = dict(cfg.rope_parameters or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type {rope.get('rope_type')!r} has no ORT-form rotary rows; export with "
                         "--decoder-form standard")
    section = rope.get("mrope_section")
    layers = []
    attention = None
    for layer, kind in zip(lm.layers, layer_types(cfg)):
        m = layer.mlp
        common = dict(input_norm=_scale(layer.input_layernorm), post_norm=_scale(layer.post_attention_layernorm),
                      gate=_arr(m.gate_proj.weight), up=_arr(m.up_proj.weight), down=_arr(m.down_proj.weight))
        if kind == LINEAR:
            a = layer.linear_attn
            linear = GatedDeltaWeights(
                qkv=_arr(a.in_proj_qkv.weight), conv=_arr(a.conv1d.weight)[:, 0, :], z=_arr(a.in_proj_z.weight),
                b=_arr(a.in_proj_b.weight), a=_arr(a.in_proj_a.weight), a_log=_arr(a.A_log),
                dt_bias=_arr(a.dt_bias), norm=_arr(a.norm.weight), out=_arr(a.out_proj.weight),
                num_k_heads=a.num_k_heads, num_v_heads=a.num_v_heads, head_k_dim=a.head_k_dim,
                head_v_dim=a.head_v_dim)
            layers.append(DecoderLayerWeights(q=None, k=None, v=None, q_bias=None, k_bias=None, v_bias=None, o=None,
                                              linear=linear, **common))
            continue
        attention = a = layer.self_attn
        layers.append(DecoderLayerWeights(
            q=_arr(a.q_proj.weight), k=_arr(a.k_proj.weight), v=_arr(a.v_proj.weight), q_bias=_arr(a.q_proj.bias),
            k_bias=_arr(a.k_proj.bias), v_bias=_arr(a.v_proj.bias), o=_arr(a.o_proj.weight), q_norm=_scale(a.q_norm),
            k_norm=_scale(a.k_norm), q_gate=True, **common))
    if attention is None:
        raise ValueError("the decoder has no full-attention layer")
    rotary = {"theta": float(rope.get("rope_theta", 10000.0)), "mrope_section": list(section) if section else None,
              "mrope_interleaved": bool(section) and mrope_interleaved, "dim": rotary_dim(cfg)}
    return DecoderWeights(layers, _scale(lm.norm), _arr(lm_head.weight), float(cfg.rms_norm_eps),
                          cfg.num_attention_heads, cfg.num_key_value_heads, attention.head_dim, rotary)


def probe_parts(lm, apply_rope) -> ProbeParts:
    """The probe's parts: the first full-attention layer f's norm, projections, q/k norms and the decoder's rotary;
    ``prefix`` runs layers 0..f-1 (Gated DeltaNet layers, no cache) over the whole native sequence."""
    import torch

    f = probe_layer(lm.config)
    attn = lm.layers[f].self_attn

    class Prefix(torch.nn.Module):
        """inputs_embeds [1,L,d] -> the hidden states entering layer f [1,L,d] (layers 0..f-1, no cache)."""

        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(lm.layers[:f])

        def forward(self, hidden, position_ids):
            for layer in self.layers:  # linear-attention layers: no positions, no mask, no cache
                hidden = layer(hidden, position_embeddings=None, attention_mask=None, cache=None)
            return hidden

    cfg = lm.config
    return ProbeParts(norm=lm.layers[f].input_layernorm, q_proj=attn.q_proj, k_proj=attn.k_proj,
                      rotary=lm.rotary_emb, apply_rope=apply_rope, num_heads=cfg.num_attention_heads,
                      num_kv_heads=cfg.num_key_value_heads, head_dim=attn.head_dim, scaling=attn.scaling,
                      q_norm=attn.q_norm, k_norm=attn.k_norm, q_gate=True, layer=f,
                      prefix=Prefix() if f else None)


def proxy_probe_parts(lm) -> ProbeParts:
    """The cheap probe: layer 0's own Gated DeltaNet query and key (its input norm, in_proj_qkv, causal convolution
    with SiLU, per-head L2 norm, the 1/sqrt(dk) scale) scored as a causal softmax over the native sequence, averaged
    over its Hk key heads. A stand-in, not an attention matrix of the model: layer 0 never forms that softmax (its
    rule reads keys through the decaying state), it sees no positions (no rotary) and unit-norm q, k score within
    +-1/sqrt(dk), so its softmax is flat next to an attention layer's. Cost: layer 0's norm, qkv projection and
    convolution over the sequence plus the T x L scores, no layer run in full."""
    import torch

    attn = lm.layers[0].linear_attn
    key_dim, width = attn.key_dim, attn.conv1d.weight.shape[-1]

    class Project(torch.nn.Module):
        """normed hidden [1,L,d] -> (queries, keys) [1,L,Hk*dk]: layer 0's projection and causal convolution."""

        def __init__(self):
            super().__init__()
            self.attn = attn

        def forward(self, hidden):
            mixed = self.attn.in_proj_qkv(hidden).transpose(1, 2)  # [1, C, L]
            mixed = torch.nn.functional.silu(self.attn.conv1d(mixed)[..., :hidden.shape[1]]).transpose(1, 2)
            return mixed[..., :key_dim], mixed[..., key_dim:2 * key_dim]

    class L2(torch.nn.Module):
        def forward(self, x):
            return _l2norm(x.float()).to(x.dtype)

    assert width == lm.config.linear_conv_kernel_dim  # causal: conv1d pads K-1 on both sides, the first L are kept
    return ProbeParts(norm=lm.layers[0].input_layernorm, q_proj=None, k_proj=None, rotary=None, apply_rope=None,
                      num_heads=attn.num_k_heads, num_kv_heads=attn.num_k_heads, head_dim=attn.head_k_dim,
                      scaling=attn.head_k_dim ** -0.5, q_norm=L2(), k_norm=L2(), layer=0, project=Project(),
                      kind="proxy")


def make_exportable(lm) -> None:
    """Give every Gated DeltaNet layer of ``lm`` the exportable chunked rule (see the module docstring). Per
    instance: the layer's own forward runs with its module's chunk function swapped for the call."""
    for layer, kind in zip(lm.layers, layer_types(lm.config)):
        if kind != LINEAR or getattr(layer.linear_attn, "_coverpruner_exportable", False):
            continue
        module = layer.linear_attn
        forward = type(module).forward
        names = inspect.unwrap(forward).__globals__  # the modeling module's globals the forward reads

        def call(*args, _forward=forward, _module=module, _names=names, **kwargs):
            saved = _names["torch_chunk_gated_delta_rule"]
            _names["torch_chunk_gated_delta_rule"] = chunk_gated_delta_rule
            try:
                return _forward(_module, *args, **kwargs)
            finally:
                _names["torch_chunk_gated_delta_rule"] = saved

        module.forward = call
        module._coverpruner_exportable = True


def _l2norm(x, eps: float = 1e-6):
    """HF's l2norm (flash-linear-attention's): x * rsqrt(sum(x^2) + eps)."""
    import torch

    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def unit_lower_inverse(n):
    """(I + n)^-1 for n [..., C, C] strictly lower triangular, C a power of two: recursive block inversion from the
    diagonal up, [[A, 0], [M, B]]^-1 = [[A^-1, 0], [-B^-1 M A^-1, B^-1]], every pair of one level at once (log2 C
    levels of batched matmuls; the arithmetic of forward substitution, in a parallel order)."""
    import torch

    c = n.shape[-1]
    blocks = torch.ones(*n.shape[:-2], c, 1, 1, dtype=n.dtype, device=n.device)  # inverted diagonal blocks, size 1
    size = 1
    while size < c:
        # block (2p+1, 2p) of each pair, by index (a reshape would split the symbolic leading axes)
        start = torch.arange(0, c, 2 * size, device=n.device)
        rows = (start + size)[:, None, None] + torch.arange(size, device=n.device)[None, :, None]
        cols = start[:, None, None] + torch.arange(size, device=n.device)[None, None, :]
        below = n[..., rows, cols]  # [..., c / 2size, size, size]
        a_inv, b_inv = blocks[..., 0::2, :, :], blocks[..., 1::2, :, :]
        low = -(b_inv @ below @ a_inv)
        blocks = torch.cat([torch.cat([a_inv, torch.zeros_like(a_inv)], -1), torch.cat([low, b_inv], -1)], -2)
        size *= 2
    return blocks[..., 0, :, :]


def chunk_gated_delta_rule(query, key, value, g, beta, chunk_size: int = CHUNK, initial_state=None,
                           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, **kwargs):
    """transformers' torch_chunk_gated_delta_rule (same arguments, same arithmetic) in a torch.export-able form.

    query, key [B,S,Hk,dk], value [B,S,Hv,dv], g (log decay, <= 0) and beta [B,S,Hv], initial_state [B,Hv,dk,dv]
    or None -> (out [B,S,Hv,dv] in query's dtype, final state [B,Hv,dk,dv] float32 or None). The sequence is
    padded with zero rows to whole chunks (one chunk more than it needs, see below) and a torch scan runs chunk by
    chunk: its UT system solved by ``unit_lower_inverse``, its outputs read from the state before it and its own
    rows, the state carried on as S_{i+1} = S_i * exp(sum g_i) + K_i^T (U_i - W_i S_i).
    """
    import torch
    from torch._higher_order_ops.scan import scan

    dtype = query.dtype
    hk, hv = key.shape[2], value.shape[2]
    if hk != hv:  # each query/key head serves Hv/Hk consecutive value heads
        query = query.repeat_interleave(hv // hk, dim=2)
        key = key.repeat_interleave(hv // hk, dim=2)
    query, key, value, beta, g = [x.transpose(1, 2).to(torch.float32) for x in (query, key, value, beta, g)]
    if use_qk_l2norm_in_kernel:
        query, key = _l2norm(query), _l2norm(key)
    query = query * query.shape[-1] ** -0.5
    b, h, length, dv = key.shape[0], key.shape[1], key.shape[2], value.shape[-1]
    # One chunk more than the rows need: >= 2 chunks and >= 1 padded row for every length, which torch.export can
    # prove from the floor division (a count of 1 or an empty padding are special cases it would otherwise guard and
    # specialise the graph on). Rows are written to and read from their (chunk, slot) by index, never by a reshape
    # (whose divisibility check it cannot prove either). Zero rows leave the state as it is (k = 0, decay 1).
    chunks = length // chunk_size + 2
    rows = torch.arange(length, device=key.device)
    chunk_of, slot_of = rows // chunk_size, rows % chunk_size

    def padded(x):  # [b, h, length, ...] -> [b, h, chunks, chunk_size, ...]
        out = x.new_zeros(b, h, chunks, chunk_size, *x.shape[3:])
        out[:, :, chunk_of, slot_of] = x
        return out

    state = (torch.zeros(b, h, key.shape[-1], dv, dtype=torch.float32, device=key.device) if initial_state is None
             else initial_state.to(torch.float32))

    def step(carry, xs):
        """One chunk: its intra-chunk system and outputs, then the state after it (all of a chunk's work inside the
        scan body, so no tensor outside has the chunk axis among a matmul's batch axes: torch.export would guard on
        the divisibility of their symbolic product)."""
        qi, ki, vi, bi, gi = xs  # [b, h, C, dk], [b, h, C, dk], [b, h, C, dv], [b, h, C], [b, h, C]
        cum = gi.cumsum(dim=-1)  # log decay from the chunk's start to each position
        upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=ki.device).triu(1)
        pair = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()
        k_beta, v_beta = ki * bi.unsqueeze(-1), vi * bi.unsqueeze(-1)
        inverse = unit_lower_inverse(((k_beta @ ki.transpose(-1, -2)) * pair).tril(-1))
        u = inverse @ v_beta
        w = inverse @ (k_beta * cum.exp().unsqueeze(-1))
        v_new = u - w @ carry
        out = (qi * cum.exp().unsqueeze(-1)) @ carry + ((qi @ ki.transpose(-1, -2)) * pair) @ v_new
        k_decayed = ki * (cum[..., -1:] - cum).exp().unsqueeze(-1)
        return carry * cum[..., -1].exp()[..., None, None] + k_decayed.transpose(-1, -2) @ v_new, out

    state, out = scan(step, state, [padded(x).movedim(2, 0) for x in (query, key, value, beta, g)])
    out = out.movedim(0, 2)[:, :, chunk_of, slot_of]  # [b, h, length, dv]
    return out.transpose(1, 2).contiguous().to(dtype), (state if output_final_state else None)
