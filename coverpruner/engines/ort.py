"""ONNX Runtime session factory: provider names -> ORT execution providers.

The runtime asks this module for one session per graph (see ``SessionFactory``); a native
TensorRT engine loader can replace it behind the same call without touching the pipeline.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import onnxruntime as ort

#: Public provider names accepted by ``make_session`` and ``coverpruner-run --provider``.
PROVIDERS = ("cpu", "cuda", "tensorrt")

# Which ORT execution providers a public name needs, in priority order. TensorRT keeps CUDA and
# CPU behind it because ORT assigns every node TensorRT cannot take to the next provider.
_ORT_PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}

_INSTALL_HINT = {
    "cuda": "onnxruntime-gpu (`pip install 'coverpruner[gpu]'`, in place of onnxruntime; on Jetson NVIDIA's wheel: "
            "docs/tensorrt.md)",
    "tensorrt": "onnxruntime-gpu built with TensorRT and the TensorRT libraries",
}
# The shared library ONNX Runtime loads for each GPU provider (onnxruntime/capi/), probed for the loader's reason
# when a session came up without the provider.
_PROVIDER_LIBRARY = {"CUDAExecutionProvider": "libonnxruntime_providers_cuda.so",
                     "TensorrtExecutionProvider": "libonnxruntime_providers_tensorrt.so"}
_PRELOADED = False


class ProviderError(ValueError):
    """An unknown provider name, or one whose ORT execution provider is not installed."""


def ort_providers(provider: str) -> list[str]:
    """Map a public provider name to ORT execution provider names, checking availability.

    Raises ProviderError naming the provider, what it needs and what is available.
    """
    if provider not in _ORT_PROVIDERS:
        raise ProviderError(f"unknown provider {provider!r}; expected one of {list(PROVIDERS)}")
    wanted = _ORT_PROVIDERS[provider]
    available = ort.get_available_providers()
    if wanted[0] not in available:
        raise ProviderError(
            f"provider {provider!r} needs {_INSTALL_HINT[provider]} ({wanted[0]}); "
            f"available: {available}"
        )
    return [p for p in wanted if p in available]


def preload_gpu_libraries() -> None:
    """onnxruntime.preload_dlls() once per process (onnxruntime-gpu >= 1.21): loads the CUDA and cuDNN libraries of
    pip's nvidia-* wheels (what `pip install onnxruntime-gpu[cuda,cudnn]` and torch bring), which are on no loader
    path, so the CUDA provider finds them. Its notes go to stderr: stdout may carry a command's answer."""
    global _PRELOADED
    if _PRELOADED or not hasattr(ort, "preload_dlls"):
        return
    _PRELOADED = True
    with contextlib.redirect_stdout(sys.stderr):
        try:
            ort.preload_dlls()
        except Exception as exc:  # a failed preload only means the loader path must supply the libraries
            print(f"onnxruntime.preload_dlls: {exc}", file=sys.stderr)


def provider_load_problem(ort_provider: str) -> str:
    """Why ONNX Runtime's library for a GPU provider does not load here: the dynamic loader's own message (which
    library is missing or mismatched), found by loading it the way ONNX Runtime does."""
    name = _PROVIDER_LIBRARY.get(ort_provider)
    if name is None:
        return "see ONNX Runtime's log above"
    capi = Path(ort.__file__).parent / "capi"
    try:
        ctypes.CDLL(str(capi / "libonnxruntime_providers_shared.so"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(capi / name))
    except OSError as exc:
        return str(exc).strip().splitlines()[0]
    return f"{name} loads; see ONNX Runtime's log above for why the provider did not start"


def check_session_providers(session, provider: str, path: Path) -> None:
    """ProviderError (one line) when a session asked for a GPU provider runs without it: ONNX Runtime lists
    CUDAExecutionProvider whenever onnxruntime-gpu is installed, but falls back to the CPU when the provider's
    library fails to load (CUDA / cuDNN missing or of another major version), and the run would then be CPU-only
    (with device KV buffers bound to a CPU session)."""
    wanted = _ORT_PROVIDERS[provider][0]
    got = session.get_providers()
    if wanted not in got:
        raise ProviderError(f"provider {provider!r}: {wanted} is installed but failed to load for {path.name}, the "
                            f"session would run on {got}: {provider_load_problem(wanted)} (onnxruntime "
                            f"{ort.__version__}; `coverpruner-doctor` checks the CUDA set-up)")


def tensorrt_ep_options(manifest: dict, graph: str, cache_dir: str | os.PathLike) -> dict[str, str]:
    """ORT TensorRT EP options for one graph of an engine dir.

    Engines and the timing cache persist in ``cache_dir``; fp16 follows the manifest's precision; every input
    with a symbolic axis gets an explicit optimization profile (trt_profile_min/opt/max_shapes) over the same
    axis ranges as `coverpruner-build`, so the EP builds one engine per graph up front instead of rebuilding
    each time a sequence length leaves the shapes it has seen.
    """
    from .tensorrt import BuildOptions, axis_ranges, input_profile  # no TensorRT import: plain shape rules

    spec = manifest["graphs"][graph]
    ranges = axis_ranges(manifest, BuildOptions())
    profiles: dict[str, list[str]] = {"min": [], "opt": [], "max": []}
    for inp in spec["inputs"]:
        if all(isinstance(axis, int) for axis in inp["shape"]):
            continue  # static (or a scalar such as the selector's budget): no profile entry
        prof = input_profile(graph, inp, ranges)
        for key in profiles:
            profiles[key].append(f"{inp['name']}:" + "x".join(str(v) for v in prof[key]))
    options = {
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": str(cache_dir),
        "trt_timing_cache_enable": "True",
        "trt_timing_cache_path": str(cache_dir),
        "trt_fp16_enable": "True" if manifest.get("precision") == "fp16" else "False",
    }
    if profiles["min"]:
        options.update({f"trt_profile_{key}_shapes": ",".join(val) for key, val in profiles.items()})
    return options


def device_type(provider: str) -> str:
    """The ORT device type ('cpu' or 'cuda') where a provider keeps its tensors for IO binding."""
    return "cpu" if provider == "cpu" else "cuda"


def session_options(threads: int | None = None, optimization: str = "all", spin: bool = True,
                    spin_stop: bool = False) -> ort.SessionOptions:
    """SessionOptions with intra-op threads (None -> ORT default) and a graph optimization level.

    spin=False stops idle ORT worker threads from busy-waiting after a run: right for graphs that are
    followed by numpy work (vision, probe -> selection), which would otherwise share the cores with
    spinning threads; the decode loop's graphs keep spinning for back-to-back runs.
    """
    levels = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    if optimization not in levels:
        raise ValueError(f"unknown graph optimization {optimization!r}; expected one of {list(levels)}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    so = ort.SessionOptions()
    so.graph_optimization_level = levels[optimization]
    if threads is not None:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif spin_stop:
        so.add_session_config_entry("session.force_spinning_stop", "1")
    # Quiet ORT's per-node fallback warnings; real failures still raise.
    so.log_severity_level = 3
    return so


def shrink_arena_options(session, provider: str) -> ort.RunOptions | None:
    """RunOptions that make ONNX Runtime give its arena's unused chunks back after the run
    (``memory.enable_memory_arena_shrinkage``) for the provider's device; None where there is none to shrink (a
    session that is not ONNX Runtime's, e.g. a TensorRT engine, or a provider without an arena).
    The CPU arena otherwise keeps the largest run's peak for the life of the session (a long video's vision run
    left ~0.8 GB held by a 64-wide tower)."""
    device = {"cpu": "cpu:0", "cuda": "gpu:0"}.get(provider)
    if device is None or not isinstance(session, ort.InferenceSession):
        return None
    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", device)
    return options


def lower_thread_priority() -> bool:
    """Move the calling thread to the lowest CPU priority: Linux's SCHED_IDLE policy (it runs only on a core that
    nothing else wants, and any other thread that wakes takes the core from it at once), inherited by the threads
    it starts. False where that is not possible (not Linux)."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread
        return True
    except OSError:
        return False


def make_session(
    path: str | os.PathLike,
    provider: str = "cpu",
    threads: int | None = None,
    optimization: str = "all",
    spin: bool = True,
    trt_options: dict[str, str] | None = None,
    low_priority: bool = False,
    spin_stop: bool = False,
) -> ort.InferenceSession:
    """Open one ONNX graph as an InferenceSession on ``provider`` ('cpu', 'cuda', 'tensorrt').

    trt_options: TensorRT EP provider options (see tensorrt_ep_options), used when provider is 'tensorrt'.
    low_priority: the session is created on a thread at the lowest priority (lower_thread_priority), so its
    intra-op threads, started with it, run there: graphs that must leave the cores to others at once.
    """
    if low_priority:
        out: list = []

        def create() -> None:
            lower_thread_priority()
            try:
                out.append(make_session(path, provider, threads, optimization, spin, trt_options,
                                        spin_stop=spin_stop))
            except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread below
                out.append(exc)

        thread = threading.Thread(target=create, name="coverpruner-session")
        thread.start()
        thread.join()
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]
    path = Path(path)
    providers = ort_providers(provider)
    if provider == "tensorrt" and trt_options:
        providers = [(p, trt_options) if p == "TensorrtExecutionProvider" else p for p in providers]
    options = session_options(threads, optimization, spin, spin_stop)
    if not path.is_file():
        raise FileNotFoundError(f"graph file not found: {path}")
    if provider != "cpu":
        preload_gpu_libraries()
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:  # ORT raises its own exception types with long messages
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeError(f"cannot load graph {path.name} on provider {provider!r}: {first}") from exc
    if provider != "cpu":
        check_session_providers(session, provider, path)
    return session


#: A session factory: (graph name, graph path) -> an object with ORT's InferenceSession API.
SessionFactory = Callable[[str, Path], ort.InferenceSession]


@dataclass(frozen=True)
class OrtSessionFactory:
    """Default factory the Pipeline calls once per graph; a TensorRT engine factory can replace it."""

    provider: str = "cpu"
    threads: int | None = None
    optimization: str = "all"
    #: graphs run back to back in the decode loop; the others run once and are followed by numpy work
    spinning_graphs: tuple = ("embed", "decoder")
    #: the engine dir's manifest: with provider 'tensorrt' it gives the EP its profiles and precision
    manifest: dict | None = None
    #: where the TensorRT EP keeps engines and timing cache (default: <engine dir>/ort_trt_cache)
    trt_cache_dir: Path | None = None
    #: the sessions' intra-op threads at the lowest priority (make_session)
    low_priority: bool = False
    #: the spinning graphs' threads stop spinning when a run ends (session_options)
    spin_stop: bool = False

    def __post_init__(self) -> None:
        ort_providers(self.provider)  # fail early with the clear message

    def __call__(self, name: str, path: Path) -> ort.InferenceSession:
        trt = None
        if self.provider == "tensorrt" and self.manifest is not None:
            cache = self.trt_cache_dir or Path(path).parent / "ort_trt_cache"
            trt = tensorrt_ep_options(self.manifest, name, cache)
        return make_session(path, self.provider, self.threads, self.optimization, name in self.spinning_graphs,
                            trt, self.low_priority, self.spin_stop)
