"""TensorRT form of weight-only quantization: block-wise DequantizeLinear weights feeding the unchanged MatMul.

    x ─────────────────────────────► MatMul ─► y
    W_q int4|int8 [K,N] ─┐             ▲
    scale float [ceil(K/B),N] ─► DequantizeLinear(axis=0, block_size=B)

What TensorRT's ONNX parser takes for weight-only INT4/INT8 (and what ONNX Runtime's CPU kernels run): opset
>= 21 (block_size attribute and the int4 type), symmetric (no zero point), blocks along K (axis 0), scales in
the graph's float dtype. onnxruntime's own QDQ path (MatMulNBitsQuantizer, QuantFormat.QDQ) only writes 4
bits, so both widths are written here with the same layout; the ORT form (MatMulNBits) is ort_nbits.py.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

QDQ_OPSET = 21
_QTYPES = {4: (TensorProto.INT4, 7), 8: (TensorProto.INT8, 127)}


def quantize_blocks(w: np.ndarray, bits: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric round-to-nearest per block of `block_size` rows of each column.

    w: float [K, N] -> (q int8 [K, N] with values in [-qmax, qmax], scale float32 [ceil(K/B), N]) such that
    w ≈ q * repeat(scale, B, axis=0)[:K]. qmax = 7 (int4; -8 is left unused so the grid is symmetric) or 127.
    """
    _, qmax = _QTYPES[bits]
    k, n = w.shape
    blocks = -(-k // block_size)
    padded = np.zeros((blocks * block_size, n), np.float32)
    padded[:k] = w
    absmax = np.abs(padded.reshape(blocks, block_size, n)).max(axis=1)  # [blocks, N]
    scale = (absmax / qmax).astype(np.float32)
    safe = np.where(scale == 0, 1.0, scale)  # an all-zero block quantizes to 0 with any scale
    q = np.rint(padded.reshape(blocks, block_size, n) / safe[:, None, :]).clip(-qmax, qmax)
    return q.reshape(-1, n)[:k].astype(np.int8), scale


def pack_int4(q: np.ndarray) -> bytes:
    """ONNX int4 raw data: two's-complement nibbles, element 2i in the low half of byte i (row-major)."""
    flat = q.ravel().astype(np.uint8) & 0x0F
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8).tobytes()


def dequantize_blocks(q: np.ndarray, scale: np.ndarray, block_size: int) -> np.ndarray:
    """Inverse of quantize_blocks: float32 [K, N] (what DequantizeLinear computes)."""
    return q.astype(np.float32) * np.repeat(scale, block_size, axis=0)[: q.shape[0]]


def rewrite_matmul(node: onnx.NodeProto, weight: onnx.TensorProto, bits: int,
                   block_size: int) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes [DequantizeLinear, MatMul] and initializers [W_q, scale] replacing `node` (MatMul x, W)."""
    qtype, _ = _QTYPES[bits]
    w = numpy_helper.to_array(weight)
    q, scale = quantize_blocks(w.astype(np.float32), bits, block_size)
    base = weight.name
    wq = (helper.make_tensor(f"{base}_q{bits}", qtype, q.shape, pack_int4(q), raw=True) if bits == 4
          else numpy_helper.from_array(q, f"{base}_q{bits}"))
    sc = numpy_helper.from_array(scale.astype(w.dtype), f"{base}_scale")
    deq = f"{base}_dq"
    nodes = [helper.make_node("DequantizeLinear", [wq.name, sc.name], [deq], name=f"{node.name}_dq{bits}",
                              axis=0, block_size=block_size),
             helper.make_node("MatMul", [node.input[0], deq], list(node.output), name=node.name)]
    return nodes, [wq, sc]


def quantize_graph_qdq(model: onnx.ModelProto, targets: set[str], bits: int, block_size: int) -> int:
    """Rewrite, in place, every MatMul named in `targets` (weight = 2-D float initializer) to DQ + MatMul and
    drop the float weights. Raises the default-domain opset to 21. Returns the number of rewritten MatMuls."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    new_nodes, new_inits, dropped = [], [], set()
    for node in graph.node:
        if node.name in targets:
            nodes, tensors = rewrite_matmul(node, inits[node.input[1]], bits, block_size)
            new_nodes.extend(nodes)
            new_inits.extend(tensors)
            dropped.add(node.input[1])
        else:
            new_nodes.append(node)
    still_used = {i for n in new_nodes for i in n.input}
    keep = [t for t in graph.initializer if t.name not in dropped or t.name in still_used]
    graph.ClearField("node")
    graph.node.extend(new_nodes)
    graph.ClearField("initializer")
    graph.initializer.extend(keep + new_inits)
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx") and op.version < QDQ_OPSET:
            op.version = QDQ_OPSET  # opsets 19-21 only widened types of the ops the exporter emits
    return len(targets)
