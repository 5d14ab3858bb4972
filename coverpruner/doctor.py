"""coverpruner-doctor: verify this machine's GPU path in one command (a Jetson, a workstation, a datacenter GPU).

    coverpruner-doctor [--workdir DIR] [--engine-dir DIR] [--out DIR] [--skip-timing] [--prepare-only]

1. reports the device, the driver release (NVML; /proc/driver/nvidia/version; a Jetson's L4T release), the CUDA
   runtime it found and the driver's CUDA API level, nvcc, CMake, TensorRT and ONNX Runtime versions, and checks
   that one ONNX Runtime build is installed (onnxruntime and onnxruntime-gpu together: fail, with the commands);
2. exports the tiny random-weight LLaVA-1.5 engine dirs into the workdir (reused when present: --prepare-only on a
   machine with torch, then copy the workdir to a device without it), or uses --engine-dir, and answers on the
   CPU provider: the reference every GPU answer is compared with;
3. runs the GPU checks, each "pass", "fail" or "skip" with the reason:
   - kernel: libcoverpruner_selector.so (built here with CMake for this GPU) == the float64 reference selector
     (same indices, or a set whose float64 objective is not worse than the reference's x (1 - 1e-7): the float32
     rule), at n = 576, 1,000 and 2,880, batch 1 and 3, fp32 and fp16;
   - ort-cuda: the engine dir (without --engine-dir: the checkpoint exported in fp16 with the ORT-form decoder,
     the form the CUDA provider batches with) on ONNX Runtime's CUDA provider answers its CPU provider's tokens,
     and an ORT-form dir batched there (KV cache in GPU memory) answers its batch-1 tokens;
   - plugin-engine: the TensorRT plugin selector (plugin-form export + coverpruner-build --plugin) answers the CPU
     provider's tokens through the TensorRT engines;
   token comparisons accept a flip only at a near-tie of the reference (NEAR_TIE_NATS), reported with its margin;
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
TOP_LOGPROBS = 20
# A greedy token may flip between two runs only where the reference's top two tokens are this close (log-probability
# gap = logit gap, nats): the rounding by which the runs' logits legitimately differ, twice (each token's logit can
# move). fp32: kernels and summation orders differ (TensorRT vs ONNX Runtime, CUDA vs CPU), ~1e-5 relative on logits
# of magnitude <= 10; fp16: the fp16 ORT-form decoder's logits stay within 5e-3 x their scale of the fp32 ones
# (tests/engines/test_ort_form_fp16.py), scale <= 3 for the doctor's tiny checkpoint.
NEAR_TIE_NATS = {"fp32": 2e-4, "fp16": 3e-2}
ORT_GPU_HINT = ("pip uninstall -y onnxruntime && pip install \"onnxruntime-gpu[cuda,cudnn]\" (coverpruner's `gpu` "
                "extra; Jetson: NVIDIA's wheel, docs/tensorrt.md)")


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
def onnxruntime_builds() -> dict[str, str]:
    """{distribution: version} of the ONNX Runtime builds installed (onnxruntime, onnxruntime-gpu, ...)."""
    from importlib import metadata

    found = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name == "onnxruntime" or name.startswith("onnxruntime-") and name.split("-", 1)[1] in (
                "gpu", "directml", "openvino", "qnn", "rocm", "training"):
            found[name] = dist.version
    return found


def check_onnxruntime_install() -> tuple[str, dict]:
    """One ONNX Runtime build installed. onnxruntime and onnxruntime-gpu both write site-packages/onnxruntime: with
    both, whichever pip wrote last is what runs (often the CPU build: no CUDA provider), and uninstalling either
    deletes files the other needs. Fails with the exact commands that leave only the GPU build."""
    import onnxruntime as ort

    builds = onnxruntime_builds()
    providers = ort.get_available_providers()
    if len(builds) > 1:
        gpu = builds.get("onnxruntime-gpu")
        keep = f"onnxruntime-gpu[cuda,cudnn]=={gpu}" if gpu else "onnxruntime"
        raise AssertionError(
            f"{' and '.join(f'{k} {v}' for k, v in sorted(builds.items()))} are installed together and share "
            f"site-packages/onnxruntime (the one running has {providers}); keep one: `pip uninstall -y "
            f"{' '.join(sorted(builds))} && pip install \"{keep}\"` (a Jetson: NVIDIA's onnxruntime-gpu wheel, "
            "docs/tensorrt.md). Something that requires onnxruntime (e.g. onnxruntime-genai) brings the CPU build back")
    (name, version), = builds.items() if builds else (("onnxruntime", ort.__version__),)
    return f"{name} {version} only (providers: {', '.join(providers)})", {"builds": builds, "providers": providers}


def environment() -> dict:
    """Versions and the device, each a string (or the reason it is unknown)."""
    import ctypes

    from coverpruner.engines import native_build
    from coverpruner.engines.cudart import CudaError, compute_capability, cudart, cudart_path, device_problem, \
        runtime_version
    from coverpruner.engines.nvml import driver_release

    env = {"python": platform.python_version(), "machine": platform.machine()}
    import onnxruntime as ort

    builds = ", ".join(f"{k} {v}" for k, v in sorted(onnxruntime_builds().items())) or ort.__version__
    env["onnxruntime"] = f"{builds} (providers: {', '.join(ort.get_available_providers())})"
    from coverpruner.engines.tensorrt import TensorRTBuildError, load_tensorrt, strongly_typed

    try:
        trt = load_tensorrt()
        env["tensorrt"] = f"{trt.flavour} {trt.version}{' (strongly typed)' if strongly_typed(trt) else ''}"
    except TensorRTBuildError as exc:
        env["tensorrt"] = f"not usable ({exc})"
    nvcc = native_build.find_nvcc()
    env["nvcc"] = str(nvcc) if nvcc else "not found"
    cmake = native_build.cmake_version()
    env["cmake"] = ".".join(map(str, cmake)) if cmake else "not found"
    problem = device_problem()
    env["gpu"] = problem or "usable"
    env["driver"] = driver_release()
    try:
        lib = cudart()
        env["cuda_runtime"] = f"{runtime_version() or 'unknown'} ({cudart_path()})"
        v = ctypes.c_int(0)
        status = lib.cudaDriverGetVersion(ctypes.byref(v))
        # the newest CUDA API the driver supports (not its release: that is "driver")
        env["cuda_driver_api"] = f"{v.value // 1000}.{v.value % 1000 // 10}" if status == 0 and v.value else "none"
        if problem is None:
            # cudaDeviceGetAttribute cannot give the name; cudaGetDeviceProperties' layout changes between CUDA
            # versions, but `name` is its first member in all of them
            props = ctypes.create_string_buffer(8192)
            get_props = getattr(lib, "cudaGetDeviceProperties_v2", None) or lib.cudaGetDeviceProperties
            name = props.raw[:256].split(b"\0", 1)[0] if get_props(props, 0) == 0 else b"?"
            env["device"] = f"{name.decode(errors='replace')} (compute capability {compute_capability()})"
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
    from coverpruner.engines.cudart import compute_capability

    if (problem := gpu_problem()) is not None:
        raise Skip(problem)
    if native_build.find_nvcc() is None:
        raise Skip("nvcc not found ($CUDACXX, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin): cannot build the kernels")
    if native_build.find_cublas()[0] is None:
        raise Skip("cublas_v2.h not found (CUDA toolkit or `pip install nvidia-cublas`)")
    arch = native_build.native_architecture(compute_capability())
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


def answer_steps(pipe, jobs: list[dict], max_batch: int = 1, capacity: int | None = None) -> list[list]:
    """Each job's greedy answer as its per-step TokenLogprob (token, log-probability, the TOP_LOGPROBS best),
    decoded through the runtime's Engine alone (max_batch 1) or side by side in max_batch slots."""
    engine = pipe.engine(max_batch, capacity)
    rids = [engine.submit(pipe.request(**job, logprobs=True, top_logprobs=TOP_LOGPROBS)) for job in jobs]
    steps: dict[int, list] = {rid: [] for rid in rids}
    while engine.pending:
        for event in engine.step():
            if event.error is not None:
                raise event.error
            if event.logprob is not None:
                steps[event.request_id].append(event.logprob)
    return [steps[rid] for rid in rids]


def compare_answers(want: list, got: list, near_tie_nats: float, what: str) -> str:
    """'' when two greedy answers (answer_steps) have the same tokens; at the first step where they differ, a flip
    is accepted only at a measured near-tie: the reference's log-probabilities of the two tokens (their logit gap)
    within near_tie_nats, as rounding legitimately moves between precisions or batch shapes; then the returned
    text reports the margin (later tokens follow different prefixes, so they are not compared). Anything else
    raises AssertionError with the margin."""
    for t, (a, b) in enumerate(zip(want, got)):
        if a.token == b.token:
            continue
        alternatives = dict(a.top)
        if b.token not in alternatives:
            raise AssertionError(f"{what}: step {t} gives token {b.token} where the reference gives {a.token}, and "
                                 f"{b.token} is not among the reference's {len(a.top)} most likely tokens")
        margin = a.logprob - alternatives[b.token]
        if margin > near_tie_nats:
            raise AssertionError(f"{what}: step {t} gives token {b.token} where the reference gives {a.token}, "
                                 f"{margin:.3g} nats more likely there: not a near-tie (<= {near_tie_nats:g})")
        return (f"{what}: flip at step {t} ({a.token} -> {b.token}) at a near-tie, margin {margin:.3g} nats "
                f"<= {near_tie_nats:g}")
    if len(want) != len(got):
        raise AssertionError(f"{what}: {len(got)} tokens where the reference has {len(want)}")
    return ""


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
    there (3 requests over 2 slots, KV cache in device memory) with the batch-1 tokens. A flip is accepted only at
    a near-tie (compare_answers), reported with its margin."""
    import onnxruntime as ort

    from coverpruner.runtime import Pipeline

    if (problem := gpu_problem()) is not None:
        raise Skip(problem)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise Skip(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider: {ORT_GPU_HINT}")
    jobs = [dict(image=str(DEMO_IMAGE), prompt=PROMPT, budget=budget, max_new_tokens=NEW_TOKENS, ignore_eos=True)
            for budget in (BUDGET, "full", 4)]
    pipe = Pipeline.load(engine_dir, provider="cuda")
    cpu = Pipeline.load(engine_dir, provider="cpu", threads=2)
    nats = NEAR_TIE_NATS[pipe.manifest.precision]
    alone = answer_steps(pipe, jobs)
    notes = [compare_answers(c, g, nats, f"budget {j['budget']}: CUDA vs CPU provider")
             for c, g, j in zip(answer_steps(cpu, jobs), alone, jobs)]
    tokens = [x.token for x in alone[0]]
    detail = (f"CUDA provider answers the CPU tokens ({len(tokens)} tokens x {len(jobs)} budgets, "
              f"{pipe.decoder_form}-form decoder)")
    if pipe.decoder_form == "ort":
        batched = answer_steps(pipe, jobs, max_batch=2, capacity=256)
        notes += [compare_answers(a, b, nats, f"budget {j['budget']}: batched vs alone")
                  for a, b, j in zip(alone, batched, jobs)]
        detail += "; batched (3 requests over 2 slots, KV in GPU memory) == batch 1"
    notes = [n for n in notes if n]
    return detail + "".join(f"; {n}" for n in notes), {"tokens": tokens, "engine_dir": str(engine_dir),
                                                         "near_ties": notes}


def plugin_form_dir(workdir: Path) -> Path:
    """The doctor's checkpoint exported with the plugin-form selector, reused when present (a copied workdir)."""
    from coverpruner.engine_dir import read_if_present

    out = workdir / "tiny-engine-plugin"
    manifest = read_if_present(out)
    if manifest is None or manifest.get("selector_form") != "plugin":
        from coverpruner.export.exporter import ExportOptions, export_model

        if out.exists():
            shutil.rmtree(out)
        export_model(workdir / "tiny-checkpoint", out, "coverpruner doctor (plugin selector)",
                     ExportOptions(progress=False, selector_form="plugin"))
    return out


def check_plugin_engine(workdir: Path, libs, cpu_engine_dir: Path) -> tuple[str, dict]:
    """The plugin-form export built into TensorRT engines with the plugin answers the CPU provider's tokens on
    the same checkpoint (flips only at a near-tie, reported)."""
    from coverpruner.engines.tensorrt import BuildOptions, TensorRTBuildError, build_engine_dir, load_tensorrt
    from coverpruner.runtime import Pipeline

    if (problem := gpu_problem()) is not None:
        raise Skip(problem)
    if libs is None or libs.plugin is None:
        raise Skip("the TensorRT plugin was not built (TensorRT headers not found: set TENSORRT_ROOT)")
    try:
        trt = load_tensorrt()
    except TensorRTBuildError as exc:
        raise Skip(str(exc)) from exc
    plugin_dir = plugin_form_dir(workdir)
    build_engine_dir(plugin_dir, BuildOptions(plugin=libs.plugin), trt)
    job = dict(image=str(DEMO_IMAGE), prompt=PROMPT, budget=BUDGET, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    (want,) = answer_steps(Pipeline.load(cpu_engine_dir, provider="cpu", threads=2), [job])
    (got,) = answer_steps(Pipeline.load(plugin_dir, provider="tensorrt", selector="onnx"), [job])
    note = compare_answers(want, got, NEAR_TIE_NATS["fp32"], "TensorRT + plugin vs CPU provider")
    return (f"{trt.flavour} {trt.version} engines with the plugin selector answer the CPU tokens"
            + (f"; {note}" if note else "")), {"tokens": [x.token for x in got], "near_ties": [note] if note else []}


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
    p.add_argument("--prepare-only", action="store_true",
                   help="only export the doctor's tiny engine dirs into --workdir (needs the export extra) and stop: "
                        "copy the workdir to a device without torch (a Jetson) and run the doctor there on it")
    return p


def doctor_dirs(workdir: Path) -> Path:
    """The tiny checkpoint's engine dirs under workdir (fp32 standard form, fp16 ORT form, plugin-form selector),
    each reused when present; returns the fp32 one. Exporting needs the export extra: without torch (a runtime-only
    install) the dirs must have been prepared elsewhere (--prepare-only) and copied here."""
    from coverpruner.engine_dir import read_if_present

    engine = workdir / "tiny-engine"
    if read_if_present(engine) is not None:
        return engine
    try:
        import torch  # noqa: F401  (only to say which extra is missing, before any export starts)
    except ImportError as exc:
        raise Skip(f"no engine dir in {workdir} and exporting one needs the 'export' extra ({exc}): run "
                   "`coverpruner-doctor --prepare-only --workdir DIR` where torch is installed and copy DIR here, or "
                   "pass --engine-dir") from None
    return prepare(workdir)


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
    if args.prepare_only:
        engine = prepare(workdir)
        print(f"prepared {engine}, {fp16_ort_dir(workdir)} and {plugin_form_dir(workdir)}: copy {workdir} to the "
              f"device and run `coverpruner-doctor --workdir {workdir.name}` there")
        return 0
    env = environment()
    for k, v in env.items():
        print(f"{k:>15}: {v}", flush=True)
    checks: list[Check] = [_timed("onnxruntime-install", check_onnxruntime_install)]

    def engine():
        path = args.engine_dir or doctor_dirs(workdir)
        return f"{'given' if args.engine_dir else 'tiny LLaVA-1.5, in the workdir'}: {path}", {"engine_dir": str(path)}

    checks.append(_timed("engine-dir", engine))
    engine_check = checks[-1]
    cpu_tokens: list[int] = []

    def cpu():
        if engine_check.status != "pass":
            raise Skip(f"no engine dir ({engine_check.detail})")
        cpu_tokens.extend(_answers(Path(engine_check.data["engine_dir"]), "cpu", threads=2))
        return f"CPU provider answer: {len(cpu_tokens)} tokens (the reference of the GPU checks)", {
            "tokens": cpu_tokens}

    checks.append(_timed("cpu-answer", cpu))
    libs_box = {}

    def build():
        libs_box["libs"] = build_selector_library(workdir)
        libs = libs_box["libs"]
        return f"built {libs.selector.name}" + (f" and {libs.plugin.name}" if libs.plugin else ""), {}

    checks.append(_timed("native-build", build))
    native_check = checks[-1]
    libs = libs_box.get("libs")

    def needs(what, ok: bool, why: str):
        """A GPU check: skipped first for a missing GPU, then for a missing prerequisite."""
        if (problem := gpu_problem()) is not None:
            raise Skip(problem)
        if not ok:
            raise Skip(why)
        return what()

    checks.append(_timed("kernel", lambda: needs(lambda: check_kernel(libs), libs is not None,
                                                 f"native build: {native_check.detail}")))
    checks.append(_timed("ort-cuda", lambda: needs(
        lambda: check_ort_cuda(args.engine_dir or fp16_ort_dir(workdir)), bool(cpu_tokens),
        "no CPU answer (the engine dir does not run)")))
    checks.append(_timed("plugin-engine", lambda: needs(
        lambda: check_plugin_engine(workdir, libs, Path(engine_check.data["engine_dir"])),
        bool(cpu_tokens) and args.engine_dir is None,
        "needs the doctor's own checkpoint (no --engine-dir) and a CPU answer")))
    if not args.skip_timing:
        checks.append(_timed("selector-timing", lambda: needs(lambda: time_selector(libs), libs is not None,
                                                              f"native build: {native_check.detail}")))
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
