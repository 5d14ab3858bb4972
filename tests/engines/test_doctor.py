"""coverpruner-doctor: here (no GPU) it reports the environment, answers on the CPU provider, skips every GPU check
with the reason, writes doctor.json + doctor.md and exits 0; its GPU checks also run as `gpu` tests (they compare
with the float64 reference selector / the CPU provider's tokens, independent of the device code they check)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from coverpruner import doctor

from .conftest import GPU_AVAILABLE, requires_gpu

GPU_CHECKS = ("native-build", "kernel", "ort-cuda", "plugin-engine", "selector-timing")


@pytest.mark.slow
@pytest.mark.skipif(GPU_AVAILABLE, reason="checks the report of a machine without a GPU")
def test_doctor_without_gpu_skips_each_gpu_check_with_its_reason_and_exits_0(builds, tmp_path):
    engine = builds.export("tiny")
    proc = subprocess.run([sys.executable, "-m", "coverpruner.doctor", "--workdir", str(tmp_path / "work"),
                           "--engine-dir", str(engine), "--out", str(tmp_path / "report")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report" / "doctor.json").read_text())
    env = report["environment"]
    for key in ("onnxruntime", "tensorrt", "nvcc", "cmake", "gpu", "cuda_runtime"):
        assert env.get(key), f"environment lacks {key}: {env}"
    assert env["gpu"] != "usable"
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["engine-dir"]["status"] == "pass" and checks["engine-dir"]["data"]["engine_dir"] == str(engine)
    assert checks["cpu-answer"]["status"] == "pass" and len(checks["cpu-answer"]["data"]["tokens"]) == doctor.NEW_TOKENS
    for name in GPU_CHECKS:
        assert checks[name]["status"] == "skip", checks[name]
        assert "no usable CUDA GPU" in checks[name]["detail"], checks[name]  # the reason, not just "skipped"
    md = (tmp_path / "report" / "doctor.md").read_text()
    for name in ["engine-dir", "cpu-answer", *GPU_CHECKS]:
        assert f"| {name} |" in md
    assert not list((tmp_path / "report").glob("*.tmp")), "a temporary report file was left behind"


def test_bad_engine_dir_is_one_line_and_exit_2(tmp_path, capsys):
    assert doctor.main(["--workdir", str(tmp_path), "--engine-dir", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--engine-dir" in err and "manifest.json" in err


# --- the GPU checks as tests --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def doctor_libs(tmp_path_factory):
    return doctor.build_selector_library(tmp_path_factory.mktemp("doctor"))


@pytest.mark.gpu
@requires_gpu
def test_kernel_equals_reference_on_this_gpu(doctor_libs):
    detail, data = doctor.check_kernel(doctor_libs)
    assert len(data["cases"]) == 4, detail


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("form", ["standard", "fp16-ort"])
def test_ort_cuda_answers_the_cpu_tokens(builds, request, form):
    engine = builds.export("tiny") if form == "standard" else request.getfixturevalue("ort_fp16_export")
    try:
        doctor.check_ort_cuda(engine)
    except doctor.Skip as exc:
        pytest.skip(str(exc))


@pytest.mark.gpu
@requires_gpu
def test_plugin_engine_answers_the_cpu_tokens(doctor_libs, tmp_path):
    engine = doctor.prepare(tmp_path)
    cpu = doctor._answers(engine, "cpu", threads=2)
    try:
        doctor.check_plugin_engine(tmp_path, doctor_libs, cpu)
    except doctor.Skip as exc:
        pytest.skip(str(exc))
