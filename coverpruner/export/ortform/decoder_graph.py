"""Write the text decoder as one ORT-form ONNX graph (graphs.decoder.form "ort", docs/engine-dir.md).

The weights come from the family adapter (contract.Family.decoder_weights), as float arrays.

Graph (B batch, S new tokens, C cache capacity, R rotary rows, kvH kv heads, D head_dim, V vocab; F the float
type: f32, or f16 for precision "fp16"):
  inputs   inputs_embeds [B, S, hidden] F, seqlens_k [B] i32 (tokens in cache after the call - 1),
           total_sequence_length [] i32 (max over the batch of seqlens_k + 1),
           rotary_cos / rotary_sin [R, rd/2] F (rows of this call's tokens, see engines/ort_form_decoder.py; rd = D,
           or the rotated dims of a partial rotary),
           rotary_row [B, S] i64 (row of each token's rotation in rotary_cos),
           past_key_values.N.key/value [B, kvH, C, D] F per attention layer N (shared with present: in-place update),
           then (contract v5) past_key_values.N.conv [B, C_N, K-1] F and past_key_values.N.recurrent
           [B, Hv, dk, dv] f32 per Gated DeltaNet layer N (export/ortform/gated_delta.py),
           then one [B, S, hidden] F input per decoder extra (contract v4: e.g. visual_extra.0; zeros where a row
           has none, so decode steps feed zeros),
           then (contract v5) rotary_cos.k / rotary_sin.k [R, rd/2] F per further rotary table (rotary
           "tables", "layer_tables": Gemma 3's local layers) and, with bidirectional blocks, one additive mask
           attention_bias[.W] [B, 1, S, T] F per distinct window (T = total_sequence_length)
  outputs  logits [B, 1, V] F (last position only), present.N.key/value [B, kvH, C, D], present.N.conv /
           present.N.recurrent (the states after the call)
Per layer: RMSNormalization (layer 0) or SkipSimplifiedLayerNormalization -> one packed QKV MatMul (+bias) ->
GroupQueryAttention (do_rotary, no repeat_kv, causal mask inside) -> o_proj -> SkipSimplifiedLayerNormalization -> gate/up
MatMuls -> SiLU * up -> down. The last residual add is fused into the final norm; logits only for S-1.
The q/k-norm attention variant (layer weights with q_norm / k_norm) splits the packed QKV MatMul's output into Q, K
and V and runs a per-head RMSNormalization of Q and K before GQA (whose rotary comes after, as HF's Qwen3
attention); with an output gate (q_gate, Qwen3.5) the Q projection's per-head gate half is split off and
sigmoid(gate) multiplies the attention output. A partial rotary (DecoderWeights.rotary["dim"] < D) is GQA's own:
cos/sin tables rd/2 wide turn the first rd dims of each head. A Gated DeltaNet layer (contract v5) replaces the
attention (export/ortform/gated_delta.py). A decoder extra entering after layer i is added to that layer's MLP
output before the residual add that the next norm fuses (HF adds it to the sum: the two orders differ by fp32
rounding only).
Contract v5 (attention): a sliding-window layer without blocks is GroupQueryAttention with local_window_size W - 1
(it attends to itself and W - 1 keys before, transformers' key > query - W); with bidirectional blocks every layer is
GroupQueryAttention with causal=0 and its window's attention_bias (the host builds causal, window and blocks into it:
engines/attention_inputs.py), since GroupQueryAttention's causal mask cannot be lifted for a block's later rows.
Gemma's layer layout (DecoderLayerWeights.attn_out_norm / mlp_out_norm): the attention and MLP outputs are
RMS-normalized before their residual adds; DecoderWeights.activation "gelu_tanh" is ONNX Gelu(approximate="tanh");
DecoderWeights.scale is GroupQueryAttention's scale.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from coverpruner.engine_dir import attention_bias_name, rotary_names

OPSET = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
#: "fp32": float32 throughout; "fp16": float16 weights, activations, rotary tables, KV cache and logits (the form
#: ONNX Runtime's CUDA provider has a GroupQueryAttention kernel for; as onnxruntime-genai's CUDA models, the
#: kernels keep their reductions in float32: GQA's softmax, the norms' mean square); "int4": MatMulNBits weights
#: over float32 activations (CPU).
PRECISIONS = ("fp32", "fp16", "int4")


class _ExternalData:
    """Initializers > 1 KiB go to one .data file as they are made (a > 2 GiB graph never exists as one proto)."""

    ALIGN = 4096  # page-aligned offsets so ORT can map the weights

    def __init__(self, path: Path):
        self.path = path
        path.unlink(missing_ok=True)
        self.file = open(path, "wb")

    def tensor(self, name: str, array: np.ndarray) -> onnx.TensorProto:
        array = np.ascontiguousarray(array)
        if array.nbytes <= 1024:
            return numpy_helper.from_array(array, name)
        offset = self.file.tell()
        pad = (-offset) % self.ALIGN
        self.file.write(b"\0" * pad)
        offset += pad
        self.file.write(array.tobytes())
        t = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(offset)), ("length", str(array.nbytes))):
            t.external_data.add(key=key, value=value)
        return t


def quantize_4bit(weight_t: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits B [N, K/bs, bs/2] uint8 and scales [N * K/bs] f32 of weight_t [K, N], symmetric (no zero point).

    onnxruntime's own C++ block quantizer (the one MatMulNBitsQuantizer calls); K must divide by block_size.
    """
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    k, n = weight_t.shape
    if k % block_size:
        raise ValueError(f"K={k} is not a multiple of block_size={block_size}")
    blocks = k // block_size
    packed = np.zeros((n, blocks, block_size // 2), np.uint8)
    scales = np.zeros((n, blocks), np.float32)
    zero = np.zeros((n, (blocks + 1) // 2), np.uint8)
    quantize_matmul_4bits(packed, np.ascontiguousarray(weight_t, np.float32), scales, zero, block_size, n, k, True)
    return packed, scales.reshape(-1)


class OrtGraph:
    """The nodes and initializers of one ORT-form graph being written, and the node builders every layer kind uses
    (export/ortform/gated_delta.py writes the linear-attention layers with them).

    precision: PRECISIONS; fdt: the float type of activations, cache and float weights; data: the .data file the
    initializers > 1 KiB go to; block_size / accuracy_level: int4's MatMulNBits; eps: RMSNorm epsilon; head_dim:
    the attention layers' (per-head q/k norm)."""

    def __init__(self, precision: str, data: _ExternalData, block_size: int, accuracy_level: int, eps: float,
                 head_dim: int):
        self.precision, self.data, self.block_size, self.accuracy_level = precision, data, block_size, accuracy_level
        self.fdt = np.dtype(np.float16 if precision == "fp16" else np.float32)
        self.eps, self.head_dim = eps, head_dim
        self.inits: list[onnx.TensorProto] = []
        self.nodes: list[onnx.NodeProto] = []
        self._consts: dict[str, str] = {}

    def init(self, name: str, array: np.ndarray, keep_dtype: bool = False) -> str:
        """An initializer; float arrays in the graph's float type unless keep_dtype (float32 state math)."""
        if array.dtype.kind == "f" and not keep_dtype:  # weights, norms, biases (and int4's scales: float32)
            array = array.astype(self.fdt, copy=False)
        self.inits.append(self.data.tensor(name, array))
        return name

    def const(self, name: str, array: np.ndarray) -> str:
        """A small shared initializer (shapes, axes), written once."""
        if name not in self._consts:
            self._consts[name] = self.init(name, array, keep_dtype=True)
        return self._consts[name]

    def node(self, op, inputs, outputs, domain="", **attrs):
        self.nodes.append(helper.make_node(op, inputs, outputs, name=outputs[0] + "/" + op, domain=domain, **attrs))
        return outputs

    def matmul(self, x: str, weight: np.ndarray, name: str, out: str) -> str:
        """x [..., K] @ weight.T, weight [N, K] (HF Linear layout)."""
        if self.precision != "int4":
            return self.node("MatMul", [x, self.init(f"{name}.weight_t", weight.T)], [out])[0]
        packed, scales = quantize_4bit(weight.T, self.block_size)
        n, k = weight.shape
        return self.node("MatMulNBits", [x, self.init(f"{name}.qweight", packed), self.init(f"{name}.scales", scales)],
                         [out], domain="com.microsoft", K=k, N=n, bits=4, block_size=self.block_size,
                         accuracy_level=self.accuracy_level)[0]

    def linear(self, x: str, weight: np.ndarray, name: str, bias: np.ndarray | None = None) -> str:
        y = self.matmul(x, weight, name, f"{name}/out")
        if bias is not None:
            y = self.node("Add", [y, self.init(f"{name}.bias", bias)], [f"{name}/biased"])[0]
        return y

    def heads(self, x: str, width: int, name: str) -> str:
        """x [B, S, heads*width] -> [B, S, heads, width]."""
        return self.node("Reshape", [x, self.const(f"heads_shape_{width}", np.array([0, 0, -1, width], np.int64))],
                         [f"{name}/heads"])[0]

    def flat(self, x: str, name: str) -> str:
        """x [B, S, heads, width] -> [B, S, heads*width]."""
        return self.node("Reshape", [x, self.const("flat_shape", np.array([0, 0, -1], np.int64))],
                         [f"{name}/flat"])[0]

    def rms(self, x: str, scale: np.ndarray, name: str) -> str:
        """RMSNorm of x over its last axis, times scale (float32 statistics, as HF's norms)."""
        return self.node("RMSNormalization", [x, self.init(f"{name}.weight", scale)], [f"{name}/out"], axis=-1,
                         epsilon=self.eps, stash_type=1)[0]

    def head_norm(self, x: str, scale: np.ndarray, name: str, split: bool = True) -> str:
        """Per-head RMSNorm of x [B, S, heads*D] (or, with split False, [B, S, heads, D]) over each head's D values
        (the q/k-norm variant) -> [B, S, heads*D]."""
        heads = self.heads(x, self.head_dim, name) if split else x
        normed = self.node("RMSNormalization", [heads, self.init(f"{name}.weight", scale)], [f"{name}/normed"],
                           axis=-1, epsilon=self.eps, stash_type=1)[0]
        return self.flat(normed, name)


def _attention(g: OrtGraph, h: str, lw, i: int, nh: int, kvh: int, rotary=("rotary_cos", "rotary_sin"),
               attrs: dict | None = None, bias: str | None = None) -> str:
    """One attention layer (pre-normed input h [B, S, d]) -> its output before the residual [B, S, d]: QKV (packed,
    or split after one MatMul with q/k norm), GroupQueryAttention over the layer's in-place KV with the call's rotary
    rows (``rotary``: the cos / sin table names of the layer's base), its mask attributes ``attrs`` and additive
    ``bias`` input (contract v5), and with ``q_gate`` the output gate sigmoid(gate) * attention (the q projection
    holds per head hd query then hd gate rows)."""
    gate = None
    if lw.q_norm is None:
        wqkv = np.concatenate([lw.q, lw.k, lw.v], 0)
        bqkv = None if lw.q_bias is None else np.concatenate([lw.q_bias, lw.k_bias, lw.v_bias], 0)
        qkv = [g.linear(h, wqkv, f"layers.{i}.qkv", bqkv), "", ""]
    else:  # q/k norm sits between the projections and GQA's rotary: Q and K go in separately, from one packed MatMul
        widths = [lw.q.shape[0], lw.k.shape[0], lw.v.shape[0]]
        bqkv = None if lw.q_bias is None else np.concatenate([lw.q_bias, lw.k_bias, lw.v_bias], 0)
        packed = g.linear(h, np.concatenate([lw.q, lw.k, lw.v], 0), f"layers.{i}.qkv", bqkv)
        q, k, v = g.node("Split", [packed, g.const(f"qkv_split_{'_'.join(map(str, widths))}", np.array(widths))],
                         [f"l{i}/q", f"l{i}/k", f"l{i}/v"], axis=-1)
        if lw.q_gate:  # [B, S, H, 2*hd] -> query and gate halves per head
            both = g.heads(q, 2 * g.head_dim, f"layers.{i}.q_gate")
            half = g.const("q_gate_split", np.array([g.head_dim, g.head_dim], np.int64))
            q, gate = g.node("Split", [both, half], [f"l{i}/q_heads", f"l{i}/gate_heads"], axis=-1)
            q = g.head_norm(q, lw.q_norm, f"layers.{i}.q_norm", split=False)
            gate = g.node("Sigmoid", [g.flat(gate, f"l{i}/out_gate")], [f"l{i}/out_gate_sigmoid"])[0]
        else:
            q = g.head_norm(q, lw.q_norm, f"layers.{i}.q_norm")
        qkv = [q, g.head_norm(k, lw.k_norm, f"layers.{i}.k_norm"), v]
    attn = g.node("GroupQueryAttention",
                  [*qkv, f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k",
                   "total_sequence_length", *rotary, "rotary_row", *([bias] if bias else [])],
                  [f"l{i}/attn", f"present.{i}.key", f"present.{i}.value"], domain="com.microsoft",
                  num_heads=nh, kv_num_heads=kvh, do_rotary=1, rotary_interleaved=0, **(attrs or {}))[0]
    if gate is not None:
        attn = g.node("Mul", [attn, gate], [f"l{i}/attn_gated"])[0]
    return g.linear(attn, lw.o, f"layers.{i}.o_proj")


def build_ort_decoder(weights, output: str | Path, precision: str = "fp32", block_size: int = 32,
                      accuracy_level: int = 4, extras=(), attention=None) -> Path:
    """Write `output` (.onnx + .onnx.data) from `weights` (contract.DecoderWeights) in ORT form; returns its path.

    extras: the family's decoder extras (contract.DecoderExtra: input name, after_layer), each an extra graph input.
    attention: the contract.AttentionSpec (v5: sliding windows, bidirectional prefill blocks); None: causal.
    A layer with ``linear`` weights (contract v5: a Gated DeltaNet layer) is written by export/ortform/gated_delta.py
    and carries its conv and recurrent states as inputs / outputs instead of a KV cache.
    precision "int4": every linear (lm_head included) is MatMulNBits, 4 bits, symmetric, `block_size` along K,
    activations quantized to int8 inside the kernel (accuracy_level 4), as onnxruntime-genai's CPU default.
    ValueError (one line) for a precision it does not write or an int4 width not divisible by `block_size`.
    """
    from coverpruner.export.ortform.gated_delta import gated_delta_layer, state_io

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    H = weights.norm.shape[0]
    c = {"layers": len(weights.layers), "eps": weights.eps, "vocab": weights.lm_head.shape[0]}
    nh, kvh, D = weights.num_heads, weights.num_kv_heads, weights.head_dim
    rotary_dim = int((weights.rotary or {}).get("dim") or D)
    data = _ExternalData(output.with_name(output.name + ".data"))
    g = OrtGraph(precision, data, block_size, accuracy_level, float(c["eps"]), D)
    fdt = g.fdt
    after = {}
    for extra in extras:
        if not 0 <= extra.after_layer < c["layers"]:
            raise ValueError(f"decoder extra {extra.name!r} enters after layer {extra.after_layer}; the decoder has "
                             f"{c['layers']} layers")
        after.setdefault(extra.after_layer, []).append(extra.name)
    windows = tuple(attention.windows) if attention is not None and attention.windows else (None,) * c["layers"]
    if len(windows) != c["layers"]:
        raise ValueError(f"attention windows name {len(windows)} layers; the decoder has {c['layers']}")
    blocks = attention is not None and attention.blocks
    tables = (weights.rotary or {}).get("layer_tables") or [0] * c["layers"]
    if weights.activation not in ("silu", "gelu_tanh"):
        raise ValueError(f"activation {weights.activation!r} has no ORT-form MLP (silu, gelu_tanh)")

    x, residual = "inputs_embeds", None
    for i, lw in enumerate(weights.layers):
        ln_w = g.init(f"layers.{i}.input_layernorm", lw.input_norm)
        if residual is None:
            # the standard op (opset 23): ORT's SimplifiedLayerNormalization sits in the default domain where
            # onnx.checker (run by the quantize pass) does not know it
            h = g.node("RMSNormalization", [x, ln_w], [f"l{i}/ln_in"], axis=-1, epsilon=g.eps, stash_type=1)[0]
            residual = x
        else:
            h, _, _, residual = g.node("SkipSimplifiedLayerNormalization", [x, residual, ln_w],
                                       [f"l{i}/ln_in", f"l{i}/ln_in_mean", f"l{i}/ln_in_inv", f"l{i}/resid_in"],
                                       domain="com.microsoft", epsilon=g.eps)
        if lw.linear is not None:
            o = gated_delta_layer(g, h, lw.linear, i)
        else:
            attrs = {}
            if blocks:  # the host's mask holds causal, window and blocks: GroupQueryAttention's own causal mask is off
                attrs = {"causal": 0}
            elif windows[i] is not None:
                attrs = {"local_window_size": int(windows[i]) - 1}  # itself + W - 1 keys before: key > query - W
            if weights.scale is not None:
                attrs["scale"] = float(weights.scale)
            o = _attention(g, h, lw, i, nh, kvh, rotary_names(tables[i]), attrs,
                           attention_bias_name(windows[i]) if blocks else None)
        if lw.attn_out_norm is not None:  # Gemma: the attention output is normalized before its residual add
            o = g.rms(o, lw.attn_out_norm, f"layers.{i}.post_attention_norm")
        ln2 = g.init(f"layers.{i}.post_attention_layernorm", lw.post_norm)
        h2, _, _, residual = g.node("SkipSimplifiedLayerNormalization", [o, residual, ln2],
                                    [f"l{i}/ln_post", f"l{i}/ln_post_mean", f"l{i}/ln_post_inv", f"l{i}/resid_mid"],
                                    domain="com.microsoft", epsilon=g.eps)
        gate = g.linear(h2, lw.gate, f"layers.{i}.gate_proj")
        up = g.linear(h2, lw.up, f"layers.{i}.up_proj")
        if weights.activation == "gelu_tanh":
            act = g.node("Gelu", [gate], [f"l{i}/gelu"], approximate="tanh")[0]
            prod = g.node("Mul", [act, up], [f"l{i}/gelu_up"])[0]
        else:
            sig = g.node("Sigmoid", [gate], [f"l{i}/gate_sigmoid"])[0]
            act = g.node("Mul", [gate, sig], [f"l{i}/silu"])[0]
            prod = g.node("Mul", [act, up], [f"l{i}/silu_up"])[0]
        x = g.linear(prod, lw.down, f"layers.{i}.down_proj")
        if lw.mlp_out_norm is not None:  # Gemma: the MLP output is normalized before its residual add
            x = g.rms(x, lw.mlp_out_norm, f"layers.{i}.post_feedforward_norm")
        for name in after.get(i, ()):  # hidden = residual + x (+ extra): the next norm's skip input adds it
            x = g.node("Add", [x, name], [f"l{i}/plus_{name}"])[0]
    # Last position first: norm and lm_head run on one row per batch entry (prefill S rows -> 1).
    last = g.init("last_index", np.array([-1], dtype=np.int64))
    x_last = g.node("Gather", [x, last], ["last/x"], axis=1)[0]
    r_last = g.node("Gather", [residual, last], ["last/residual"], axis=1)[0]
    normed = g.node("SkipSimplifiedLayerNormalization", [x_last, r_last, g.init("norm", weights.norm)],
                    ["final/norm"], domain="com.microsoft", epsilon=g.eps)[0]
    g.matmul(normed, weights.lm_head, "lm_head", "logits")  # fp16 logits: widening them on the host is exact

    i32, i64 = TensorProto.INT32, TensorProto.INT64
    ft = helper.np_dtype_to_tensor_dtype(fdt)
    kv_shape = ["batch", kvh, "capacity", D]
    inputs = [helper.make_tensor_value_info("inputs_embeds", ft, ["batch", "sequence", H]),
              helper.make_tensor_value_info("seqlens_k", i32, ["batch"]),
              helper.make_tensor_value_info("total_sequence_length", i32, []),
              helper.make_tensor_value_info("rotary_cos", ft, ["rotary_rows", rotary_dim // 2]),
              helper.make_tensor_value_info("rotary_sin", ft, ["rotary_rows", rotary_dim // 2]),
              helper.make_tensor_value_info("rotary_row", i64, ["batch", "sequence"])]
    outputs = [helper.make_tensor_value_info("logits", ft, ["batch", 1, c["vocab"]])]
    for i, lw in enumerate(weights.layers):
        if lw.linear is not None:
            continue
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", ft, kv_shape))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", ft, kv_shape))
    state_in, state_out = state_io([(i, lw.linear) for i, lw in enumerate(weights.layers) if lw.linear is not None],
                                   ft)
    inputs += state_in
    outputs += state_out
    inputs += [helper.make_tensor_value_info(e.name, ft, ["batch", "sequence", H]) for e in extras]
    for table in sorted(set(tables) - {0}):
        inputs += [helper.make_tensor_value_info(name, ft, ["rotary_rows", rotary_dim // 2])
                   for name in rotary_names(table)]
    if blocks:
        inputs += [helper.make_tensor_value_info(attention_bias_name(w), ft, ["batch", 1, "sequence", "total"])
                   for w in dict.fromkeys(windows)]
    graph = helper.make_graph(g.nodes, "decoder_ortform", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=OPSET, producer_name="coverpruner-ortform")
    # the lowest IR version the opsets need (11), not the onnx package's newest: onnx 1.23 stamps IR 14, which an
    # onnxruntime older than the onnx package (1.30 reads IR <= 13) refuses to load
    model.ir_version = helper.find_min_ir_version_for(OPSET, ignore_unknown=True)
    data.file.close()
    tmp = output.with_name(output.name + ".tmp")
    onnx.save_model(model, str(tmp))
    tmp.replace(output)
    return output


def build_from_checkpoint(checkpoint: str | Path, output: str | Path, precision: str = "fp32",
                          block_size: int = 32) -> Path:
    """build_ort_decoder for an HF checkpoint dir (benchmarks, tests): its family adapter loads the model (fp32)
    and hands over the weights and its decoder extras (Qwen3-VL's DeepStack inputs), as export does."""
    from transformers import AutoConfig

    from coverpruner.families import family_for_model_type

    config = AutoConfig.from_pretrained(str(checkpoint))
    family = family_for_model_type(config.model_type)
    weights = family.decoder_weights(family.load_model(Path(checkpoint), "float32"))
    spec = family.decoder_spec(config)
    return build_ort_decoder(weights, output, precision, block_size, extras=spec.extras, attention=spec.attention)
