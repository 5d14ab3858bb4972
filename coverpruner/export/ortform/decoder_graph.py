"""Write the text decoder as one ORT-form ONNX graph (graphs.decoder.form "ort", docs/engine-dir.md).

The weights come from the family adapter (contract.Family.decoder_weights), as float arrays.

Graph (B batch, S new tokens, C cache capacity, R rotary rows, kvH kv heads, D head_dim, V vocab; F the float
type: f32, or f16 for precision "fp16"):
  inputs   inputs_embeds [B, S, hidden] F, seqlens_k [B] i32 (tokens in cache after the call - 1),
           total_sequence_length [] i32 (max over the batch of seqlens_k + 1),
           rotary_cos / rotary_sin [R, D/2] F (rows of this call's tokens, see engines/ort_form_decoder.py),
           rotary_row [B, S] i64 (row of each token's rotation in rotary_cos),
           past_key_values.N.key/value [B, kvH, C, D] F (shared with present: in-place update),
           then one [B, S, hidden] F input per decoder extra (contract v4: e.g. visual_extra.0; zeros where a row
           has none, so decode steps feed zeros),
           then (contract v5) rotary_cos.k / rotary_sin.k [R, D/2] F per further rotary table (rotary
           "tables", "layer_tables": Gemma 3's local layers) and, with bidirectional blocks, one additive mask
           attention_bias[.W] [B, 1, S, T] F per distinct window (T = total_sequence_length)
  outputs  logits [B, 1, V] F (last position only), present.N.key/value [B, kvH, C, D]
Per layer: RMSNormalization (layer 0) or SkipSimplifiedLayerNormalization -> one packed QKV MatMul (+bias) ->
GroupQueryAttention (do_rotary, no repeat_kv, causal mask inside) -> o_proj -> SkipSimplifiedLayerNormalization -> gate/up
MatMuls -> SiLU * up -> down. The last residual add is fused into the final norm; logits only for S-1.
The q/k-norm attention variant (layer weights with q_norm / k_norm) runs separate Q, K, V MatMuls and a per-head
RMSNormalization of Q and K before GQA (whose rotary comes after, as HF's Qwen3 attention). A decoder extra
entering after layer i is added to that layer's MLP output before the residual add that the next norm fuses
(HF adds it to the sum: the two orders differ by fp32 rounding only).
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


def build_ort_decoder(weights, output: str | Path, precision: str = "fp32", block_size: int = 32,
                      accuracy_level: int = 4, extras=(), attention=None) -> Path:
    """Write `output` (.onnx + .onnx.data) from `weights` (contract.DecoderWeights) in ORT form; returns its path.

    extras: the family's decoder extras (contract.DecoderExtra: input name, after_layer), each an extra graph input.
    attention: the contract.AttentionSpec (v5: sliding windows, bidirectional prefill blocks); None: causal.
    precision "int4": every linear (lm_head included) is MatMulNBits, 4 bits, symmetric, `block_size` along K,
    activations quantized to int8 inside the kernel (accuracy_level 4), as onnxruntime-genai's CPU default.
    ValueError (one line) for a precision it does not write or an int4 width not divisible by `block_size`.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    # activations, KV cache, rotary tables and float weights in one dtype (int4 keeps float32 activations)
    fdt = np.dtype(np.float16 if precision == "fp16" else np.float32)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    H = weights.norm.shape[0]
    c = {"layers": len(weights.layers), "eps": weights.eps, "vocab": weights.lm_head.shape[0]}
    nh, kvh, D = weights.num_heads, weights.num_kv_heads, weights.head_dim
    data = _ExternalData(output.with_name(output.name + ".data"))
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def init(name: str, array: np.ndarray) -> str:
        if array.dtype.kind == "f":  # weights, norms, biases (and int4's MatMulNBits scales: float32)
            array = array.astype(fdt, copy=False)
        inits.append(data.tensor(name, array))
        return name

    def node(op, inputs, outputs, domain="", **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, name=outputs[0] + "/" + op, domain=domain, **attrs))
        return outputs

    def matmul(x: str, weight: np.ndarray, name: str, out: str) -> str:
        """x [..., K] @ weight.T, weight [N, K] (HF Linear layout)."""
        if precision != "int4":
            return node("MatMul", [x, init(f"{name}.weight_t", weight.T)], [out])[0]
        packed, scales = quantize_4bit(weight.T, block_size)
        n, k = weight.shape
        return node("MatMulNBits", [x, init(f"{name}.qweight", packed), init(f"{name}.scales", scales)], [out],
                    domain="com.microsoft", K=k, N=n, bits=4, block_size=block_size,
                    accuracy_level=accuracy_level)[0]

    def linear(x: str, weight: np.ndarray, name: str, bias: np.ndarray | None = None) -> str:
        y = matmul(x, weight, name, f"{name}/out")
        if bias is not None:
            y = node("Add", [y, init(f"{name}.bias", bias)], [f"{name}/biased"])[0]
        return y

    eps = float(c["eps"])
    after = {}
    for extra in extras:
        if not 0 <= extra.after_layer < c["layers"]:
            raise ValueError(f"decoder extra {extra.name!r} enters after layer {extra.after_layer}; the decoder has "
                             f"{c['layers']} layers")
        after.setdefault(extra.after_layer, []).append(extra.name)
    heads_shape = {}
    windows = tuple(attention.windows) if attention is not None and attention.windows else (None,) * c["layers"]
    if len(windows) != c["layers"]:
        raise ValueError(f"attention windows name {len(windows)} layers; the decoder has {c['layers']}")
    blocks = attention is not None and attention.blocks
    tables = weights.rotary.get("layer_tables") or [0] * c["layers"]
    if weights.activation not in ("silu", "gelu_tanh"):
        raise ValueError(f"activation {weights.activation!r} has no ORT-form MLP (silu, gelu_tanh)")

    def rms(x: str, scale: np.ndarray, name: str) -> str:
        """RMSNorm of x over its last axis, times scale (float32 statistics, as HF's norms)."""
        return node("RMSNormalization", [x, init(f"{name}.weight", scale)], [f"{name}/out"], axis=-1,
                    epsilon=eps, stash_type=1)[0]

    def head_norm(x: str, scale: np.ndarray, name: str) -> str:
        """Per-head RMSNorm of x [B, S, heads*D] over each head's D values (the q/k-norm variant)."""
        if "split" not in heads_shape:
            heads_shape["split"] = init("heads_shape", np.array([0, 0, -1, D], np.int64))
            heads_shape["flat"] = init("flat_shape", np.array([0, 0, -1], np.int64))
        heads = node("Reshape", [x, heads_shape["split"]], [f"{name}/heads"])[0]
        normed = node("RMSNormalization", [heads, init(f"{name}.weight", scale)], [f"{name}/normed"], axis=-1,
                      epsilon=eps, stash_type=1)[0]
        return node("Reshape", [normed, heads_shape["flat"]], [f"{name}/flat"])[0]

    x, residual = "inputs_embeds", None
    for i, lw in enumerate(weights.layers):
        ln_w = init(f"layers.{i}.input_layernorm", lw.input_norm)
        if residual is None:
            # the standard op (opset 23): ORT's SimplifiedLayerNormalization sits in the default domain where
            # onnx.checker (run by the quantize pass) does not know it
            h = node("RMSNormalization", [x, ln_w], [f"l{i}/ln_in"], axis=-1, epsilon=eps, stash_type=1)[0]
            residual = x
        else:
            h, _, _, residual = node("SkipSimplifiedLayerNormalization", [x, residual, ln_w],
                                     [f"l{i}/ln_in", f"l{i}/ln_in_mean", f"l{i}/ln_in_inv", f"l{i}/resid_in"],
                                     domain="com.microsoft", epsilon=eps)
        if lw.q_norm is None:
            wqkv = np.concatenate([lw.q, lw.k, lw.v], 0)
            bqkv = None
            if lw.q_bias is not None:
                bqkv = np.concatenate([lw.q_bias, lw.k_bias, lw.v_bias], 0)
            qkv = [linear(h, wqkv, f"layers.{i}.qkv", bqkv), "", ""]
        else:  # q/k norm sits between the projections and GQA's rotary: Q and K go in separately
            q = head_norm(linear(h, lw.q, f"layers.{i}.q_proj", lw.q_bias), lw.q_norm, f"layers.{i}.q_norm")
            k = head_norm(linear(h, lw.k, f"layers.{i}.k_proj", lw.k_bias), lw.k_norm, f"layers.{i}.k_norm")
            qkv = [q, k, linear(h, lw.v, f"layers.{i}.v_proj", lw.v_bias)]
        cos, sin = rotary_names(tables[i])
        mask = {}
        if blocks:  # the host's mask holds causal, window and blocks: GroupQueryAttention's own causal mask is off
            mask = {"causal": 0}
        elif windows[i] is not None:
            mask = {"local_window_size": int(windows[i]) - 1}  # itself + W - 1 keys before: key > query - W
        if weights.scale is not None:
            mask["scale"] = float(weights.scale)
        attn = node("GroupQueryAttention",
                    [*qkv, f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k",
                     "total_sequence_length", cos, sin, "rotary_row",
                     *([attention_bias_name(windows[i])] if blocks else [])],
                    [f"l{i}/attn", f"present.{i}.key", f"present.{i}.value"], domain="com.microsoft",
                    num_heads=nh, kv_num_heads=kvh, do_rotary=1, rotary_interleaved=0, **mask)[0]
        o = linear(attn, lw.o, f"layers.{i}.o_proj")
        if lw.attn_out_norm is not None:  # Gemma: the attention output is normalized before its residual add
            o = rms(o, lw.attn_out_norm, f"layers.{i}.post_attention_norm")
        ln2 = init(f"layers.{i}.post_attention_layernorm", lw.post_norm)
        h2, _, _, residual = node("SkipSimplifiedLayerNormalization", [o, residual, ln2],
                                  [f"l{i}/ln_post", f"l{i}/ln_post_mean", f"l{i}/ln_post_inv", f"l{i}/resid_mid"],
                                  domain="com.microsoft", epsilon=eps)
        gate = linear(h2, lw.gate, f"layers.{i}.gate_proj")
        up = linear(h2, lw.up, f"layers.{i}.up_proj")
        if weights.activation == "gelu_tanh":
            act = node("Gelu", [gate], [f"l{i}/gelu"], approximate="tanh")[0]
        else:
            sig = node("Sigmoid", [gate], [f"l{i}/gate_sigmoid"])[0]
            act = node("Mul", [gate, sig], [f"l{i}/silu"])[0]
        prod = node("Mul", [act, up], [f"l{i}/act_up"])[0]
        x = linear(prod, lw.down, f"layers.{i}.down_proj")
        if lw.mlp_out_norm is not None:  # Gemma: the MLP output is normalized before its residual add
            x = rms(x, lw.mlp_out_norm, f"layers.{i}.post_feedforward_norm")
        for name in after.get(i, ()):  # hidden = residual + x (+ extra): the next norm's skip input adds it
            x = node("Add", [x, name], [f"l{i}/plus_{name}"])[0]
    # Last position first: norm and lm_head run on one row per batch entry (prefill S rows -> 1).
    last = init("last_index", np.array([-1], dtype=np.int64))
    x_last = node("Gather", [x, last], ["last/x"], axis=1)[0]
    r_last = node("Gather", [residual, last], ["last/residual"], axis=1)[0]
    normed = node("SkipSimplifiedLayerNormalization", [x_last, r_last, init("norm", weights.norm)],
                  ["final/norm"], domain="com.microsoft", epsilon=eps)[0]
    matmul(normed, weights.lm_head, "lm_head", "logits")  # fp16 logits: widening them on the host is exact

    i32, i64 = TensorProto.INT32, TensorProto.INT64
    ft = helper.np_dtype_to_tensor_dtype(fdt)
    kv_shape = ["batch", kvh, "capacity", D]
    inputs = [helper.make_tensor_value_info("inputs_embeds", ft, ["batch", "sequence", H]),
              helper.make_tensor_value_info("seqlens_k", i32, ["batch"]),
              helper.make_tensor_value_info("total_sequence_length", i32, []),
              helper.make_tensor_value_info("rotary_cos", ft, ["rotary_rows", D // 2]),
              helper.make_tensor_value_info("rotary_sin", ft, ["rotary_rows", D // 2]),
              helper.make_tensor_value_info("rotary_row", i64, ["batch", "sequence"])]
    outputs = [helper.make_tensor_value_info("logits", ft, ["batch", 1, c["vocab"]])]
    for i in range(c["layers"]):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", ft, kv_shape))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", ft, kv_shape))
    inputs += [helper.make_tensor_value_info(e.name, ft, ["batch", "sequence", H]) for e in extras]
    for table in sorted(set(tables) - {0}):
        inputs += [helper.make_tensor_value_info(name, ft, ["rotary_rows", D // 2]) for name in rotary_names(table)]
    if blocks:
        inputs += [helper.make_tensor_value_info(attention_bias_name(w), ft, ["batch", 1, "sequence", "total"])
                   for w in dict.fromkeys(windows)]
    graph = helper.make_graph(nodes, "decoder_ortform", inputs, outputs, inits)
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
