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
    for key in ("onnxruntime", "tensorrt", "nvcc", "cmake", "gpu", "cuda_runtime", "driver"):
        assert env.get(key), f"environment lacks {key}: {env}"
    assert env["gpu"] != "usable" and "libcudart not found" not in env["gpu"], env["gpu"]
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["onnxruntime-install"]["status"] == "pass", checks["onnxruntime-install"]
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
    try:
        doctor.check_plugin_engine(tmp_path, doctor_libs, engine)
    except doctor.Skip as exc:
        pytest.skip(str(exc))


# --- one ONNX Runtime build; token comparisons that accept a flip only at a near-tie ------------------------------
def test_both_onnxruntime_builds_installed_fail_with_the_commands(monkeypatch):
    monkeypatch.setattr(doctor, "onnxruntime_builds", lambda: {"onnxruntime": "1.32.0", "onnxruntime-gpu": "1.31.1"})
    check = doctor._timed("onnxruntime-install", doctor.check_onnxruntime_install)
    assert check.status == "fail", check
    assert "pip uninstall -y onnxruntime onnxruntime-gpu && pip install \"onnxruntime-gpu[cuda,cudnn]==1.31.1\"" \
        in check.detail, check.detail
    assert doctor._timed("onnxruntime-install", doctor.check_onnxruntime_install).status == "fail"
    monkeypatch.setattr(doctor, "onnxruntime_builds", lambda: {"onnxruntime": "1.32.0"})
    assert doctor._timed("onnxruntime-install", doctor.check_onnxruntime_install).status == "pass"


def _steps(*rows):
    from coverpruner.runtime.logprobs import TokenLogprob

    return [TokenLogprob(tok, dict(top)[tok], tuple(top)) for tok, top in rows]


def test_compare_answers_accepts_a_flip_only_at_a_near_tie():
    want = _steps((5, [(5, -1.0), (7, -1.01)]), (3, [(3, -0.5), (4, -2.0)]))
    assert doctor.compare_answers(want, want, 0.03, "same") == ""
    near = _steps((7, [(7, -1.0), (5, -1.005)]), (9, [(9, -0.1), (4, -3.0)]))  # flip at step 0, 0.01 nats apart
    note = doctor.compare_answers(want, near, 0.03, "near")
    assert "flip at step 0 (5 -> 7)" in note and "margin 0.01 nats" in note, note
    with pytest.raises(AssertionError, match=r"step 0 .* 0\.01 nats more likely there: not a near-tie"):
        doctor.compare_answers(want, near, 1e-3, "fp32")
    far = _steps((5, [(5, -1.0), (7, -1.01)]), (4, [(4, -0.4), (3, -0.6)]))  # step 1: 1.5 nats behind
    with pytest.raises(AssertionError, match="step 1 gives token 4 where the reference gives 3, 1.5 nats"):
        doctor.compare_answers(want, far, 0.03, "far")
    unseen = _steps((5, [(5, -1.0)]), (8, [(8, -0.1)]))
    with pytest.raises(AssertionError, match="not among the reference's 2 most likely"):
        doctor.compare_answers(want, unseen, 0.03, "unseen")


@pytest.mark.slow
@pytest.mark.skipif(GPU_AVAILABLE, reason="checks the report of a machine without a GPU")
def test_prepared_workdir_runs_where_torch_is_not_installed(tmp_path):
    """The Jetson flow: --prepare-only where torch is installed, the workdir copied to a device without torch (torch
    made unimportable here), the doctor there reuses the dirs: engine-dir and cpu-answer pass, exit 0. Without the
    prepared dirs it skips with the reason instead of failing."""
    import shutil

    from ..test_extras import EXPORT_EXTRA, without

    assert doctor.main(["--workdir", str(tmp_path / "x86"), "--prepare-only"]) == 0
    for name in ("tiny-engine", "tiny-engine-fp16-ort", "tiny-engine-plugin"):
        assert (tmp_path / "x86" / name / "manifest.json").is_file(), name
    shutil.copytree(tmp_path / "x86", tmp_path / "device")
    proc = without(EXPORT_EXTRA, "coverpruner-doctor", "--workdir", tmp_path / "device", "--skip-timing")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads((tmp_path / "device" / "doctor.json").read_text())["checks"]}
    assert checks["engine-dir"]["status"] == checks["cpu-answer"]["status"] == "pass", checks
    proc = without(EXPORT_EXTRA, "coverpruner-doctor", "--workdir", tmp_path / "empty", "--skip-timing")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads((tmp_path / "empty" / "doctor.json").read_text())["checks"]}
    assert checks["engine-dir"]["status"] == "skip" and "--prepare-only" in checks["engine-dir"]["detail"], checks
