"""Fixtures for the engines tests: native builds of coverpruner/engines/csrc and tool probes."""

from __future__ import annotations

import os

import pytest

from coverpruner.engines import native_build


def _cuda_gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


GPU_AVAILABLE = _cuda_gpu_available()
requires_gpu = pytest.mark.skipif(not GPU_AVAILABLE, reason="no CUDA GPU: torch.cuda.is_available() is False")


@pytest.fixture(scope="session")
def native_libs(tmp_path_factory):
    """libcoverpruner_selector.so (and the TensorRT plugin where headers exist), built once per session.

    Architectures: $COVERPRUNER_CUDA_ARCHS, else `native` on a GPU machine, else 87 (one arch keeps CI fast;
    the sm_87/sm_90 compile checks live in test_nvcc_compile.py).
    """
    if native_build.find_nvcc() is None:
        pytest.skip("nvcc not found ($CUDACXX, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin)")
    if native_build.find_cublas()[0] is None:
        pytest.skip("cublas_v2.h not found (CUDA toolkit, $CUBLAS_INCLUDE_DIR or `pip install nvidia-cublas`)")
    archs = os.environ.get("COVERPRUNER_CUDA_ARCHS") or ("native" if GPU_AVAILABLE else "87")
    build_dir = tmp_path_factory.mktemp("csrc_build")
    return native_build.build_native(build_dir, cuda_architectures=archs)
