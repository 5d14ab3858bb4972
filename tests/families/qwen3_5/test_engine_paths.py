"""Qwen3.5 on engine paths beyond the family matrix. int4 / int8 decoders (ORT form, MatMulNBits): every linear
projection of both layer kinds is quantized (a Gated DeltaNet layer's in_proj_qkv / z / a / b and out_proj, a full
layer's packed QKV and o, the MLPs, the lm_head) while the states and their manifest record stay as exported, and the
pipeline on the quantized dir keeps the float engine's rows (vision and probe stay float). That the quantized graph
carries the states as the float one does is shown against a reference with the same weights: the float decoder with
each MatMul weight replaced by the quantized one dequantized here (W[k, n] = (q - zero point) x scale of its block
along K, from MatMulNBits' packed layout), answering token for token as the quantized dir at float compute
(accuracy_level 1; float32 on both sides, only the summation order differs, ~1e-6 on logits). Against the float
model itself the quantized answer differs by rounding only, and is not compared token for token: the tiny model's
second greedy token leads by 0.03 while int8 weights move its logits by up to 0.28 (measured; the MLPs' 12 MatMuls
carry most of it), a near tie either side may win. A decoder loop that cannot carry the states (the native TensorRT
one) is refused in one line at load.
"""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest

pytestmark = pytest.mark.slow
PROMPT = "What is written on the sign next to the red car?"
NEW = 4


def _dequantized(node, init) -> np.ndarray:
    """The float weight W [K, N] a MatMulNBits node (bits 4 or 8, asymmetric) holds: B uint8 [N, blocks, B * bits / 8]
    (4 bits: two per byte, the low nibble first), scales [N, blocks], zero points uint8 [N, blocks] (4 bits: packed
    as B)."""
    from onnx import helper, numpy_helper

    attr = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    k, n, bits, block = attr["K"], attr["N"], attr["bits"], attr["block_size"]
    packed = numpy_helper.to_array(init[node.input[1]])
    scales = numpy_helper.to_array(init[node.input[2]]).reshape(n, -1)
    zero = numpy_helper.to_array(init[node.input[3]]).reshape(n, -1)
    if bits == 4:
        packed = np.stack([packed & 15, packed >> 4], -1).reshape(n, packed.shape[1], -1)
        zero = np.stack([zero & 15, zero >> 4], -1).reshape(n, -1)
    blocks = packed.shape[1]
    q = packed.reshape(n, blocks, block).astype(np.float32)
    w = (q - zero[:, :blocks, None]) * scales[:, :blocks, None]
    return w.reshape(n, blocks * block)[:, :k].T.astype(np.float32)


def _with_weights_of(float_dir, quantized_dir, out):
    """A copy of the float engine dir whose decoder's MatMul weights are the quantized decoder's, dequantized."""
    d = shutil.copytree(float_dir, out)
    quantized = onnx.load(str(quantized_dir / "decoder.onnx"))
    init = {i.name: i for i in quantized.graph.initializer}
    weights = {node.output[0]: _dequantized(node, init) for node in quantized.graph.node
               if node.op_type == "MatMulNBits"}
    model = onnx.load(str(d / "decoder.onnx"))
    names = {node.input[1]: weights[node.output[0]] for node in model.graph.node
             if node.op_type == "MatMul" and node.output[0] in weights}
    assert len(names) == len(weights)
    for tensor in model.graph.initializer:
        if tensor.name in names:
            assert tuple(tensor.dims) == names[tensor.name].shape
            tensor.CopyFrom(onnx.numpy_helper.from_array(names[tensor.name], tensor.name))
    for f in d.glob("decoder.onnx*"):
        f.unlink()
    onnx.save(model, str(d / "decoder.onnx"), save_as_external_data=True, location="decoder.onnx.data")
    return d


@pytest.mark.parametrize("dtype", ["int4", "int8"])
def test_quantized_decoder_keeps_its_states(qwen35_export_ort, tmp_path, dtype):
    from coverpruner.engine_dir import load_manifest
    from coverpruner.export.quant import QuantOptions, quantize_engine_dir
    from coverpruner.runtime.pipeline import Pipeline
    from tests.families.qwen_common import sample_image

    d = shutil.copytree(qwen35_export_ort, tmp_path / "engine")
    quantize_engine_dir(d, QuantOptions(dtype=dtype, form="ort", block_size=32))
    model = onnx.load(str(d / "decoder.onnx"), load_external_data=False)
    before = load_manifest(qwen35_export_ort, verify=False).graphs["decoder"]
    after = load_manifest(d, verify=False).graphs["decoder"]
    assert (after.kv_layers, after.states) == (before.kv_layers, before.states)
    assert after.kv_layers == (3,) and [(s.name, s.layers) for s in after.states] == [("conv", (0, 1, 2)),
                                                                                       ("recurrent", (0, 1, 2))]
    assert {i.name for i in model.graph.input} >= {f"past_key_values.{i}.{s}" for i in (0, 1, 2)
                                                   for s in ("conv", "recurrent")}
    # 3 linear layers x (qkv, z|b|a packed, out, gate, up, down) + the full layer x (qkv, o, gate, up, down) + lm_head
    assert sum(n.op_type == "MatMulNBits" for n in model.graph.node) == 3 * 6 + 5 + 1

    image = sample_image(5, (300, 250))
    want = Pipeline.load(qwen35_export_ort).generate(image, PROMPT, budget=8, max_new_tokens=NEW, ignore_eos=True)
    got = Pipeline.load(d).generate(image, PROMPT, budget=8, max_new_tokens=NEW, ignore_eos=True)
    assert got.kept_indices.tolist() == want.kept_indices.tolist() and len(got.kept_indices) == 8
    assert len(got.token_ids) == NEW

    # the states carried as in the float graph: float compute of the quantized dir == the float graph holding the
    # same weights, token for token
    exact = shutil.copytree(qwen35_export_ort, tmp_path / "float_compute")
    quantize_engine_dir(exact, QuantOptions(dtype=dtype, form="ort", block_size=32, accuracy_level=1))
    same = _with_weights_of(qwen35_export_ort, exact, tmp_path / "same_weights")
    ref = Pipeline.load(same, verify=False).generate(image, PROMPT, budget=8, max_new_tokens=NEW, ignore_eos=True)
    out = Pipeline.load(exact).generate(image, PROMPT, budget=8, max_new_tokens=NEW, ignore_eos=True)
    assert out.token_ids == ref.token_ids and out.kept_indices.tolist() == want.kept_indices.tolist()


def test_a_decoder_loop_without_states_is_refused(qwen35_export):
    """A session factory whose decoder brings its own KV-only loop (as the native TensorRT sessions do) cannot run a
    decoder with states: Pipeline.load says so in one line instead of running without them."""
    from coverpruner.engines.ort import OrtSessionFactory
    from coverpruner.runtime.errors import OptionError
    from coverpruner.runtime.pipeline import Pipeline

    ort_factory = OrtSessionFactory("cpu", 1)

    class OwnLoop:  # an ORT session with a decoder_loop attribute, as TrtSession has
        def __init__(self, session):
            self.session = session

        def __getattr__(self, name):
            return getattr(self.session, name)

        def decoder_loop(self, *args):
            raise AssertionError("a decoder with states must not reach a KV-only loop")

    def factory(name, path):
        session = ort_factory(name, path)
        return OwnLoop(session) if name == "decoder" else session

    with pytest.raises(OptionError, match="carries state that is not KV") as info:
        Pipeline.load(qwen35_export, session_factory=factory)
    assert "\n" not in str(info.value)
