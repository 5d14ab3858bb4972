"""What a user's first run on a real GPU would hit, reproduced on this CPU machine (issue 37) with the real library
where one installs here and a faithful stand-in where not:

- the plugin registered twice (a build loads the build dir's library, the sessions the engine dir's copy): TensorRT's
  loadLibrary returns nullptr when a creator is already registered (NvInferRuntimeCommon.h, 10.0 to 11.1) -- with
  TensorRT-RTX's real registry (needs the plugin built against TensorRT headers: TENSORRT_ROOT) and with a stand-in
  registry that follows that documented rule;
- TensorRT 11 (what `pip install tensorrt` resolves to: 11.4; its libraries come from NVIDIA's own index, which this
  machine cannot reach) has no BuilderFlag.FP16/BF16/INT8 and no Builder without CUDA: stand-in = TensorRT-RTX's
  real bindings under the name `tensorrt` with version 11.4 (RTX's BuilderFlag lacks the same flags; both build
  strongly typed networks), and pybind11's nullptr TypeError where a factory fails;
- libcudart from pip's nvidia-cuda-runtime wheel (on no loader path) found, and "no CUDA device" reported;
- the driver release from NVML (a stand-in libnvidia-ml built here exporting nvml.h's three calls), /proc or L4T;
- a CUDA provider that is listed but does not load: one line naming the library (ONNX Runtime's real fallback).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coverpruner.engine_dir import PLUGIN_NAMESPACE, PLUGIN_OP, PLUGIN_VERSION
from coverpruner.engines import tensorrt as trt_build
from coverpruner.engines.native_build import PLUGIN_LIB, nvidia_dirs
from coverpruner.engines.tensorrt import TensorRTBuildError, TrtModule

from ..hardening.conftest import repo_env

REPO = Path(__file__).resolve().parents[2]


# --- the plugin, registered once per process -----------------------------------------------------------------------
REGISTRY_SCRIPT = textwrap.dedent("""
    import shutil, sys
    from pathlib import Path
    import tensorrt_rtx
    from coverpruner.engines.tensorrt import TensorRTBuildError, TrtModule, load_plugin_library
    built, engine_dir, op, version, namespace = sys.argv[1:6]
    trt = TrtModule(tensorrt_rtx, "tensorrt_rtx", tensorrt_rtx.__version__)
    logger = tensorrt_rtx.Logger(tensorrt_rtx.Logger.WARNING)
    reg = tensorrt_rtx.get_plugin_registry()
    copy = Path(engine_dir) / Path(built).name
    shutil.copy2(built, copy)                      # what coverpruner-build does
    # the defect: the registry itself refuses a second library with the same creator
    first = reg.load_library(built)
    print("raw second load_library:", reg.load_library(str(copy)))
    load_plugin_library(trt, Path(built), logger)  # the build's load: the creator is already there
    load_plugin_library(trt, copy, logger)         # the session's load of the engine dir's copy
    load_plugin_library(trt, copy, logger)
    creators = [c for c in reg.all_creators if c.name == op]
    print("creators", len(creators), creators[0].plugin_version, repr(creators[0].plugin_namespace))
    print("same creator", reg.get_creator(op, version, namespace).name == op)
    other = Path(engine_dir) / "other.so"
    other.write_bytes(Path(built).read_bytes() + b"\\0")  # another build of the plugin
    try:
        load_plugin_library(trt, other, logger)
    except TensorRTBuildError as exc:
        print("refused:", exc)
""")


@pytest.mark.tensorrt
def test_the_plugin_loads_twice_through_tensorrt_rtx_with_one_creator(native_libs, tmp_path):
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX python bindings are not installed")
    if native_libs.plugin is None:
        pytest.skip("the TensorRT plugin was not built: TensorRT headers not found (set TENSORRT_ROOT)")
    # a subprocess: the registry is process-wide
    proc = subprocess.run([sys.executable, "-c", REGISTRY_SCRIPT, str(native_libs.plugin), str(tmp_path), PLUGIN_OP,
                           PLUGIN_VERSION, PLUGIN_NAMESPACE], capture_output=True, text=True, timeout=120,
                          env=repo_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "raw second load_library: None" in out  # what the old code turned into a misleading error
    assert f"creators 1 {PLUGIN_VERSION} {PLUGIN_NAMESPACE!r}" in out and "same creator True" in out, out
    assert "getCreators" not in out, out
    assert "refused: plugin CoverageSelector version 1 is already registered in this process from" in out, out
    assert "other.so is a different library (sha256 differs)" in out, out


class StandInRegistry:
    """IPluginRegistry as NvInferRuntimeCommon.h documents it: loadLibrary returns nullptr (None) when any of the
    library's creators is already registered; getCreator finds a registered creator by name/version/namespace."""

    def __init__(self):
        self.creators, self.loads = {}, []

    def load_library(self, path):
        self.loads.append(path)
        if (PLUGIN_OP, PLUGIN_VERSION, PLUGIN_NAMESPACE) in self.creators:
            return None
        self.creators[(PLUGIN_OP, PLUGIN_VERSION, PLUGIN_NAMESPACE)] = object()
        return object()

    def get_creator(self, name, version, namespace=""):
        return self.creators.get((name, version, namespace))


@pytest.fixture
def stand_in_trt(monkeypatch):
    registry = StandInRegistry()
    module = type(sys)("stand_in_tensorrt")
    module.get_plugin_registry = lambda: registry
    monkeypatch.setattr(trt_build, "_LOADED_PLUGINS", {})
    monkeypatch.setattr(trt_build, "preload_cublas", lambda: None)
    return TrtModule(module, "tensorrt_rtx", "stand-in"), registry


def test_a_second_copy_of_the_plugin_is_not_loaded_again(stand_in_trt, tmp_path):
    trt, registry = stand_in_trt
    built, copy = tmp_path / "build" / PLUGIN_LIB, tmp_path / "engine" / PLUGIN_LIB
    built.parent.mkdir()
    copy.parent.mkdir()
    built.write_bytes(b"plugin")
    shutil.copy2(built, copy)
    trt_build.load_plugin_library(trt, built)
    trt_build.load_plugin_library(trt, copy)  # the old code: load_library -> None -> "must export getCreators"
    assert registry.loads == [str(built.resolve())]
    other = tmp_path / "other.so"
    other.write_bytes(b"another plugin")
    with pytest.raises(TensorRTBuildError, match="already registered in this process from .*different library"):
        trt_build.load_plugin_library(trt, other)


def test_a_creator_registered_by_someone_else_is_used(stand_in_trt, tmp_path):
    trt, registry = stand_in_trt
    registry.load_library("loaded by ONNX Runtime's TensorRT provider")
    lib = tmp_path / PLUGIN_LIB
    lib.write_bytes(b"plugin")
    trt_build.load_plugin_library(trt, lib)
    assert registry.loads == ["loaded by ONNX Runtime's TensorRT provider"]


def test_a_library_without_the_creator_is_refused(stand_in_trt, tmp_path):
    trt, registry = stand_in_trt
    registry.load_library = lambda path: object()  # loads, registers nothing
    lib = tmp_path / "libsomething.so"
    lib.write_bytes(b"x")
    with pytest.raises(TensorRTBuildError, match="registered no CoverageSelector version 1 creator"):
        trt_build.load_plugin_library(trt, lib)


# --- TensorRT 11: strongly typed, and no Builder without CUDA -----------------------------------------------------
def _trt11_stand_in(tmp_path) -> Path:
    """A `tensorrt` package that is TensorRT-RTX's real bindings under TensorRT 11's name and version."""
    pkg = tmp_path / "trt11" / "tensorrt"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from tensorrt_rtx import *  # noqa\nfrom tensorrt_rtx import nptype  # noqa\n"
                                     "__version__ = '11.4.0.106'\n")
    return pkg.parent


@pytest.mark.tensorrt
def test_tensorrt_11_without_a_gpu_refuses_in_one_line(trt_rtx, tmp_path):
    from coverpruner.engines.cudart import device_problem

    if device_problem() is None:
        pytest.skip("checks the refusal on a machine without a usable GPU")
    from .test_tensorrt_build import _selector_dir

    d = _selector_dir(tmp_path, "float16", "fp16")
    env = repo_env()
    env["PYTHONPATH"] = os.pathsep.join([str(_trt11_stand_in(tmp_path)), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-m", "coverpruner.engines.build_cli", str(d), "--flavour", "tensorrt",
                           "--precision", "fp16"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("coverpruner-build: error")]
    assert len(lines) == 1 and "TensorRT 11.4.0.106 needs a usable CUDA GPU to build engines: " in lines[0], proc.stderr
    assert device_problem() in lines[0], lines[0]  # the reason: no driver, no device, or no libcudart
    assert "Traceback" not in proc.stderr and "AttributeError" not in proc.stderr
    assert not list(d.glob("*.engine"))


@pytest.mark.tensorrt
def test_tensorrt_11_builds_strongly_typed_from_the_graph_dtypes(trt_rtx, tmp_path, monkeypatch):
    """With a device (pretended: the stand-in's builder needs none) TensorRT 11 builds: fp16 from an fp16 graph,
    no BuilderFlag.FP16 asked for; an fp16 request on an fp32 graph is one line saying to re-export."""
    from .test_tensorrt_build import _selector_dir

    monkeypatch.setattr(trt_build, "device_problem", lambda: None)
    monkeypatch.setattr(trt_build, "compute_capability", lambda: "9.0")
    trt11 = TrtModule(trt_rtx.module, "tensorrt", "11.4.0.106")
    assert not hasattr(trt11.module.BuilderFlag, "FP16") and trt_build.strongly_typed(trt11)
    section = trt_build.build_engine_dir(_selector_dir(tmp_path, "float16", "fp16"),
                                         trt_build.BuildOptions(budgets=(8, 16), precision="fp16"), trt11)
    assert section["precision"] == "fp16" and section["flavour"] == "tensorrt"
    with pytest.raises(TensorRTBuildError, match=r"tensorrt 11\.4\.0\.106 builds strongly typed.*--dtype fp16"):
        trt_build.build_engine_dir(_selector_dir(tmp_path), trt_build.BuildOptions(precision="fp16"), trt11)


def test_a_factory_returning_nullptr_is_one_line(monkeypatch):
    """pybind11 turns a null IBuilder / IRuntime into `TypeError: ... factory function returned nullptr`."""
    module = type(sys)("tensorrt")

    def nullptr(logger):
        raise TypeError("pybind11::init(): factory function returned nullptr")

    module.Builder = module.Runtime = nullptr
    trt = TrtModule(module, "tensorrt", "10.3.0")
    monkeypatch.setattr(trt_build, "device_problem", lambda: "no CUDA device: stand-in")
    with pytest.raises(TensorRTBuildError, match="^TensorRT 10.3.0 needs a usable CUDA GPU to run x.engine: no CUDA"):
        trt_build.make(trt, "Runtime", None, "run x.engine")
    monkeypatch.setattr(trt_build, "device_problem", lambda: None)  # the device looked fine, the factory failed
    with pytest.raises(TensorRTBuildError, match="could not create its Builder to build .*factory function returned "
                                                 "nullptr.*CUDA is not usable"):
        trt_build.make(trt, "Builder", None, "build the 'vision' engine")


# --- libcudart from pip's wheel --------------------------------------------------------------------------------------
CUDART_SCRIPT = textwrap.dedent("""
    from coverpruner.engines import cudart
    cudart.SONAMES = ()          # nothing on the loader path ...
    cudart.TOOLKIT_ROOTS = ()    # ... and no toolkit: only pip's nvidia wheels remain
    print("problem:", cudart.device_problem())
    print("path:", cudart.cudart_path())
""")


def test_libcudart_from_the_pip_wheel_is_found(tmp_path):
    wheels = [p for nv in nvidia_dirs() for p in nv.glob("*/lib/libcudart.so.*[0-9]")]
    if not wheels:
        pytest.skip("no pip CUDA runtime wheel here (`pip install nvidia-cuda-runtime`: the cuda-build extra)")
    env = {k: v for k, v in repo_env().items() if k not in ("CUDA_HOME", "COVERPRUNER_CUDART")}
    proc = subprocess.run([sys.executable, "-c", CUDART_SCRIPT], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = proc.stdout.split("path: ", 1)[1].strip()
    assert Path(path) in wheels, proc.stdout
    problem = proc.stdout.split("problem: ", 1)[1].splitlines()[0]
    from coverpruner.engines.cudart import device_problem

    if device_problem() is None:
        assert problem == "None", problem
    else:
        assert problem.startswith("no CUDA device") or problem.startswith("no usable CUDA device"), problem
        assert "libcudart not found" not in problem and path in problem, problem


def test_without_any_libcudart_the_line_says_how_to_get_one(monkeypatch):
    from coverpruner.engines import cudart

    monkeypatch.setattr(cudart, "_LIB", None)
    monkeypatch.setattr(cudart, "SONAMES", ())
    monkeypatch.setattr(cudart, "TOOLKIT_ROOTS", ())
    monkeypatch.setattr("coverpruner.engines.native_build.nvidia_dirs", lambda: [])
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("COVERPRUNER_CUDART", raising=False)
    problem = cudart.device_problem()
    assert problem.startswith("libcudart not found") and "pip install nvidia-cuda-runtime" in problem, problem


# --- the driver release -------------------------------------------------------------------------------------------
NVML_STAND_IN = r"""
// nvml.h's three calls, as the driver's libnvidia-ml.so.1 answers them
#include <cstring>
extern "C" {
int nvmlInit_v2() { return FAIL_INIT; }
int nvmlShutdown() { return 0; }
const char* nvmlErrorString(int r) { return r == 9 ? "Driver Not Loaded" : "Unknown Error"; }
int nvmlSystemGetDriverVersion(char* version, unsigned length) {
    const char* v = "580.65.06";
    if (length < std::strlen(v) + 1) return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
    std::strcpy(version, v);
    return 0;
}
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found on PATH")
def test_driver_release_from_nvml_then_proc_then_l4t(tmp_path):
    from coverpruner.engines.nvml import driver_release

    libs = {}
    for name, fail in (("ok", 0), ("not_loaded", 9)):
        src = tmp_path / f"nvml_{name}.cpp"
        src.write_text(NVML_STAND_IN.replace("FAIL_INIT", str(fail)))
        libs[name] = tmp_path / f"libnvidia-ml-{name}.so"
        subprocess.run(["g++", "-shared", "-fPIC", str(src), "-o", str(libs[name])], check=True, timeout=120)
    none = tmp_path / "absent"
    assert driver_release((libs["ok"],), none, none) == "580.65.06 (NVML)"
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  "
                    "(dvs-builder@U16-I3-B03-4-3)  Fri Mar 14 20:00:03 UTC 2025\nGCC version:  gcc version 12.3.0\n")
    assert driver_release((libs["not_loaded"],), proc, none) == f"570.133.20 ({proc})"
    tegra = tmp_path / "nv_tegra_release"
    tegra.write_text("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan 8\n")
    assert driver_release((none,), none, tegra) == f"L4T R36.4.3 ({tegra})"
    unknown = driver_release((libs["not_loaded"],), none, none)
    assert unknown.startswith("unknown (NVML: nvmlInit_v2: Driver Not Loaded (9)"), unknown


# --- a CUDA provider that is listed but does not load ----------------------------------------------------------
def test_a_cuda_provider_that_falls_back_to_the_cpu_is_one_line(tmp_path, monkeypatch):
    """ONNX Runtime's real behaviour: a session asked for a provider whose library does not load runs on the CPU
    with a warning; onnxruntime-gpu lists CUDAExecutionProvider even where its CUDA / cuDNN libraries are missing.
    The CPU build here, told (as onnxruntime-gpu says) that the provider is available, does exactly that fallback."""
    import onnx
    from onnx import TensorProto, helper

    from coverpruner.engines import ort as ort_factory

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "g.onnx")
    monkeypatch.setattr(ort_factory.ort, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(ort_factory.ProviderError) as info:
        ort_factory.make_session(tmp_path / "g.onnx", "cuda")
    msg = str(info.value)
    assert "\n" not in msg and "CUDAExecutionProvider is installed but failed to load for g.onnx" in msg, msg
    assert "['CPUExecutionProvider']" in msg and "libonnxruntime_providers_cuda.so" in msg, msg


ORT_GPU_SCRIPT = textwrap.dedent("""
    import sys
    from coverpruner.engines.ort import ProviderError, make_session
    try:
        make_session(sys.argv[1], "cuda")
    except ProviderError as exc:
        print("LINE:", exc)
""")


def test_real_onnxruntime_gpu_without_cuda_libraries_is_one_line(tmp_path):
    """With onnxruntime-gpu itself (a `pip install --target DIR onnxruntime-gpu` named by $COVERPRUNER_TEST_ORT_GPU;
    340 MB, so not in CI): its CUDA provider is listed, its library needs libcublasLt that is not there."""
    target = os.environ.get("COVERPRUNER_TEST_ORT_GPU")
    if not target:
        pytest.skip("set COVERPRUNER_TEST_ORT_GPU to a `pip install --target` dir of onnxruntime-gpu")
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "g.onnx")
    env = repo_env()
    env["PYTHONPATH"] = os.pathsep.join([target, env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-c", ORT_GPU_SCRIPT, str(tmp_path / "g.onnx")], capture_output=True,
                          text=True, timeout=120, env=env)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("LINE:")), None)
    assert line is not None, proc.stdout + proc.stderr
    assert "CUDAExecutionProvider is installed but failed to load" in line and "cannot open shared object" in line
