"""Builds the CUDA selector's real sources (kernels/coverage_select.cu, greedy_core.cuh, similarity_gemm.cpp) with
g++ against the CPU emulation of coverpruner/engines/csrc/tests/cuda_cpu/ (fibers for CUDA threads, a literal GEMM
for cuBLAS) into a shared library with the C API of coverage_select.h, for ctypes.

The one source change is mechanical: each `kernel<<<cfg>>>(args)` launch becomes
`::cuda_cpu::launch("kernel", ::cuda_cpu::LaunchConfig(cfg), kernel, args)`. `mutations` patch a copy of a
source (old text -> new text, each old text must occur exactly once) for the mutant tests.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from coverpruner.engines.native_build import CSRC_DIR

EMU_DIR = CSRC_DIR / "tests" / "cuda_cpu"
KERNEL_SOURCES = ("coverage_select.cu", "greedy_core.cuh", "similarity_gemm.cpp", "similarity_gemm.h")
_KERNEL_NAME = re.compile(r"([A-Za-z_][\w:]*(?:<[\w\s:,*]*>)?)\s*$")
CXXFLAGS = ["-std=c++17", "-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
            "-Wno-sign-compare"]  # threadIdx.x (unsigned) against int, as in any CUDA source; nvcc is silent


def rewrite_launches(source: str) -> str:
    """Every `name<<<config>>>(args)` -> `::cuda_cpu::launch("name", ::cuda_cpu::LaunchConfig(config), name,
    args)`; raises ValueError on a launch it cannot parse (unbalanced parentheses)."""
    out, pos = [], 0
    while (start := source.find("<<<", pos)) != -1:
        name_match = _KERNEL_NAME.search(source, 0, start)
        if name_match is None:
            raise ValueError(f"no kernel name before <<< at offset {start}")
        close = source.index(">>>", start)
        config = source[start + 3:close]
        paren = close + 3
        while source[paren].isspace():
            paren += 1
        if source[paren] != "(":
            raise ValueError(f"no argument list after >>> at offset {close}")
        depth, end = 0, paren
        for end in range(paren, len(source)):
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            if depth == 0:
                break
        else:
            raise ValueError(f"unbalanced arguments of the launch at offset {start}")
        kernel = name_match.group(1)
        args = source[paren + 1:end].strip()
        call = (f'::cuda_cpu::launch("{kernel}", ::cuda_cpu::LaunchConfig({config}), {kernel}'
                + (f", {args})" if args else ")"))
        out.append(source[pos:name_match.start(1)] + call)
        pos = end + 1
    out.append(source[pos:])
    return "".join(out)


def _compile(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} ... failed:\n{proc.stderr[-6000:]}")


def build_runtime(out_dir: Path) -> list[Path]:
    """The emulator's own objects (scheduler, GEMM), shared by every build of the kernels."""
    out_dir.mkdir(parents=True, exist_ok=True)
    objs = []
    for src in ("cuda_cpu.cpp", "cublas_cpu.cpp"):
        obj = out_dir / (Path(src).stem + ".o")
        _compile(["g++", *CXXFLAGS, "-c", str(EMU_DIR / src), "-o", str(obj)])
        objs.append(obj)
    return objs


def build_selector(out_dir: Path, runtime_objs: list[Path],
                   mutations: dict[str, list[tuple[str, str]]] | None = None,
                   defines: tuple[str, ...] = ()) -> Path:
    """libcoverpruner_selector_emu.so in out_dir from (patched copies of) the kernel sources."""
    src_dir = out_dir / "src"
    if src_dir.exists():
        shutil.rmtree(src_dir)
    src_dir.mkdir(parents=True)
    for name in KERNEL_SOURCES:
        text = (CSRC_DIR / "kernels" / name).read_text()
        for old, new in (mutations or {}).get(name, []):
            count = text.count(old)
            if count != 1:
                raise ValueError(f"mutation target occurs {count} times in {name} (expected once): {old!r}")
            text = text.replace(old, new)
        if name.endswith(".cu"):
            (src_dir / (Path(name).stem + ".cpp")).write_text(f'#line 1 "{name}"\n' + rewrite_launches(text))
        else:
            (src_dir / name).write_text(text)
    includes = [f"-I{EMU_DIR / 'include'}", f"-I{src_dir}", f"-I{CSRC_DIR / 'include'}"]
    lib = out_dir / "libcoverpruner_selector_emu.so"
    # -Bsymbolic: the emulated cuBLAS/CUDA calls bind to this library's own definitions even where the real
    # libcublas was loaded RTLD_GLOBAL first (native_build.preload_cublas)
    _compile(["g++", *CXXFLAGS, *(f"-D{d}" for d in defines), "-shared", "-Wl,-Bsymbolic", *includes,
              str(src_dir / "coverage_select.cpp"), str(src_dir / "similarity_gemm.cpp"),
              *map(str, runtime_objs), "-o", str(lib)])
    return lib
