"""An engine dir travels (workstation -> Jetson): the TensorRT plugin library it carries must load after the dir
is moved and the native build dir is deleted. The plugin is built by CMake (needs nvcc, cuBLAS headers and
TensorRT headers: TENSORRT_ROOT), copied into an engine dir the way coverpruner-build does, the dir moved and the
build dir removed; then every NEEDED library must resolve (ldd), none may be a coverpruner library, no RUNPATH
may name the build dir, and the library must dlopen and hand out its one creator (getCreators, no GPU needed).

CUDA libraries (libcublas, libcublasLt) resolve through the system's library path on a device; here they come
from pip's nvidia-cublas wheel, whose lib/ is added to LD_LIBRARY_PATH for the checks, as a user's loader
configuration would provide it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from coverpruner.engines import native_build
from coverpruner.engines.native_build import PLUGIN_LIB

LOAD = textwrap.dedent("""
    import ctypes, sys
    lib = ctypes.CDLL(sys.argv[1])
    n = ctypes.c_int32(-1)
    lib.getCreators.restype = ctypes.POINTER(ctypes.c_void_p)
    lib.getCreators.argtypes = [ctypes.POINTER(ctypes.c_int32)]
    creators = lib.getCreators(ctypes.byref(n))
    print("creators", n.value, bool(creators[0]))
    for name in ("cp_coverage_select", "cp_abi_version"):
        print(name, "exported" if hasattr(lib, name) else "hidden")
""")


def _dynamic_section(lib) -> list[tuple[str, str]]:
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        if "(NEEDED)" in line or "(RUNPATH)" in line or "(RPATH)" in line:
            tag = line.split("(")[1].split(")")[0]
            rows.append((tag, line.split("[", 1)[1].rsplit("]", 1)[0]))
    return rows


@pytest.mark.skipif(shutil.which("readelf") is None or shutil.which("ldd") is None, reason="readelf/ldd not found")
def test_engine_dir_plugin_loads_after_move_and_build_dir_deleted(tmp_path_factory):
    if native_build.find_tensorrt_include() is None:
        pytest.skip("TensorRT headers (NvInferRuntime.h) not found: set TENSORRT_ROOT; no pip wheel ships them")
    if native_build.find_nvcc() is None or native_build.find_cublas()[0] is None:
        pytest.skip("nvcc or cublas_v2.h not found")
    build = tmp_path_factory.mktemp("reloc_build")
    libs = native_build.build_native(build, cuda_architectures=os.environ.get("COVERPRUNER_CUDA_ARCHS", "87"))
    assert libs.plugin is not None, "TensorRT headers were found but CMake built no plugin"
    engine_dir = tmp_path_factory.mktemp("workstation") / "engine_dir"
    engine_dir.mkdir()
    shutil.copy2(libs.plugin, engine_dir / PLUGIN_LIB)  # what coverpruner-build does (engines/tensorrt.py)
    moved = tmp_path_factory.mktemp("jetson") / "engine_dir"
    shutil.move(str(engine_dir), moved)
    shutil.rmtree(build)
    plugin = moved / PLUGIN_LIB

    dyn = _dynamic_section(plugin)
    needed = [v for t, v in dyn if t == "NEEDED"]
    paths = [v for t, v in dyn if t in ("RUNPATH", "RPATH")]
    assert not any("coverpruner" in n for n in needed), f"the plugin still needs a separate library: {needed}"
    assert all(p == "$ORIGIN" for entry in paths for p in entry.split(":") if p), f"RUNPATH names a dir: {paths}"
    assert not any(n.startswith("libcudart") for n in needed), f"cudart should be linked in statically: {needed}"

    env = dict(os.environ)
    _, cublas_lib = native_build.find_cublas()
    if cublas_lib is not None:  # pip's nvidia-cublas: its lib/ stands in for the system's loader path
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(cublas_lib.parent), env.get("LD_LIBRARY_PATH")]))
    ldd = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, env=env).stdout
    missing = [line.split()[0] for line in ldd.splitlines() if "not found" in line]
    assert not missing, f"unresolved libraries after the move: {missing}\n{ldd}"

    proc = subprocess.run([sys.executable, "-c", LOAD, str(plugin)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "creators 1 True" in proc.stdout, proc.stdout
    # only TensorRT's entry points leave the library (plugin_exports.map)
    assert "cp_coverage_select hidden" in proc.stdout and "cp_abi_version hidden" in proc.stdout, proc.stdout
