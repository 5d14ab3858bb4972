"""coverpruner-doctor: verify this machine's GPU path in one command (a Jetson, a workstation, a datacenter GPU).

    coverpruner-doctor [--workdir DIR] [--engine-dir DIR] [--out DIR] [--skip-timing]

1. reports the device, driver, CUDA runtime, nvcc, CMake, TensorRT and ONNX Runtime versions;
2. builds the tiny random-weight LLaVA-1.5 engine dir (or uses --engine-dir) and answers on the CPU provider:
   the reference every GPU answer is compared with;
3. runs the GPU checks, each "pass", "fail" or "skip" with the reason:
   - kernel: libcoverpruner_selector.so (built here with CMake for this GPU) == the float64 reference selector
     (same indices, or a set whose float64 objective is not worse than the reference's x (1 - 1e-7): the float32
     rule), at n = 576, 1,000 and 2,880, batch 1 and 3, fp32 and fp16;
   - ort-cuda: the engine dir (without --engine-dir: the checkpoint exported in fp16 with the ORT-form decoder,
     the form the CUDA provider batches with) on ONNX Runtime's CUDA provider answers its CPU provider's tokens,
     and an ORT-form dir batched there (KV cache in GPU memory) answers its batch-1 tokens;
   - plugin-engine: the TensorRT plugin selector (plugin-form export + coverpruner-build --plugin) answers the CPU
     provider's tokens through the TensorRT engines;
4. times the CUDA selector at the paper's shapes (n = 576 and 2,880, d = 4,096) and sets each time beside the
   paper's A6000 overhead (Table "Overhead breakdown": similarity + coverage selection);
5. writes doctor.json and doctor.md into --out (default: the workdir), each written to a temporary file and
   renamed.

Exit 0 when nothing failed (skipped checks say why: no GPU, no TensorRT, no nvcc, ...), 1 when a check failed,
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from coverpruner.demo import DEMO_IMAGE, prepare

PROMPT = "What is shown in this image?"
BUDGET = 16
NEW_TOKENS = 8
# Paper, appendix "Overhead breakdown" (RTX A6000, fp16): similarity + coverage selection, ms per example
PAPER_OVERHEAD_MS = {(576, 128): 0.052 + 0.092, (576, 64): 0.052 + 0.060, (576, 32): 0.052 + 0.038,
                     (2880, 640): 0.940 + 0.742, (2880, 320): 0.940 + 0.391, (2880, 160): 0.940 + 0.233}
FLOAT32_RULE_RTOL = 1e-7


@dataclass
class Check:
    name: str
    status: str  # "pass" | "fail" | "skip"
    detail: str
    seconds: float = 0.0
    data: dict = field(default_factory=dict)


class Skip(Exception):
    """A check cannot run here; the message says why."""


def _timed(name: str, fn, *args) -> Check:
    start = time.perf_counter()
    try:
        detail, data = fn(*args)
        status = "pass"
    except Skip as exc:
        detail, data, status = str(exc), {}, "skip"
    except AssertionError as exc:
        detail, data, status = str(exc), {}, "fail"
    except Exception as exc:  # a GPU check that crashes is a failed check, reported with its message
        detail, data, status = f"{type(exc).__name__}: {exc}", {}, "fail"
    return Check(name, status, detail, round(time.perf_counter() - start, 3), data)


# --- environment --------------------------------------------------------------------------------------------------
def environment() -> dict:
    """Versions and the device, each a string (or the reason it is unknown)."""
    from coverpruner.engines import native_build
    from coverpruner.engines.cudart import CudaError, cudart, device_problem

    env = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import onnxruntime as ort

        env["onnxruntime"] = f"{ort.__version__} (providers: {', '.join(ort.get_available_providers())})"
    except ImportError as exc:
        env["onnxruntime"] = f"not installed ({exc})"
    from coverpruner.engines.tensorrt import TensorRTBuildError, load_tensorrt

    try:
        trt = load_tensorrt()
        env["tensorrt"] = f"{trt.flavour} {trt.version}"
    except TensorRTBuildError as exc:
        env["tensorrt"] = f"not usable ({exc})"
    nvcc = native_build.find_nvcc()
    env["nvcc"] = str(nvcc) if nvcc else "not found"
    cmake = native_build.cmake_version()
    env["cmake"] = ".".join(map(str, cmake)) if cmake else "not found"
    problem = device_problem()
    env["gpu"] = problem or "usable"
    try:
        import ctypes

        lib = cudart()
        for key, fn in (("cuda_runtime", "cudaRuntimeGetVersion"), ("cuda_driver", "cudaDriverGetVersion")):
            v = ctypes.c_int(0)
            status = getattr(lib, fn)(ctypes.byref(v))
            env[key] = f"{v.value // 1000}.{v.value % 1000 // 10}" if status == 0 and v.value else "none"
        if problem is None:
            from coverpruner.engines.tensorrt import detect_compute_capability

            name = ctypes.create_string_buffer(256)
            # cudaDeviceGetAttribute cannot give the name; cudaGetDeviceProperties' layout changes between CUDA
            # versions, but `name` is its first member in all of them
            props = ctypes.create_string_buffer(8192)
            get_props = getattr(lib, "cudaGetDeviceProperties_v2", None) or lib.cudaGetDeviceProperties
            if get_props(props, 0) == 0:
                name.value = props.raw[:256].split(b"\0", 1)[0]
            env["device"] = f"{name.value.decode(errors='replace')} (compute capability "
            env["device"] += f"{detect_compute_capability()})"
    except CudaError as exc:
        env["cuda_runtime"] = f"not found ({exc})"
    return env


def gpu_problem() -> str | None:
    from coverpruner.engines.cudart import device_problem

    problem = device_problem()
    return None if problem is None else f"no usable CUDA GPU: {problem}"


# --- the checks ---------------------------------------------------------------------------------------------------
def build_selector_library(workdir: Path):
    """libcoverpruner_selector.so (and the plugin where TensorRT headers exist) for this GPU -> NativeLibs."""
    from coverpruner.engines import native_build
    from coverpruner.engines.tensorrt import detect_compute_capability

    if (problem := gpu_problem()) is not None:
        raise Skip(problem)
    if native_build.find_nvcc() is None:
        raise Skip("nvcc not found ($CUDACXX, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin): cannot build the kernels")
    if native_build.find_cublas()[0] is None:
        raise Skip("cublas_v2.h not found (CUDA toolkit or `pip install nvidia-cublas`)")
    arch = native_build.native_architecture(detect_compute_capability())
    return native_build.build_native(workdir / "native", cuda_architectures=arch)


def _clustered(rng, batch: int, n: int, d: int):
    import numpy as np

    centres = rng.standard_normal((batch, max(2, n // 8), d))
    v = np.stack([c[rng.integers(0, len(c), n)] for c in centres]) + 0.5 * rng.standard_normal((batch, n, d))
    return v.astype(np.float32)


def run_kernel(selector, v, r, budget: int):
    """CudaCoverageSelector on numpy inputs through libcudart buffers (no torch): keep [B, m]."""
    import numpy as np

    from coverpruner.engines.cuda_selector import CP_DTYPE_FLOAT16, CP_DTYPE_FLOAT32
    from coverpruner.engines.cudart import DeviceBuffer, Stream

    batch, n, d = v.shape
    dtype = CP_DTYPE_FLOAT16 if v.dtype == np.float16 else CP_DTYPE_FLOAT32
    stream = Stream()
    feats, rel, keep, ws = DeviceBuffer(), DeviceBuffer(), DeviceBuffer(), DeviceBuffer()
    feats.upload(v, stream)
    rel.upload(np.ascontiguousarray(r, np.float32), stream)
    m = min(budget, n)
    keep.ensure(batch * m * 8)
    nbytes = selector.workspace_size(batch, n, d, dtype)
    ws.ensure(nbytes)
    selector.raw_select(feats.ptr, dtype, rel.ptr, batch, n, d, budget, 0.3, keep.ptr, ws.ptr, nbytes,
                        stream.handle)
    out = keep.download(np.empty((batch, m), np.int64), stream)
    stream.synchronize()
    return out, (stream, feats, rel, keep, ws)


def same_or_not_worse(got, features, relevance, budget: int) -> str | None:
    """None when `got` is the float64 reference's set, or a set with an objective >= its x (1 - 1e-7)."""
    import numpy as np

    from coverpruner.selection import coverage_select
    from coverpruner.selection.coverage import coverage_utilities, demand_weights

    want = coverage_select(features, relevance, budget=budget, backend="reference")
    if np.array_equal(got, want):
        return None
    a, w = coverage_utilities(features), demand_weights(relevance)
    f_got, f_want = float(w @ a[:, got].max(axis=1)), float(w @ a[:, want].max(axis=1))
    if got.shape == want.shape and np.all(np.diff(got) > 0) and f_got >= f_want * (1 - FLOAT32_RULE_RTOL):
        return None
    return f"objective {f_got!r} < reference {f_want!r} x (1 - {FLOAT32_RULE_RTOL}) (differing: " \
           f"{np.setxor1d(got, want).tolist()[:10]})"


def check_kernel(libs) -> tuple[str, dict]:
    import numpy as np

    from coverpruner.engines.cuda_selector import CudaCoverageSelector

    selector = CudaCoverageSelector(libs.selector)
    rng = np.random.default_rng(0)
    cases = []
    for n, d, budget, batch, fp16 in ((576, 1024, 64, 1, False), (1000, 512, 100, 3, False),
                                      (2880, 512, 320, 1, False), (576, 1024, 64, 3, True)):
        v = _clustered(rng, batch, n, d)
        r = rng.random((batch, n)).astype(np.float32)
        if fp16:
            v = v.astype(np.float16)
        keep, _ = run_kernel(selector, v, r, budget)
        for b in range(batch):
            problem = same_or_not_worse(keep[b], v[b].astype(np.float64), r[b], budget)
            assert problem is None, f"n={n} batch row {b}{' fp16' if fp16 else ''}: {problem}"
        cases.append(f"n={n} d={d} m={budget} batch={batch}{' fp16' if fp16 else ''}")
    return "kernel == float64 reference (float32 rule): " + "; ".join(cases), {"cases": cases}


def _answers(engine_dir: Path, provider: str, **load) -> list[int]:
    from coverpruner.runtime import Pipeline

    pipe = Pipeline.load(engine_dir, provider=provider, **load)
    return pipe.generate(str(DEMO_IMAGE), PROMPT, budget=BUDGET, max_new_tokens=NEW_TOKENS,
                         ignore_eos=True).token_ids


def fp16_ort_dir(workdir: Path) -> Path:
    """The doctor's checkpoint exported with --dtype fp16 --decoder-form ort (the form ONNX Runtime's CUDA provider
    batches with; its fp32 ORT form has no CUDA GroupQueryAttention kernel), reused when present."""
    from coverpruner.engine_dir import read_if_present
    from coverpruner.export.exporter import ExportOptions, export_model

    out = workdir / "tiny-engine-fp16-ort"
    if read_if_present(out) is None:
        export_model(workdir / "tiny-checkpoint", out, "coverpruner doctor (fp16, ORT-form decoder)",
                     ExportOptions(dtype="fp16", decoder_form="ort", progress=False))
    return out


def check_ort_cuda(engine_dir: Path) -> tuple[str, dict]:
    """engine_dir on ONNX Runtime's CUDA provider answers its CPU provider's tokens; an ORT-form dir also batches
    there (3 requests over 2 slots, KV cache in device memory) with the batch-1 tokens."""
    import onnxruntime as ort

    from coverpruner.runtime import Pipeline

    if (problem := gpu_problem()) is not None:
        raise Skip(problem)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise Skip(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (pip install onnxruntime-gpu)")
    cpu_tokens = _answers(engine_dir, "cpu", threads=2)
    pipe = Pipeline.load(engine_dir, provider="cuda")
    jobs = [dict(image=str(DEMO_IMAGE), prompt=PROMPT, budget=budget, max_new_tokens=NEW_TOKENS, ignore_eos=True)
            for budget in (BUDGET, "full", 4)]
    tokens = pipe.generate(**jobs[0]).token_ids
    assert tokens == cpu_tokens, f"CUDA provider tokens {tokens} != CPU provider tokens {cpu_tokens}"
    detail = f"CUDA provider answers the CPU tokens ({len(tokens)} tokens, {pipe.decoder_form}-form decoder)"
    if pipe.decoder_form == "ort":
        alone = [tokens] + [pipe.generate(**j).token_ids for j in jobs[1:]]
        batched = [r.token_ids for r in pipe.batch_generate(jobs, max_batch=2, capacity=256)]
        assert batched == alone, f"batched CUDA tokens {batched} != batch-1 tokens {alone}"
        detail += "; batched (3 requests over 2 slots, KV in GPU memory) == batch 1"
    return detail, {"tokens": tokens, "engine_dir": str(engine_dir)}


def check_plugin_engine(workdir: Path, libs, cpu_tokens: list[int]) -> tuple[str, dict]:
    from coverpruner.engines.tensorrt import BuildOptions, TensorRTBuildError, build_engine_dir, load_tensorrt
    from coverpruner.export.exporter import ExportOptions, export_model

    if (problem := gpu_problem()) is not None:
        raise Skip(problem)
    if libs is None or libs.plugin is None:
        raise Skip("the TensorRT plugin was not built (TensorRT headers not found: set TENSORRT_ROOT)")
    try:
        trt = load_tensorrt()
    except TensorRTBuildError as exc:
        raise Skip(str(exc)) from exc
    plugin_dir = workdir / "tiny-engine-plugin"
    if plugin_dir.exists():
        shutil.rmtree(plugin_dir)
    export_model(workdir / "tiny-checkpoint", plugin_dir, "coverpruner doctor (plugin selector)",
                 ExportOptions(progress=False, selector_form="plugin"))
    build_engine_dir(plugin_dir, BuildOptions(plugin=libs.plugin), trt)
    tokens = _answers(plugin_dir, "tensorrt", selector="onnx")
    assert tokens == cpu_tokens, f"TensorRT + plugin tokens {tokens} != CPU provider tokens {cpu_tokens}"
    return f"{trt.flavour} {trt.version} engines with the plugin selector answer the CPU tokens", {"tokens": tokens}


def time_selector(libs, repeats: int = 20) -> tuple[str, dict]:
    """Median wall ms of one selector call (stream synchronised), fp16 features, d = 4,096, vs the paper."""
    import numpy as np

    from coverpruner.engines.cuda_selector import CP_DTYPE_FLOAT16, CudaCoverageSelector

    selector = CudaCoverageSelector(libs.selector)
    rng = np.random.default_rng(1)
    rows = []
    for (n, m), paper in PAPER_OVERHEAD_MS.items():
        v = _clustered(rng, 1, n, 4096).astype(np.float16)
        r = rng.random((1, n)).astype(np.float32)
        _, (stream, feats, rel, keep, ws) = run_kernel(selector, v, r, m)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            selector.raw_select(feats.ptr, CP_DTYPE_FLOAT16, rel.ptr, 1, n, 4096, m, 0.3, keep.ptr, ws.ptr,
                                ws.nbytes, stream.handle)
            stream.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        ms = statistics.median(times)
        rows.append({"n": n, "m": m, "ms": round(ms, 4), "paper_a6000_ms": paper, "ratio": round(ms / paper, 2)})
    return "; ".join(f"n={x['n']} m={x['m']}: {x['ms']:.3f} ms ({x['ratio']}x paper)" for x in rows), {"rows": rows}


# --- report -------------------------------------------------------------------------------------------------------
def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def markdown(env: dict, checks: list[Check]) -> str:
    lines = ["# coverpruner-doctor", "", "| component | version / state |", "|---|---|"]
    lines += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in env.items()]
    lines += ["", "| check | status | seconds | detail |", "|---|---|---|---|"]
    lines += [f"| {c.name} | {c.status} | {c.seconds} | {c.detail.replace('|', '/')} |" for c in checks]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coverpruner-doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=Path("coverpruner-doctor"),
                   help="checkpoint, engine dirs and native build go here (default ./coverpruner-doctor)")
    p.add_argument("--engine-dir", type=Path, default=None,
                   help="use this tiny LLaVA-1.5 engine dir instead of exporting one (standard-form, fp32)")
    p.add_argument("--out", type=Path, default=None, help="where doctor.json / doctor.md go (default: workdir)")
    p.add_argument("--skip-timing", action="store_true", help="leave out the selector timings")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from coverpruner.runtime import CoverPrunerError

    workdir, out = args.workdir, args.out or args.workdir
    if args.engine_dir is not None and not (args.engine_dir / "manifest.json").is_file():
        print(f"coverpruner-doctor: error: --engine-dir {args.engine_dir}: no manifest.json there", file=sys.stderr)
        return 2
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"coverpruner-doctor: error: {exc}", file=sys.stderr)
        return 2
    env = environment()
    for k, v in env.items():
        print(f"{k:>13}: {v}", flush=True)
    checks: list[Check] = []

    def engine():
        path = args.engine_dir or prepare(workdir)
        return f"{'given' if args.engine_dir else 'tiny LLaVA-1.5, exported here'}: {path}", {"engine_dir": str(path)}

    checks.append(_timed("engine-dir", engine))
    cpu_tokens: list[int] = []

    def cpu():
        if checks[0].status != "pass":
            raise Skip("no engine dir")
        cpu_tokens.extend(_answers(Path(checks[0].data["engine_dir"]), "cpu", threads=2))
        return f"CPU provider answer: {len(cpu_tokens)} tokens (the reference of the GPU checks)", {
            "tokens": cpu_tokens}

    checks.append(_timed("cpu-answer", cpu))
    libs_box = {}

    def build():
        libs_box["libs"] = build_selector_library(workdir)
        libs = libs_box["libs"]
        return f"built {libs.selector.name}" + (f" and {libs.plugin.name}" if libs.plugin else ""), {}

    checks.append(_timed("native-build", build))
    libs = libs_box.get("libs")

    def needs(what, ok: bool, why: str):
        """A GPU check: skipped first for a missing GPU, then for a missing prerequisite."""
        if (problem := gpu_problem()) is not None:
            raise Skip(problem)
        if not ok:
            raise Skip(why)
        return what()

    checks.append(_timed("kernel", lambda: needs(lambda: check_kernel(libs), libs is not None,
                                                 f"native build: {checks[2].detail}")))
    checks.append(_timed("ort-cuda", lambda: needs(
        lambda: check_ort_cuda(args.engine_dir or fp16_ort_dir(workdir)), bool(cpu_tokens),
        "no CPU answer (the engine dir does not run)")))
    checks.append(_timed("plugin-engine", lambda: needs(lambda: check_plugin_engine(workdir, libs, cpu_tokens),
                                                        bool(cpu_tokens) and args.engine_dir is None,
                                                        "needs the doctor's own checkpoint (no --engine-dir) and "
                                                        "a CPU answer")))
    if not args.skip_timing:
        checks.append(_timed("selector-timing", lambda: needs(lambda: time_selector(libs), libs is not None,
                                                              f"native build: {checks[2].detail}")))
    for c in checks:
        print(f"[{c.status:>4}] {c.name}: {c.detail}", flush=True)
    try:
        _write_atomic(out / "doctor.json", json.dumps({"environment": env, "checks": [asdict(c) for c in checks]},
                                                      indent=2))
        _write_atomic(out / "doctor.md", markdown(env, checks))
    except (OSError, CoverPrunerError) as exc:
        print(f"coverpruner-doctor: error: cannot write the report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {out / 'doctor.json'}, {out / 'doctor.md'}")
    return 1 if any(c.status == "fail" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
