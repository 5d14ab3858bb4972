"""A Gated DeltaNet (linear-attention) layer in the ORT-form decoder (contract v5: contract.GatedDeltaWeights), with
ONNX Runtime's contrib ops as onnxruntime-genai's model builder writes Qwen3.5 (0.18, builders/qwen.py,
Qwen35TextModel.make_qwen_gated_delta_net): the same ops, the same state layouts.

    h [B,S,d] -> qkv = h @ W_qkv^T [B,S,C] -> CausalConvWithState (depthwise kernel K, SiLU; past conv state
    [B,C,K-1] in, present out) -> q, k [B,S,Hk*dk], v [B,S,Hv*dv] -> q, k L2-normalised per head (x / sqrt(sum x^2 +
    1e-6), HF's formula), q * 1/sqrt(dk) -> LinearAttentionGate(a = h @ W_a^T, dt_bias, -exp(A_log), b = h @ W_b^T)
    -> log decay g, beta [B,S,Hv] -> LinearAttention(update_rule "gated_delta", scale 1, q heads Hk, kv heads Hv;
    past recurrent state [B,Hv,dk,dv] float32 in, present out) -> o [B,S,Hv*dv] -> GatedRMSNorm(o, norm, z = h @
    W_z^T) per value head -> out = . @ W_out^T [B,S,d]

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


def _l2_normalised(g, x: str, heads: int, width: int, name: str) -> str:
    """x [B,S,heads*width] normalised per head as HF's l2norm: x / sqrt(sum(x^2) + eps) -> [B,S,heads*width]."""
    h = g.heads(x, width, name)
    axis = g.const("axis_last", np.array([-1], np.int64))
    sq = g.node("ReduceSumSquare", [h, axis], [f"{name}/sumsq"], keepdims=1)[0]
    eps = g.init(f"{name}.eps", np.array(L2_EPS, np.float32))
    root = g.node("Sqrt", [g.node("Add", [sq, eps], [f"{name}/sumsq_eps"])[0]], [f"{name}/norm"])[0]
    return g.flat(g.node("Div", [h, root], [f"{name}/unit"])[0], name)


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
    q = _l2_normalised(g, q, hk, dk, f"{base}.q_l2")
    k = _l2_normalised(g, k, hk, dk, f"{base}.k_l2")
    q = g.node("Mul", [q, g.init(f"{base}.q_scale", np.array(dk ** -0.5, np.float32))], [f"{base}/q_scaled"])[0]
    a = g.linear(h, w.a, f"{base}.in_proj_a")
    b = g.linear(h, w.b, f"{base}.in_proj_b")
    decay, beta = g.node("LinearAttentionGate",
                         [a, g.init(f"{base}.dt_bias", w.dt_bias, keep_dtype=True),
                          g.init(f"{base}.neg_exp_a", -np.exp(w.a_log.astype(np.float32)), keep_dtype=True), b],
                         [f"{base}/decay", f"{base}/beta"], domain="com.microsoft")
    out, _ = g.node("LinearAttention", [q, k, v, f"past_key_values.{i}.recurrent", decay, beta],
                    [f"{base}/core", f"present.{i}.recurrent"], domain="com.microsoft", q_num_heads=hk,
                    kv_num_heads=hv, update_rule="gated_delta", scale=1.0)
    z = g.linear(h, w.z, f"{base}.in_proj_z")
    normed = g.node("GatedRMSNorm", [out, g.init(f"{base}.norm.weight", w.norm), z], [f"{base}/gated_norm"],
                    domain="com.microsoft", epsilon=g.eps, activation="silu")[0]
    return g.linear(normed, w.out, f"{base}.out_proj")
