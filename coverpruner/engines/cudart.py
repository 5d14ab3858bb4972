"""The few CUDA runtime calls a TensorRT session needs (device buffers, copies, a stream), through ctypes.

No torch, cupy or cuda-python: libcudart ships with every CUDA/TensorRT install, and the runtime package must
stay torch-free. Every call checks its cudaError_t and raises CudaError with CUDA's own message.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

_H2D, _D2H, _D2D = 1, 2, 3  # cudaMemcpyKind


class CudaError(RuntimeError):
    """A CUDA runtime call failed (message from cudaGetErrorString) or libcudart is missing."""


_LIB: ctypes.CDLL | None = None
_LIB_PATH: str | None = None
_INSUFFICIENT_DRIVER = 35  # cudaErrorInsufficientDriver: this libcudart is newer than the driver (or no driver)
SONAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12")
TOOLKIT_ROOTS = (Path("/usr/local/cuda"),)  # after $CUDA_HOME; JetPack installs CUDA there too


def cudart_candidates() -> list[str]:
    """Where libcudart may be, in the order tried: $COVERPRUNER_CUDART alone when set; else the loader's sonames
    (a library already loaded by TensorRT or onnxruntime-gpu, or one on the loader path), pip's CUDA runtime
    wheels (site-packages/nvidia/cu13/lib from `nvidia-cuda-runtime` 13, nvidia/cuda_runtime/lib from
    `nvidia-cuda-runtime-cu12`: what torch and onnxruntime-gpu bring, on no loader path), then the toolkit
    ($CUDA_HOME, /usr/local/cuda: lib64, lib, targets/*/lib; JetPack's CUDA is there too)."""
    if os.environ.get("COVERPRUNER_CUDART"):
        return [os.environ["COVERPRUNER_CUDART"]]
    from .native_build import nvidia_dirs  # no import cycle: native_build needs nothing from here

    found: list[Path] = []
    for nv in nvidia_dirs():
        found += sorted(nv.glob("*/lib/libcudart.so.*[0-9]"), key=lambda p: p.name, reverse=True)
    roots = [Path(os.environ["CUDA_HOME"])] if os.environ.get("CUDA_HOME") else []
    for root in [*roots, *TOOLKIT_ROOTS]:
        for lib_dir in [root / "lib64", root / "lib", *sorted(root.glob("targets/*/lib"))]:
            found += sorted(lib_dir.glob("libcudart.so.*[0-9]"), key=lambda p: p.name, reverse=True)
    paths: dict[Path, str] = {}  # one entry per real file, first place kept
    for path in found:
        paths.setdefault(path.resolve(), str(path))
    return [*SONAMES, *paths.values()]


def cudart() -> ctypes.CDLL:
    """libcudart, loaded once (see cudart_candidates). The first candidate that loads and is not too new for the
    driver wins (a CUDA 13 runtime from pip beside a CUDA 12 driver answers cudaErrorInsufficientDriver, a CUDA
    12 runtime from the toolkit works); with none of them usable, the first that loads (device_problem then
    says why)."""
    global _LIB, _LIB_PATH
    if _LIB is not None:
        return _LIB
    errors, fallback = [], None
    for name in cudart_candidates():
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
            continue
        fallback = fallback or (lib, name)
        count = ctypes.c_int(0)
        if lib.cudaGetDeviceCount(ctypes.byref(count)) != _INSUFFICIENT_DRIVER:
            fallback = (lib, name)
            break
    if fallback is None:
        raise CudaError("libcudart not found (tried " + "; ".join(errors) + "); install the CUDA runtime "
                        "(`pip install nvidia-cuda-runtime`, the CUDA toolkit or JetPack) or set COVERPRUNER_CUDART")
    lib, _LIB_PATH = fallback
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudaMemcpy2DAsync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                      ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudaMemsetAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
    lib.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    lib.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
    _LIB = lib
    return lib


def cudart_path() -> str | None:
    """The file (or soname) libcudart was loaded from; None before cudart() loaded it."""
    return _LIB_PATH


def runtime_version() -> str | None:
    """"13.0"-style version of the loaded libcudart (cudaRuntimeGetVersion), None when it cannot say."""
    v = ctypes.c_int(0)
    if cudart().cudaRuntimeGetVersion(ctypes.byref(v)) != 0 or not v.value:
        return None
    return f"{v.value // 1000}.{v.value % 1000 // 10}"


def _driver_library() -> str | None:
    """None when the NVIDIA driver's libcuda.so.1 loads; otherwise the loader's message."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return str(exc)
    return None


def device_problem() -> str | None:
    """None when CUDA device 0 is usable through libcudart; otherwise one line naming what is missing: the
    runtime library, the driver, or a device. Needs no torch: this is what the TensorRT sessions run on."""
    try:
        lib = cudart()
    except CudaError as exc:
        return str(exc)
    count = ctypes.c_int(0)
    status = lib.cudaGetDeviceCount(ctypes.byref(count))
    where = f"libcudart {runtime_version() or '?'} ({_LIB_PATH})"
    if status != 0:
        said = f"{where}: cudaGetDeviceCount: CUDA error {status} ({lib.cudaGetErrorString(status).decode()})"
        missing = _driver_library()
        if missing is not None:
            return f"no CUDA device: the NVIDIA driver is not installed ({missing}); {said}"
        return f"no usable CUDA device: {said}"
    if count.value < 1:
        return f"no CUDA device: {where} found none"
    return None


def compute_capability() -> str | None:
    """"major.minor" of CUDA device 0, None without a usable device."""
    if device_problem() is not None:
        return None
    lib = cudart()
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    # cudaDevAttrComputeCapabilityMajor = 75, ...Minor = 76
    if lib.cudaDeviceGetAttribute(ctypes.byref(major), 75, 0) != 0:
        return None
    if lib.cudaDeviceGetAttribute(ctypes.byref(minor), 76, 0) != 0:
        return None
    return f"{major.value}.{minor.value}"


def check(status: int, what: str) -> None:
    if status != 0:
        msg = cudart().cudaGetErrorString(status).decode()
        raise CudaError(f"{what}: CUDA error {status} ({msg})")


class Stream:
    """A CUDA stream owned by this object; `handle` is the cudaStream_t as an int."""

    def __init__(self):
        s = ctypes.c_void_p()
        check(cudart().cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
        self.handle = s.value or 0

    def synchronize(self) -> None:
        check(cudart().cudaStreamSynchronize(self.handle), "cudaStreamSynchronize")

    def __del__(self):
        if getattr(self, "handle", 0) and _LIB is not None:
            _LIB.cudaStreamDestroy(self.handle)
            self.handle = 0


class DeviceBuffer:
    """cudaMalloc'd bytes; grows (never shrinks) with `ensure`."""

    def __init__(self, nbytes: int = 0):
        self.ptr = 0
        self.nbytes = 0
        self.ensure(nbytes)

    def ensure(self, nbytes: int) -> int:
        """At least nbytes (at least 1: TensorRT wants a non-null address even for empty tensors)."""
        nbytes = max(int(nbytes), 1)
        if nbytes > self.nbytes:
            self.free()
            p = ctypes.c_void_p()
            check(cudart().cudaMalloc(ctypes.byref(p), nbytes), f"cudaMalloc({nbytes})")
            self.ptr, self.nbytes = p.value or 0, nbytes
        return self.ptr

    def upload(self, array: np.ndarray, stream: Stream) -> None:
        array = np.ascontiguousarray(array)
        self.ensure(array.nbytes)
        if array.nbytes:
            check(cudart().cudaMemcpyAsync(self.ptr, array.ctypes.data, array.nbytes, _H2D, stream.handle),
                  "cudaMemcpyAsync host->device")

    def download(self, out: np.ndarray, stream: Stream) -> np.ndarray:
        if out.nbytes > self.nbytes:
            raise CudaError(f"download of {out.nbytes} bytes from a {self.nbytes}-byte buffer")
        if out.nbytes:
            check(cudart().cudaMemcpyAsync(out.ctypes.data, self.ptr, out.nbytes, _D2H, stream.handle),
                  "cudaMemcpyAsync device->host")
        return out

    def zero(self, stream: Stream) -> None:
        check(cudart().cudaMemsetAsync(self.ptr, 0, self.nbytes, stream.handle), "cudaMemsetAsync")

    def free(self) -> None:
        if self.ptr and _LIB is not None:
            _LIB.cudaFree(self.ptr)
        self.ptr, self.nbytes = 0, 0

    def __del__(self):
        self.free()


def copy_2d(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int, kind: str,
            stream: Stream) -> None:
    """`rows` rows of `width` bytes from address src (rows `src_pitch` bytes apart) to dst (`dst_pitch` apart);
    kind "h2d", "d2h" or "d2d" (host addresses: a numpy array's .ctypes.data). Asynchronous on `stream`."""
    if width and rows:
        check(cudart().cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                                         {"h2d": _H2D, "d2h": _D2H, "d2d": _D2D}[kind], stream.handle),
              f"cudaMemcpy2DAsync {kind}")
