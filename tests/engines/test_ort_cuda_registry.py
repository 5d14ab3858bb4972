"""Can the ORT-form decoder (GroupQueryAttention over in-place KV slots: the form that batches requests) run on
ONNX Runtime's CUDA provider? Every node of the exported graph is checked against the CUDA provider's kernel
registry (data/ort_cuda_kernels.json: the rows of onnxruntime's docs/OperatorKernels.md, with the commit they were
read at) by domain, opset and element type.

Finding: in the fp32 export every op has a CUDA kernel except GroupQueryAttention -- the CUDA provider registers
it for float16 / bfloat16 only; on the CUDA provider ORT would run that node on the CPU, copying the whole KV cache
across PCIe each step. The fp16 ORT-form export (--dtype fp16 --decoder-form ort) has a CUDA kernel for every
node: checked on the exported graph itself, with each node's element type read from the graph (propagated from
its inputs and initializers), not assumed."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto

REGISTRY = json.loads((Path(__file__).parent / "data" / "ort_cuda_kernels.json").read_text())
FLOAT_TYPE = {"fp32": "float", "fp16": "float16"}


FLOAT_NAMES = {TensorProto.FLOAT: "float", TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16",
               TensorProto.DOUBLE: "double"}  # onnx element type -> the registry's type name


def node_float_types(model: onnx.ModelProto) -> dict[str, str]:
    """{node name: registry type name of its float inputs}, from the graph's declared inputs and initializers
    forward in node order (ONNX's own shape inference does not know the com.microsoft ops). Every node here keeps
    the type of its float inputs (the graph has no Cast); two float types meeting at one node is an error."""
    known = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    known.update({t.name: t.data_type for t in model.graph.initializer})
    out = {}
    for node in model.graph.node:
        types = {known[i] for i in node.input if i and known.get(i) in FLOAT_NAMES}
        assert len(types) == 1, f"{node.name}: float inputs of types {types}"
        (t,) = types
        out[node.name] = FLOAT_NAMES[t]
        known.update({o: t for o in node.output})
    return out


def cuda_gaps(model: onnx.ModelProto, float_type: str | None = None) -> list[str]:
    """One line per node kind without a CUDA kernel for its element type: `float_type` (onnx element type name,
    e.g. "float") for every node, or None: each node's own type from the graph (node_float_types)."""
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    own = node_float_types(model) if float_type is None else {}
    gaps = set()
    for node in model.graph.node:
        node_type = own.get(node.name, float_type)
        domain = node.domain or "ai.onnx"
        key = f"{domain}/{node.op_type}"
        row = REGISTRY["kernels"].get(key)
        assert row is not None, (f"{key} is not in data/ort_cuda_kernels.json: add its CUDAExecutionProvider row "
                                 f"from {REGISTRY['source']}")
        if opsets[domain] < row["since"]:
            gaps.add(f"{key}: opset {opsets[domain]} < {row['since']} of the CUDA kernel")
        elif node_type not in row["float_types"]:
            gaps.add(f"{key}: {node_type} not among the CUDA kernel's types {row['float_types']}")
    return sorted(gaps)


@pytest.fixture(scope="module")
def ort_form_decoder(builds):
    out = builds.export("tiny", form="ort")
    manifest = json.loads((out / "manifest.json").read_text())
    spec = manifest["graphs"]["decoder"]
    assert spec.get("form") == "ort"
    return onnx.load(str(out / spec["file"]), load_external_data=False), FLOAT_TYPE[manifest["precision"]]


@pytest.mark.slow
def test_only_float32_group_query_attention_lacks_a_cuda_kernel(ort_form_decoder):
    model, float_type = ort_form_decoder
    assert float_type == "float"
    assert cuda_gaps(model, float_type) == [
        "com.microsoft/GroupQueryAttention: float not among the CUDA kernel's types ['bfloat16', 'float16']"]


@pytest.mark.slow
def test_a_float16_ort_form_would_have_a_cuda_kernel_for_every_node(ort_form_decoder):
    model, _ = ort_form_decoder
    assert cuda_gaps(model, "float16") == []
    assert {n.op_type for n in model.graph.node} >= {"GroupQueryAttention", "SkipSimplifiedLayerNormalization"}


@pytest.mark.slow
def test_the_fp32_graph_read_node_by_node_has_the_same_single_gap(ort_form_decoder):
    model, _ = ort_form_decoder
    assert set(node_float_types(model).values()) == {"float"}
    assert cuda_gaps(model) == [
        "com.microsoft/GroupQueryAttention: float not among the CUDA kernel's types ['bfloat16', 'float16']"]


@pytest.mark.slow
def test_the_fp16_export_is_valid_onnx_with_a_cuda_kernel_for_every_node(ort_fp16_export):
    manifest = json.loads((ort_fp16_export / "manifest.json").read_text())
    spec = manifest["graphs"]["decoder"]
    assert manifest["precision"] == "fp16" and spec["form"] == "ort"
    path = ort_fp16_export / spec["file"]
    onnx.checker.check_model(str(path))  # by path: the weights are external data
    model = onnx.load(str(path), load_external_data=False)
    types = node_float_types(model)
    assert set(types.values()) == {"float16"}, sorted(set(types.values()))
    assert cuda_gaps(model) == []
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == manifest["dims"]["num_layers"] and all(types[n.name] == "float16" for n in gqa)
    io = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)}
    assert {io[n] for n in io if n.startswith(("past_key_values.", "present.", "rotary_c", "rotary_s"))} == {
        TensorProto.FLOAT16}
    assert io["inputs_embeds"] == io["logits"] == TensorProto.FLOAT16
    assert {t.data_type for t in model.graph.initializer if t.data_type in (TensorProto.FLOAT,
                                                                              TensorProto.FLOAT16)} == {
        TensorProto.FLOAT16}
