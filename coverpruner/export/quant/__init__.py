"""Weight-only INT4/INT8 quantization of an engine dir: ONNX Runtime form (MatMulNBits) and TensorRT form
(block-wise DequantizeLinear + MatMul). See quantize_dir.py and docs/quantization.md."""

from coverpruner.export.quant.quantize_dir import (
    BLOCK_SIZES,
    WEIGHT_BITS,
    FORMATS,
    QUANT_GRAPHS,
    QuantizeError,
    QuantOptions,
    QuantResult,
    quantize_engine_dir,
    quantized_ops,
)

__all__ = ["BLOCK_SIZES", "WEIGHT_BITS", "FORMATS", "QUANT_GRAPHS", "QuantOptions", "QuantResult", "QuantizeError",
           "quantize_engine_dir", "quantized_ops"]
