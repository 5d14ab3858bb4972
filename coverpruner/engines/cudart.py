"""The few CUDA runtime calls a TensorRT session needs (device buffers, copies, a stream), through ctypes.

No torch, cupy or cuda-python: libcudart ships with every CUDA/TensorRT install, and the runtime package must
stay torch-free. Every call checks its cudaError_t and raises CudaError with CUDA's own message.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

_H2D, _D2H, _D2D = 1, 2, 3  # cudaMemcpyKind


class CudaError(RuntimeError):
    """A CUDA runtime call failed (message from cudaGetErrorString) or libcudart is missing."""


_LIB: ctypes.CDLL | None = None


def cudart() -> ctypes.CDLL:
    """libcudart, loaded once ($COVERPRUNER_CUDART, then the usual sonames)."""
    global _LIB
    if _LIB is not None:
        return _LIB
    names = [os.environ.get("COVERPRUNER_CUDART"), "libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    errors = []
    for name in filter(None, names):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    else:
        raise CudaError("libcudart not found (" + "; ".join(errors) + "); install the CUDA runtime or set "
                        "COVERPRUNER_CUDART")
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


def device_problem() -> str | None:
    """None when CUDA device 0 is usable through libcudart; otherwise one line naming what is missing
    (the library, the driver, or a device). Needs no torch: this is what the TensorRT sessions run on."""
    try:
        lib = cudart()
    except CudaError as exc:
        return str(exc)
    count = ctypes.c_int(0)
    status = lib.cudaGetDeviceCount(ctypes.byref(count))
    if status != 0:
        return f"cudaGetDeviceCount: CUDA error {status} ({lib.cudaGetErrorString(status).decode()})"
    if count.value < 1:
        return "cudaGetDeviceCount found no CUDA device"
    return None


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
