#!/usr/bin/env bash
# The one script to run first on any GPU (a lent machine, a workstation, a Jetson), under 8 minutes (the step
# limits add up to 7:40): coverpruner-doctor, the `gpu`-marked tests, the CUDA selector benchmark (beside the paper's
# overhead table: doctor's selector-timing) and the fp16 ORT-form decoder batched on ONNX Runtime's CUDA provider.
# Every result goes under $OUT (at most 8 files, flat; default benchmarks/results/gpu_check/<gpu>/, the folder the
# README's "Verified where" table cites); each step has its own time limit and a failing step does not stop the
# others. The last lines of gpu_check.log summarise each step's exit code.
#
#   bash benchmarks/gpu_check.sh                         # from the repository root
#   OUT=/tmp/gpu-out bash benchmarks/gpu_check.sh        # elsewhere
#
# The machine needs: python3 with numpy, onnx, onnxruntime, tokenizers, jinja2, pillow, tqdm, xxhash, torch (CUDA),
# transformers, safetensors, pytest; nvcc + CMake; cuBLAS headers (CUDA toolkit or pip's nvidia-cublas).
# Optional, each enabling more checks (skipped with the reason otherwise): onnxruntime-gpu (ORT CUDA provider:
# ort-cuda, the batched fp16 ORT-form decoder), TensorRT headers in $TENSORRT_ROOT and TensorRT python bindings
# (plugin engine, native TensorRT sessions).
set -u
cd "$(dirname "$0")/.."
if [ -z "${OUT:-}" ]; then
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -cs 'A-Za-z0-9' '_' | sed 's/_*$//')
    OUT=benchmarks/results/gpu_check/${gpu:-unknown_gpu}
fi
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG="$OUT/gpu_check.log"
: >"$LOG"
declare -A RC

step() {  # step NAME SECONDS CMD... : run with a time limit, output into the log, remember the exit code
    local name=$1 limit=$2
    shift 2
    echo "=== $name ($(date -u +%T), limit ${limit}s): $*" | tee -a "$LOG"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
    RC[$name]=$?
    echo "=== $name: exit ${RC[$name]} after $((SECONDS - t0))s" | tee -a "$LOG"
}

{
    echo "--- environment"
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1
    nvcc --version 2>&1 | tail -1
    cmake --version 2>&1 | head -1
    # engines/cudart.py finds libcudart itself (loader, pip's nvidia wheels, the toolkit); where, and the driver:
    "$PY" -c 'from coverpruner.engines import cudart, nvml; print("cuda:", cudart.device_problem() or "usable", cudart.cudart_path()); print("driver:", nvml.driver_release())' 2>&1
    "$PY" - <<'EOF' 2>&1
import importlib
for name in ("numpy", "onnx", "onnxruntime", "torch", "transformers", "tokenizers", "xxhash", "tensorrt",
             "tensorrt_rtx"):
    try:
        m = importlib.import_module(name)
        extra = ""
        if name == "onnxruntime":
            extra = f" providers={m.get_available_providers()}"
        if name == "torch":
            extra = f" cuda={m.cuda.is_available()} {m.cuda.get_device_name(0) if m.cuda.is_available() else ''}"
        print(f"{name} {getattr(m, '__version__', '?')}{extra}")
    except Exception as exc:  # report and go on: each missing one only skips checks
        print(f"{name}: not importable ({type(exc).__name__}: {exc})")
EOF
} >>"$LOG"

# 1. the gpu-marked tests (only the files that hold them: the others import server/video packages a bare GPU
#    image may lack); -rs lists every skip with its reason
step pytest-gpu 170 "$PY" -m pytest -p no:cacheprovider -q -rs -m gpu --junitxml="$OUT/pytest_gpu.xml" \
    tests/engines/test_cuda_selector_gpu.py tests/engines/test_doctor.py tests/engines/test_ort_form_fp16.py \
    tests/engines/test_trt_session_gpu.py tests/engines/test_bench_cuda_selector.py tests/runtime/test_ort_factory.py \
    tests/matrix/test_pipeline_api.py tests/contract/test_planted_family.py

# 2. coverpruner-doctor (device, versions, kernel == float64 reference, ort-cuda, plugin engine, selector timing
#    beside the paper's A6000 overhead table); doctor.json + doctor.md straight into $OUT
step doctor 130 "$PY" -m coverpruner.doctor --workdir /tmp/coverpruner-doctor --out "$OUT"

# 3. the CUDA selector vs the torch backend at the paper's shapes (n = 576 / 2,880, d = 4,096, fp32/fp16)
LIB=$(find /tmp/coverpruner-doctor -name libcoverpruner_selector.so 2>/dev/null | head -1)
if [ -z "$LIB" ]; then
    mkdir -p /tmp/csrc_build
    step native-build 40 "$PY" -c "from coverpruner.engines.native_build import build_native; \
from pathlib import Path; print(build_native(Path('/tmp/csrc_build')).selector)"
    LIB=$(find /tmp/csrc_build -name libcoverpruner_selector.so 2>/dev/null | head -1)
fi
step bench-cuda-selector 60 "$PY" benchmarks/bench_cuda_selector.py ${LIB:+--lib "$LIB"} --out "$OUT/cuda_selector.json"

# 4. batched decoding on ONNX Runtime's CUDA provider (fp16 ORT form, LLaVA-1.5-7B widths, 2 layers): KV in GPU
#    memory vs host memory, batch 1..8 (exit 2 with the reason when onnxruntime-gpu is missing)
step bench-cuda-batch 60 "$PY" benchmarks/bench_cuda_batch.py --past 600 --steps 16 --out "$OUT/cuda_batch.json"

{
    echo "--- summary"
    for name in pytest-gpu doctor native-build bench-cuda-selector bench-cuda-batch; do
        [ -n "${RC[$name]+x}" ] && echo "$name: exit ${RC[$name]}"
    done
    grep -E "passed|failed|error" "$LOG" | grep -E "^[0-9]+ (passed|failed)|[0-9]+ (passed|failed|skipped)" | tail -1
} | tee -a "$LOG"
exit 0
