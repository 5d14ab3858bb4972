"""ONNX Runtime form of weight-only quantization: onnxruntime's own MatMulNBitsQuantizer (round-to-nearest,
block-wise along K, asymmetric with zero points as its default) turns each chosen MatMul into one
com.microsoft MatMulNBits node holding packed 4- or 8-bit weights [N, ceil(K/B), B*bits/8] uint8, scales
[N*ceil(K/B)] in the graph's float dtype and zero points. ORT's CPU (and CUDA / DML) kernels run it.
"""

from __future__ import annotations

import logging

import onnx


def quiet_quantizer_log() -> None:
    """ORT's quantizer warns that raising the opset to 21 'may not be a valid model'; the pass runs onnx.checker
    on every graph it writes instead, so only errors are shown."""
    logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)


def quantize_graph_nbits(model: onnx.ModelProto, targets: set[str], bits: int, block_size: int,
                         accuracy_level: int | None) -> onnx.ModelProto:
    """The quantized model (ORT's quantizer rewrites a copy's graph); MatMuls not in `targets` stay float.

    accuracy_level: MatMulNBits' compute type for activations (None/0: the input type, 1 fp32, 2 fp16,
    3 bf16, 4 int8); it is recorded in the node, so the runtime needs no option.
    """
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    others = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in targets]
    quiet_quantizer_log()
    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=False,
                                     accuracy_level=accuracy_level, nodes_to_exclude=others,
                                     quant_format=QuantFormat.QOperator, op_types_to_quantize=("MatMul",))
    quantizer.process()
    return quantizer.model.model
