"""benchmarks/bench_cuda_selector.py runs end to end and writes its JSON (GPU only; no timing assertions:
speed figures live in benchmarks/results and docs/tensorrt.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from .conftest import requires_gpu, requires_torch_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpu, requires_torch_cuda]

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_cuda_selector.py"


def test_quick_benchmark_writes_json(native_libs, tmp_path):
    spec = importlib.util.spec_from_file_location("bench_cuda_selector", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "result.json"
    assert bench.main(["--quick", "--lib", str(native_libs.selector), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["benchmark"] == "cuda_selector" and result["rows"]
    for row in result["rows"]:
        assert row["kernel_ms"] > 0 and row["torch_ms"] > 0
        # float32 on both sides: the same picks, or at a genuine float32 near-tie equally good ones
        assert row["same_indices"] or row["objective_rel_gap"] <= 2e-7, row
