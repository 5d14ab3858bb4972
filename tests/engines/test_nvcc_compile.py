"""Compile checks of the CUDA sources for Jetson Orin (sm_87) and H100 (sm_90), the cuBLAS glue and the
TensorRT plugin. They need no GPU; only a missing compiler (or headers, for the glue and the plugin) skips."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from coverpruner.engines import native_build
from coverpruner.engines.native_build import CSRC_DIR

NVCC = native_build.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found ($CUDACXX, $CUDA_HOME/bin, PATH, "
                                                     "/usr/local/cuda/bin)")


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_87", "sm_90"])
def test_kernels_compile_for(arch, tmp_path):
    obj = tmp_path / f"coverage_select_{arch}.o"
    cmd = [str(NVCC), "-c", "-std=c++17", f"-I{CSRC_DIR / 'include'}", f"-I{CSRC_DIR / 'kernels'}",
           f"-arch={arch}", "-Xptxas", "-warn-spills", "-Werror", "all-warnings",
           str(CSRC_DIR / "kernels" / "coverage_select.cu"), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert obj.stat().st_size > 0
    cuobjdump = shutil.which("cuobjdump")  # not in every toolkit install; the compile itself is the check
    if cuobjdump:
        listing = subprocess.run([cuobjdump, "--list-elf", str(obj)], capture_output=True, text=True).stdout
        assert arch in listing, listing  # the object really holds SASS for this architecture


@needs_nvcc
def test_cublas_glue_compiles(tmp_path):
    include, _ = native_build.find_cublas()
    if include is None:
        pytest.skip("cublas_v2.h not found (CUDA toolkit, $CUBLAS_INCLUDE_DIR or `pip install nvidia-cublas`)")
    cuda_include = native_build.find_cuda_include()
    assert cuda_include is not None, "nvcc was found but not the toolkit's cuda_runtime_api.h; set CUDA_HOME"
    cmd = ["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-c", f"-I{CSRC_DIR / 'include'}",
           f"-I{cuda_include}", f"-I{include}", str(CSRC_DIR / "kernels" / "similarity_gemm.cpp"),
           "-o", str(tmp_path / "similarity_gemm.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


@needs_nvcc
def test_tensorrt_plugin_compiles(tmp_path):
    trt_include = native_build.find_tensorrt_include()
    if trt_include is None:
        pytest.skip("TensorRT headers (NvInferRuntime.h) not found: set TENSORRT_ROOT; no pip wheel ships them")
    cuda_include = native_build.find_cuda_include()
    assert cuda_include is not None, "nvcc was found but not the toolkit's cuda_runtime_api.h; set CUDA_HOME"
    cmd = ["g++", "-std=c++17", "-Wall", "-Wextra", "-fsyntax-only", f"-I{CSRC_DIR / 'include'}",
           f"-I{CSRC_DIR / 'plugin'}", "-isystem", str(trt_include), "-isystem", str(cuda_include),
           str(CSRC_DIR / "plugin" / "coverage_selector_plugin.cpp")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr, proc.stderr
