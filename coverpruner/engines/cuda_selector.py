"""ctypes wrapper of the CUDA coverage selector's C entry point (libcoverpruner_selector.so).

    sel = CudaCoverageSelector()                     # finds/loads the library
    keep = sel(features, relevance, budget=64)       # torch CUDA tensors in, int64 CUDA tensor out

The library is built from coverpruner/engines/csrc (`cmake -S coverpruner/engines/csrc -B build/csrc && cmake
--build build/csrc`, or `coverpruner.engines.native_build.build_native`). It is found at `lib_path`, else
$COVERPRUNER_SELECTOR_LIB, else build/csrc/ under the current directory.

torch is imported lazily and only for CUDA buffers and the current stream; the C API itself takes raw device
pointers, so cupy or any other allocator could drive it the same way.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from coverpruner.engines.native_build import preload_cublas

CP_DTYPE_FLOAT32 = 0
CP_DTYPE_FLOAT16 = 1
ABI_VERSION = 2  # 2: keep_length_device is int32
_STATUS = {0: "CP_OK", 1: "CP_ERR_INVALID_ARGUMENT", 2: "CP_ERR_WORKSPACE_TOO_SMALL", 3: "CP_ERR_CUDA",
           4: "CP_ERR_CUBLAS"}
_DEFAULT_LIB = Path("build") / "csrc" / "libcoverpruner_selector.so"


class CudaSelectorError(RuntimeError):
    """The CUDA selector library is missing, of another ABI, or returned an error status."""


def find_selector_library(lib_path: str | os.PathLike | None = None) -> Path:
    """The library file to load (see module docstring for the search order)."""
    for cand in (lib_path, os.environ.get("COVERPRUNER_SELECTOR_LIB"), _DEFAULT_LIB):
        if cand and Path(cand).is_file():
            return Path(cand)
    raise CudaSelectorError(
        "libcoverpruner_selector.so not found (looked at lib_path, $COVERPRUNER_SELECTOR_LIB and "
        f"{_DEFAULT_LIB}); build it with `cmake -S coverpruner/engines/csrc -B build/csrc && "
        "cmake --build build/csrc`")


def load_selector_library(lib_path: str | os.PathLike | None = None) -> ctypes.CDLL:
    """Loads the library and declares the C signatures of coverpruner/coverage_select.h."""
    path = find_selector_library(lib_path)
    preload_cublas()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:  # usually a missing libcudart/libcublas
        raise CudaSelectorError(f"{path}: cannot be loaded ({exc})") from exc
    lib.cp_abi_version.restype = ctypes.c_int
    lib.cp_abi_version.argtypes = []
    if lib.cp_abi_version() != ABI_VERSION:
        raise CudaSelectorError(f"{path}: ABI version {lib.cp_abi_version()}, this wrapper expects {ABI_VERSION}; "
                                "rebuild the library from this checkout")
    lib.cp_coverage_workspace_size.restype = ctypes.c_size_t
    lib.cp_coverage_workspace_size.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    lib.cp_coverage_select.restype = ctypes.c_int
    lib.cp_coverage_select.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,  # features, dtype, relevance
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,  # batch, n, d
        ctypes.c_int64, ctypes.c_void_p,  # budget, budget_device
        ctypes.c_float, ctypes.c_void_p,  # tau, tau_device
        ctypes.c_void_p, ctypes.c_void_p,  # keep, keep_length_device
        ctypes.c_void_p, ctypes.c_size_t,  # workspace, workspace_bytes
        ctypes.c_void_p, ctypes.c_void_p,  # stream, cublas handle
    ]
    lib.cp_status_string.restype = ctypes.c_char_p
    lib.cp_status_string.argtypes = [ctypes.c_int]
    lib.cp_last_error.restype = ctypes.c_char_p
    lib.cp_last_error.argtypes = []
    lib.cp_set_checked_mode.restype = None
    lib.cp_set_checked_mode.argtypes = [ctypes.c_int]
    lib.cp_release_handles.restype = ctypes.c_int
    lib.cp_release_handles.argtypes = []
    return lib


def relevance_rows(relevance, batch: int, n: int, device):
    """relevance (tensor or array-like, [n] or [batch, n]) -> contiguous float32 [batch, n] on `device`; a 1-D
    relevance applies to every problem of the batch. ValueError naming both shapes otherwise."""
    import torch

    r = torch.as_tensor(relevance, device=device, dtype=torch.float32)
    if tuple(r.shape) not in ((n,), (batch, n)):
        raise ValueError(f"relevance must be [{n}] or [{batch}, {n}] to match features [{batch}, {n}, d], "
                         f"got {list(r.shape)}")
    return r.expand(batch, n).contiguous()


class CudaCoverageSelector:
    """Coverage selection on the GPU through the C API; same contract as coverpruner.selection.coverage_select."""

    def __init__(self, lib_path: str | os.PathLike | None = None, checked: bool | None = None):
        """checked: synchronise after every kernel so a failure names its kernel (slow; None keeps the library's
        setting, COVERPRUNER_CUDA_CHECKED=1 in the environment turns it on)."""
        self.lib = load_selector_library(lib_path)
        if checked is not None:
            self.lib.cp_set_checked_mode(int(bool(checked)))

    def release_handles(self) -> int:
        """Destroys the cuBLAS handles the library made for its streams (teardown); returns how many."""
        return int(self.lib.cp_release_handles())

    def workspace_size(self, batch: int, n: int, d: int, dtype: int = CP_DTYPE_FLOAT32) -> int:
        """Bytes of device workspace for features [batch, n, d] of `dtype` (CP_DTYPE_*)."""
        size = self.lib.cp_coverage_workspace_size(batch, n, d, dtype)
        if size == 0 and batch * n * d > 0:
            raise CudaSelectorError(f"no valid workspace for batch={batch}, n={n}, d={d}, dtype={dtype}")
        return int(size)

    def raw_select(self, features_ptr: int, dtype: int, relevance_ptr: int | None, batch: int, n: int, d: int,
                   budget: int, tau: float, keep_ptr: int, workspace_ptr: int | None, workspace_bytes: int,
                   stream: int | None = None) -> None:
        """The C call on raw device pointers (ints); raises CudaSelectorError on a non-OK status."""
        status = self.lib.cp_coverage_select(features_ptr, dtype, relevance_ptr, batch, n, d, budget, None,
                                             float(tau), None, keep_ptr, None, workspace_ptr, workspace_bytes,
                                             stream, None)
        if status != 0:
            name = _STATUS.get(status, f"status {status}")
            raise CudaSelectorError(f"cp_coverage_select: {name}: {self.lib.cp_last_error().decode()}")

    def __call__(self, features, relevance=None, budget: int = 64, tau: float = 0.3):
        """features: torch CUDA tensor [n, d] or [B, n, d], float32 or float16. relevance: [n] / [B, n] or None
        (any array-like; a 1-D [n] relevance with a batch applies to every problem of the batch).

        Returns int64 [m] / [B, m] on the features' device, each row ascending, m = min(budget, n). Runs on the
        current torch stream (no synchronisation).
        """
        import torch

        if not isinstance(features, torch.Tensor) or not features.is_cuda:
            raise TypeError("features must be a torch CUDA tensor")
        if features.dim() not in (2, 3):
            raise ValueError(f"features must be [n, d] or [B, n, d], got shape {tuple(features.shape)}")
        if features.dtype not in (torch.float32, torch.float16):
            raise ValueError(f"features must be float32 or float16, got {features.dtype}")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"budget must be an int >= 0, got {budget!r}")
        squeeze = features.dim() == 2
        v = features.unsqueeze(0) if squeeze else features
        v = v.contiguous()
        batch, n, d = v.shape
        r = None if relevance is None else relevance_rows(relevance, batch, n, v.device)
        m = min(budget, n)
        keep = torch.empty((batch, m), dtype=torch.int64, device=v.device)
        dtype = CP_DTYPE_FLOAT16 if v.dtype == torch.float16 else CP_DTYPE_FLOAT32
        ws_bytes = self.workspace_size(batch, n, d, dtype)
        workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=v.device)
        stream = torch.cuda.current_stream(v.device).cuda_stream
        with torch.cuda.device(v.device):
            self.raw_select(v.data_ptr(), dtype, None if r is None else r.data_ptr(), batch, n, d, budget, tau,
                            keep.data_ptr(), workspace.data_ptr(), ws_bytes, stream)
        # the workspace is freed only after the stream has used it (caching allocator, stream-ordered)
        workspace.record_stream(torch.cuda.current_stream(v.device))
        return keep[0] if squeeze else keep
