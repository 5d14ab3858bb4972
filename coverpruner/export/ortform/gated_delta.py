"""A Gated DeltaNet (linear-attention) layer in the ORT-form decoder (contract v5: contract.GatedDeltaWeights), with
ONNX Runtime's contrib ops as onnxruntime-genai's model builder writes Qwen3.5 (0.18, builders/qwen.py,
Qwen35TextModel.make_qwen_gated_delta_net): the same ops, the same state layouts.

    h [B,S,d] -> qkv = h @ W_qkv^T [B,S,C] -> CausalConvWithState (depthwise kernel K, SiLU; past conv state
    [B,C,K-1] in, present out) -> q, k [B,S,Hk*dk], v [B,S,Hv*dv] -> q, k L2-normalised per head and q scaled by
    1/sqrt(dk), each as ONE RMSNormalization (below) -> LinearAttentionGate(a, dt_bias, -exp(A_log), b) -> log decay
    g, beta [B,S,Hv] -> LinearAttention(update_rule "gated_delta", scale 1, q heads Hk, kv heads Hv; past recurrent
    state [B,Hv,dk,dv] float32 in, present out) -> o [B,S,Hv*dv] -> GatedRMSNorm(o, norm, z) per value head -> out =
    . @ W_out^T [B,S,d]; z, b and a come from one MatMul h @ [W_z; W_b; W_a]^T (one weight read and one node
    instead of three, split after: a decode step is bound by its weight reads and its node count).

HF's l2norm x / sqrt(sum(x^2) + eps) over a head's d values is RMSNorm(x, eps / d) * 1/sqrt(d) (sum = d * mean), so
each of q and k is one RMSNormalization with epsilon eps / d and a constant scale (k: 1/sqrt(dk); q: 1/dk, the query
scale 1/sqrt(dk) folded in) where onnxruntime-genai writes LpNormalization (no epsilon) and a Mul; the two differ
from HF's formula by float32 rounding only.

The gated delta rule itself (LinearAttention) is ONNX Runtime's kernel: a prefill of S rows and a decode step of one
are the same node. The state tensors are graph inputs / outputs named past_key_values.{i}.conv / .recurrent and
present.{i}.conv / .recurrent (engine_dir.StateSpec), in the float type of the graph (conv) and float32
(recurrent); the engines bind them (engines/state_buffers.py).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

#: HF's l2norm epsilon (flash-linear-attention's): x * rsqrt(sum(x^2) + 1e-6)
L2_EPS = 1e-6


def state_io(layers: list, float_type: int) -> tuple[list, list]:
    """Graph inputs and outputs of the states of [(layer index, GatedDeltaWeights)], in the order of the family's
    DecoderSpec (gated_delta.decoder_spec: every conv state, then every recurrent state)."""
    inputs, outputs = [], []
    for name in ("conv", "recurrent"):
        for i, w in layers:
            channels = 2 * w.num_k_heads * w.head_k_dim + w.num_v_heads * w.head_v_dim
            shape = (["batch", channels, w.conv.shape[1] - 1] if name == "conv"
                     else ["batch", w.num_v_heads, w.head_k_dim, w.head_v_dim])
            dtype = float_type if name == "conv" else TensorProto.FLOAT
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{name}", dtype, shape))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{name}", dtype, shape))
    return inputs, outputs


def _l2_normalised(g, x: str, heads: int, width: int, name: str, scale: float = 1.0) -> str:
    """x [B,S,heads*width] normalised per head as HF's l2norm, x / sqrt(sum(x^2) + eps), times ``scale`` ->
    [B,S,heads*width]: one RMSNormalization (float32 statistics) of epsilon eps / width and scale
    scale / sqrt(width) (module docstring)."""
    w = np.full(width, scale / np.sqrt(width), np.float32)
    normed = g.node("RMSNormalization", [g.heads(x, width, name), g.init(f"{name}.scale", w)], [f"{name}/unit"],
                    axis=-1, epsilon=L2_EPS / width, stash_type=1)[0]
    return g.flat(normed, name)


def gated_delta_layer(g, h: str, w, i: int) -> str:
    """Layer i's Gated DeltaNet (contract.GatedDeltaWeights ``w``) on the pre-normed input h [B,S,d] -> its output
    before the residual [B,S,d]; reads past_key_values.{i}.conv / .recurrent, writes present.{i}.conv / .recurrent.
    g: the decoder_graph.OrtGraph being written."""
    hk, hv, dk, dv = w.num_k_heads, w.num_v_heads, w.head_k_dim, w.head_v_dim
    key_dim, value_dim = hk * dk, hv * dv
    base = f"layers.{i}.linear_attn"
    qkv = g.linear(h, w.qkv, f"{base}.in_proj_qkv")
    channels_first = g.node("Transpose", [qkv], [f"{base}/qkv_t"], perm=[0, 2, 1])[0]  # [B, C, S]
    conv, _ = g.node("CausalConvWithState",
                     [channels_first, g.init(f"{base}.conv1d.weight", w.conv[:, None, :]), "",
                      f"past_key_values.{i}.conv"], [f"{base}/conv", f"present.{i}.conv"], domain="com.microsoft",
                     ndim=1, activation="silu")
    mixed = g.node("Transpose", [conv], [f"{base}/conv_t"], perm=[0, 2, 1])[0]  # [B, S, C]
    split = g.const(f"qkv_split_{key_dim}_{value_dim}", np.array([key_dim, key_dim, value_dim], np.int64))
    q, k, v = g.node("Split", [mixed, split], [f"{base}/q", f"{base}/k", f"{base}/v"], axis=-1)
    q = _l2_normalised(g, q, hk, dk, f"{base}.q_l2", scale=dk ** -0.5)
    k = _l2_normalised(g, k, hk, dk, f"{base}.k_l2")
    gates = g.linear(h, np.concatenate([w.z, w.b, w.a], 0), f"{base}.in_proj_zba")
    widths = [value_dim, hv, hv]
    z, b, a = g.node("Split", [gates, g.const(f"zba_split_{value_dim}_{hv}", np.array(widths, np.int64))],
                     [f"{base}/z", f"{base}/b", f"{base}/a"], axis=-1)
    decay, beta = g.node("LinearAttentionGate",
                         [a, g.init(f"{base}.dt_bias", w.dt_bias, keep_dtype=True),
                          g.init(f"{base}.neg_exp_a", -np.exp(w.a_log.astype(np.float32)), keep_dtype=True), b],
                         [f"{base}/decay", f"{base}/beta"], domain="com.microsoft")
    out, _ = g.node("LinearAttention", [q, k, v, f"past_key_values.{i}.recurrent", decay, beta],
                    [f"{base}/core", f"present.{i}.recurrent"], domain="com.microsoft", q_num_heads=hk,
                    kv_num_heads=hv, update_rule="gated_delta", scale=1.0)
    normed = g.node("GatedRMSNorm", [out, g.init(f"{base}.norm.weight", w.norm), z], [f"{base}/gated_norm"],
                    domain="com.microsoft", epsilon=g.eps, activation="silu")[0]
    return g.linear(normed, w.out, f"{base}.out_proj")
