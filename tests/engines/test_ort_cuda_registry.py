"""Can the ORT-form decoder (GroupQueryAttention over in-place KV slots: the form that batches requests) run on
ONNX Runtime's CUDA provider? Every node of the exported graph is checked against the CUDA provider's kernel
registry (data/ort_cuda_kernels.json: the rows of onnxruntime's docs/OperatorKernels.md, with the commit they were
read at) by domain, opset and element type.

Finding: every op has a CUDA kernel except GroupQueryAttention in float32 -- the CUDA provider registers it for
float16 / bfloat16 only, and the ORT form is exported in float32 only (export/exporter.py decoder_form_for). On
the CUDA provider ORT would run that node on the CPU, copying the whole KV cache across PCIe each step, so
`--max-batch` > 1 on a GPU needs an fp16 ORT-form export first; with float16 tensors the same graph has a CUDA
kernel for every node (second test)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

REGISTRY = json.loads((Path(__file__).parent / "data" / "ort_cuda_kernels.json").read_text())
FLOAT_TYPE = {"fp32": "float", "fp16": "float16"}


def cuda_gaps(model: onnx.ModelProto, float_type: str) -> list[str]:
    """One line per node kind without a CUDA kernel for `float_type` (onnx element type name, e.g. "float")."""
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    gaps = set()
    for node in model.graph.node:
        domain = node.domain or "ai.onnx"
        key = f"{domain}/{node.op_type}"
        row = REGISTRY["kernels"].get(key)
        assert row is not None, (f"{key} is not in data/ort_cuda_kernels.json: add its CUDAExecutionProvider row "
                                 f"from {REGISTRY['source']}")
        if opsets[domain] < row["since"]:
            gaps.add(f"{key}: opset {opsets[domain]} < {row['since']} of the CUDA kernel")
        elif float_type not in row["float_types"]:
            gaps.add(f"{key}: {float_type} not among the CUDA kernel's types {row['float_types']}")
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
