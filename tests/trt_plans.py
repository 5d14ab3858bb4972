"""TensorRT-RTX helpers shared by the tests that build engines on a CPU (no GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest


def load_trt_rtx():
    """The TensorRT-RTX module (coverpruner.engines.tensorrt.TrtModule), or a skip naming what to install."""
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX python bindings are not installed "
                                               "(pip install tensorrt-rtx-cu13 tensorrt-rtx-cu13-libs "
                                               "tensorrt-rtx-cu13-bindings)")
    from coverpruner.engines.tensorrt import load_tensorrt

    return load_tensorrt("tensorrt_rtx")


def is_trt_rtx_plan(plan: bytes | Path) -> bool:
    """A serialized TensorRT-RTX 1.7 engine: it starts with the magic b"vtrt" and the little-endian uint64 at byte
    16 is the plan's own length (observed on plans this TensorRT-RTX writes; deserializing needs a CUDA GPU)."""
    blob = plan.read_bytes() if isinstance(plan, Path) else plan
    return blob[:4] == b"vtrt" and int.from_bytes(blob[16:24], "little") == len(blob)
