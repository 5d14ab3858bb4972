"""Compile checks of the CUDA sources for every default architecture of the CMakeLists (sm_80 ... sm_120),
the cuBLAS glue and the TensorRT plugin. They need no GPU; only a missing compiler (or headers, for the glue and
the plugin) skips."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from coverpruner.engines import native_build
from coverpruner.engines.native_build import CSRC_DIR

NVCC = native_build.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found ($CUDACXX, $CUDA_HOME/bin, PATH, "
                                                     "/usr/local/cuda/bin)")


def default_architectures(nvcc_version: tuple[int, int]) -> list[str]:
    """The CMakeLists default CUDA_ARCHITECTURES for this nvcc, read from the CMakeLists itself."""
    text = (CSRC_DIR / "CMakeLists.txt").read_text()
    branches = re.findall(r"(?:if|elseif)\(_nvcc_version VERSION_GREATER_EQUAL (\d+)\.(\d+)\)\s*"
                          r"set\(CMAKE_CUDA_ARCHITECTURES ([^)]*)\)", text)
    fallback = re.search(r"else\(\)\s*set\(CMAKE_CUDA_ARCHITECTURES ([^)]*)\)", text)
    assert branches and fallback, "CMakeLists.txt: default architecture branches not found"
    for major, minor, archs in branches:
        if nvcc_version >= (int(major), int(minor)):
            return archs.split()
    return fallback.group(1).split()


def nvcc_version() -> tuple[int, int]:
    out = subprocess.run([str(NVCC), "--version"], capture_output=True, text=True).stdout
    major, minor = re.search(r"release (\d+)\.(\d+)", out).groups()
    return int(major), int(minor)


def test_default_architectures_cover_the_targets():
    """Ampere to Blackwell and Thor with CUDA 13; PTX (a virtual architecture) only for the newest."""
    archs = default_architectures((13, 0))
    assert [a.split("-")[0] for a in archs] == ["80", "86", "87", "89", "90", "100", "110", "120"]
    assert all(a.endswith("-real") for a in archs[:-1]) and archs[-1] == "120"
    assert "110-real" not in default_architectures((12, 8)) and default_architectures((12, 6))[-1] == "90"


@needs_nvcc
def test_kernels_compile_for_every_default_architecture(tmp_path):
    """One nvcc run for the whole default list (what CMake builds), with spills as errors."""
    archs = default_architectures(nvcc_version())
    gencode = []
    for a in archs:
        num = a.split("-")[0]
        code = f"sm_{num}" if a.endswith("-real") else f"[sm_{num},compute_{num}]"
        gencode += ["-gencode", f"arch=compute_{num},code={code}"]
    obj = tmp_path / "coverage_select.o"
    cmd = [str(NVCC), "-c", "-std=c++17", "--threads", "0", f"-I{CSRC_DIR / 'include'}", f"-I{CSRC_DIR / 'kernels'}",
           *gencode, "-Xptxas", "-warn-spills", "-Werror", "all-warnings",
           str(CSRC_DIR / "kernels" / "coverage_select.cu"), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert obj.stat().st_size > 0
    cuobjdump = shutil.which("cuobjdump")  # not in every toolkit install; the compile itself is the check
    if cuobjdump:
        listing = subprocess.run([cuobjdump, "--list-elf", str(obj)], capture_output=True, text=True).stdout
        for a in archs:
            assert f"sm_{a.split('-')[0]}" in listing, listing  # the object really holds SASS for each one


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
