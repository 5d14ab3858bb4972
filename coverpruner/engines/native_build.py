"""Find the toolchain for coverpruner/engines/csrc and build it with CMake.

Used by `coverpruner-build --plugin auto`, by the CUDA selector wrapper (cuda_selector.py) and by the tests.
Search order for each piece (first hit wins):
- nvcc: $CUDACXX, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin.
- cuBLAS headers: the CUDA toolkit's include/, $CUBLAS_INCLUDE_DIR, then pip's nvidia-cublas
  (site-packages/nvidia/cu*/include, the wheel that ships cublas_v2.h without a full toolkit).
- TensorRT headers: $TENSORRT_ROOT/include, JetPack's /usr/include/aarch64-linux-gnu, x86 debs'
  /usr/include/x86_64-linux-gnu, /usr/include.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CSRC_DIR = Path(__file__).resolve().parent / "csrc"
SELECTOR_LIB = "libcoverpruner_selector.so"
PLUGIN_LIB = "libcoverpruner_trt_plugin.so"


class NativeBuildError(RuntimeError):
    """CMake configure/build failed; the message carries the tool's output tail."""


def find_nvcc() -> Path | None:
    candidates = [os.environ.get("CUDACXX")]
    if os.environ.get("CUDA_HOME"):
        candidates.append(str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"))
    candidates += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    return None


def find_cuda_include() -> Path | None:
    """The CUDA toolkit's include/ (cuda_runtime_api.h): $CUDA_HOME, next to the real nvcc, /usr/local/cuda."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "include")
    nvcc = find_nvcc()
    if nvcc is not None:
        candidates.append(nvcc.resolve().parent.parent / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    for c in candidates:
        if (c / "cuda_runtime_api.h").is_file():
            return c
    return None


def site_dirs() -> list[Path]:
    """The site-packages directories of this interpreter (where pip's nvidia-* wheels put their libraries)."""
    dirs = [Path(p) for p in sys.path if p.endswith("site-packages")]
    try:
        dirs += [Path(p) for p in site.getsitepackages()]
    except AttributeError:  # some virtualenv layouts
        pass
    seen, out = set(), []
    for d in dirs:
        if d not in seen and d.is_dir():
            seen.add(d)
            out.append(d)
    return out


def nvidia_dirs() -> list[Path]:
    """The `nvidia` package directories pip's CUDA wheels install into (site-packages/nvidia, and wherever else
    the `nvidia` namespace package has a part, e.g. a `pip install --target` dir on sys.path)."""
    out = [sp / "nvidia" for sp in site_dirs() if (sp / "nvidia").is_dir()]
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        if Path(loc).is_dir() and Path(loc) not in out:
            out.append(Path(loc))
    return out


def find_cublas() -> tuple[Path | None, Path | None]:
    """(directory of cublas_v2.h, libcublas.so* path or None). The library is None when the toolkit's own
    should be linked (CMake's CUDA::cublas finds it)."""
    toolkit_include = find_cuda_include()
    if toolkit_include is not None and (toolkit_include / "cublas_v2.h").is_file():
        return toolkit_include, None
    env = os.environ.get("CUBLAS_INCLUDE_DIR")
    if env and (Path(env) / "cublas_v2.h").is_file():
        return Path(env), None
    for nv in nvidia_dirs():
        for inc in sorted(nv.glob("cu*/include"), reverse=True) + [nv / "cublas" / "include"]:
            if (inc / "cublas_v2.h").is_file():
                libs = sorted(inc.parent.glob("lib/libcublas.so*"))
                return inc, (libs[0] if libs else None)
    return None, None


def preload_cublas() -> None:
    """Loads libcublas (RTLD_GLOBAL) before the selector or plugin library is opened, so their NEEDED
    libcublas.so.N resolves by soname also where cuBLAS comes from pip's nvidia-cublas wheel, whose lib/ is on no
    loader path (the libraries carry no RUNPATH to a build or site-packages dir, so an engine dir can travel).
    A cuBLAS the loader finds by itself is preferred; failures are left to the library's own load error."""
    _, lib = find_cublas()
    if lib is None:
        return
    for name in (lib.name, str(lib)):
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            return
        except OSError:
            continue


def find_tensorrt_include() -> Path | None:
    roots = []
    if os.environ.get("TENSORRT_ROOT"):
        roots.append(Path(os.environ["TENSORRT_ROOT"]) / "include")
    roots += [Path("/usr/include/aarch64-linux-gnu"), Path("/usr/include/x86_64-linux-gnu"), Path("/usr/include")]
    for r in roots:
        if (r / "NvInferRuntime.h").is_file():
            return r
    return None


@dataclass
class NativeLibs:
    build_dir: Path
    selector: Path | None  # libcoverpruner_selector.so
    plugin: Path | None  # libcoverpruner_trt_plugin.so (only where TensorRT headers were found)


def cmake_version() -> tuple[int, ...] | None:
    """(major, minor, patch) of the cmake on PATH, or None."""
    if shutil.which("cmake") is None:
        return None
    out = subprocess.run(["cmake", "--version"], capture_output=True, text=True).stdout
    match = re.search(r"version (\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(g or 0) for g in match.groups()) if match else None


def native_architecture(compute_capability: str | None) -> str | None:
    """CMAKE_CUDA_ARCHITECTURES for "this machine's GPU": `native` where CMake understands it (>= 3.24),
    else the device's compute capability ("8.7" -> "87"; Ubuntu 22.04 and JetPack 6 ship CMake 3.22)."""
    version = cmake_version()
    if version is not None and version >= (3, 24):
        return "native"
    return compute_capability.replace(".", "") if compute_capability else None


def build_native(build_dir: str | Path, cuda_architectures: str | None = None, with_cuda: bool = True,
                 tensorrt_root: str | Path | None = None, jobs: int = 2) -> NativeLibs:
    """Configure and build csrc/ into build_dir (incremental). Returns the libraries that were built.

    cuda_architectures: CMAKE_CUDA_ARCHITECTURES ("87", "87;90", "native" with CMake >= 3.24); None: the
    CMakeLists default (sm_80 ... sm_120 as far as this nvcc supports them, PTX for the newest)."""
    build_dir = Path(build_dir)
    if shutil.which("cmake") is None:
        raise NativeBuildError("cmake not found on PATH (needed to build coverpruner/engines/csrc)")
    args = ["cmake", "-S", str(CSRC_DIR), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
            f"-DCOVERPRUNER_WITH_CUDA={'ON' if with_cuda else 'OFF'}"]
    if with_cuda:
        nvcc = find_nvcc()
        if nvcc is None:
            raise NativeBuildError("nvcc not found ($CUDACXX, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin)")
        args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        if cuda_architectures:
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={cuda_architectures}")
        inc, lib = find_cublas()
        if inc is None:
            raise NativeBuildError("cublas_v2.h not found: install the CUDA toolkit's cuBLAS or "
                                   "`pip install nvidia-cublas`, or set CUBLAS_INCLUDE_DIR")
        args.append(f"-DCUBLAS_INCLUDE_DIR={inc}")
        if lib is not None:
            args.append(f"-DCUBLAS_LIBRARY={lib}")
    if tensorrt_root is not None:
        args.append(f"-DTENSORRT_ROOT={tensorrt_root}")
    for cmd in (args, ["cmake", "--build", str(build_dir), "-j", str(jobs)]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-4000:]
            raise NativeBuildError(f"{' '.join(cmd[:3])} failed (exit {proc.returncode}):\n{tail}")
    sel, plug = build_dir / SELECTOR_LIB, build_dir / PLUGIN_LIB
    return NativeLibs(build_dir, sel if sel.is_file() else None, plug if plug.is_file() else None)
