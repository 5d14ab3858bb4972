"""Fixtures for the engines tests: native builds of coverpruner/engines/csrc, tool probes, and GPU gates.

Each GPU test is gated on what it really uses, with a skip reason naming the missing piece: a usable CUDA
device through libcudart (coverpruner.engines.cudart, no torch: what TensorRT sessions run on), TensorRT's
python module, or torch built with CUDA (only the tests that hand CUDA tensors to the kernel). A GPU machine
with the CPU torch wheel (the README's install) still runs the TensorRT engine tests.
"""

from __future__ import annotations

import os

import pytest

from coverpruner.engines import native_build
from coverpruner.engines.cudart import device_problem


def _torch_cuda_problem() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build (no CUDA)"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable GPU"
    return None


def _tensorrt_problem() -> str | None:
    from coverpruner.engines.tensorrt import TensorRTBuildError, load_tensorrt

    try:
        load_tensorrt()
    except TensorRTBuildError as exc:
        return str(exc)
    return None


CUDA_PROBLEM = device_problem()
GPU_AVAILABLE = CUDA_PROBLEM is None
requires_gpu = pytest.mark.skipif(not GPU_AVAILABLE, reason=f"no usable CUDA GPU: {CUDA_PROBLEM}")
_TORCH_CUDA_PROBLEM = _torch_cuda_problem()
requires_torch_cuda = pytest.mark.skipif(_TORCH_CUDA_PROBLEM is not None,
                                         reason=f"needs torch with CUDA: {_TORCH_CUDA_PROBLEM}")
_TENSORRT_PROBLEM = _tensorrt_problem()
requires_tensorrt = pytest.mark.skipif(_TENSORRT_PROBLEM is not None, reason=f"needs TensorRT: {_TENSORRT_PROBLEM}")


@pytest.fixture(scope="session")
def native_libs(tmp_path_factory):
    """libcoverpruner_selector.so (and the TensorRT plugin where headers exist), built once per session.

    Architectures: $COVERPRUNER_CUDA_ARCHS, else this machine's GPU on a GPU machine (`native` with CMake >= 3.24,
    the detected compute capability with older CMake), else 87 (one arch keeps CI fast; the compile checks of
    every default architecture live in test_nvcc_compile.py).
    """
    if native_build.find_nvcc() is None:
        pytest.skip("nvcc not found ($CUDACXX, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin)")
    if native_build.find_cublas()[0] is None:
        pytest.skip("cublas_v2.h not found (CUDA toolkit, $CUBLAS_INCLUDE_DIR or `pip install nvidia-cublas`)")
    archs = os.environ.get("COVERPRUNER_CUDA_ARCHS") or "87"
    if not os.environ.get("COVERPRUNER_CUDA_ARCHS") and GPU_AVAILABLE:
        from coverpruner.engines.tensorrt import detect_compute_capability

        archs = native_build.native_architecture(detect_compute_capability()) or archs
    build_dir = tmp_path_factory.mktemp("csrc_build")
    return native_build.build_native(build_dir, cuda_architectures=archs)


@pytest.fixture(scope="session")
def ort_fp16_export(builds, tmp_path_factory):
    """The tiny preset exported in fp16 with the ORT-form decoder (--dtype fp16 --decoder-form ort: the form ORT's
    CUDA provider batches with); no selector graph (the numpy selector runs), as tests/runtime/test_fp16.py."""
    pytest.importorskip("torch")
    from coverpruner.export.exporter import ExportOptions, export_model

    def make():
        out = tmp_path_factory.mktemp("tiny_fp16_ort")
        export_model(builds.checkpoint("tiny"), out, "tiny",
                     ExportOptions(dtype="fp16", decoder_form="ort", graphs=("vision", "embed", "probe", "decoder"),
                                   progress=False))
        return out

    return builds.memo(("tiny", "fp16", "ort"), make)
