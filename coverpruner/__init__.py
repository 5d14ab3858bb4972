"""CoverPruner: visual-token pruning by Representational Coverage Maximization, deployed on ONNX/TensorRT."""

__version__ = "0.1.0"
