"""Qwen3.5 on engine paths beyond the family matrix. int4 / int8 decoders (ORT form, MatMulNBits): every linear
projection of both layer kinds is quantized (a Gated DeltaNet layer's in_proj_qkv / z / a / b and out_proj, a full
layer's packed QKV and o, the MLPs, the lm_head) while the states and their manifest record stay as exported, and the
pipeline on the quantized dir keeps the float engine's rows (vision and probe stay float) and answers with the 8-bit
decoder as the float one does. A decoder loop that cannot carry the states (the native TensorRT one) is refused in
one line at load.
"""

from __future__ import annotations

import shutil

import onnx
import pytest

pytestmark = pytest.mark.slow
PROMPT = "What is written on the sign next to the red car?"
NEW = 4


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
    # 3 linear layers x (qkv, z, a, b, out, gate, up, down) + the full layer x (qkv, o, gate, up, down) + lm_head
    assert sum(n.op_type == "MatMulNBits" for n in model.graph.node) == 3 * 8 + 5 + 1

    image = sample_image(5, (300, 250))
    want = Pipeline.load(qwen35_export_ort).generate(image, PROMPT, budget=8, max_new_tokens=NEW, ignore_eos=True)
    got = Pipeline.load(d).generate(image, PROMPT, budget=8, max_new_tokens=NEW, ignore_eos=True)
    assert got.kept_indices.tolist() == want.kept_indices.tolist() and len(got.kept_indices) == 8
    assert len(got.token_ids) == NEW
    if dtype == "int8":  # 8-bit weights of a 64-wide random model: the greedy answer holds
        assert got.token_ids == want.token_ids


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
