"""g++ unit tests of the plugin's header-free core (attribute parsing, shape and type rules, workspace size),
built two ways: a direct g++ call (what the README test command runs everywhere) and CMake + CTest."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from coverpruner.engines.native_build import CSRC_DIR


def _run_core_binary(binary) -> tuple[int, int]:
    proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    summary = re.search(r"^(\d+) passed, (\d+) failed$", proc.stdout, re.M)
    assert summary, proc.stdout + proc.stderr
    passed, failed = int(summary.group(1)), int(summary.group(2))
    assert proc.returncode == (1 if failed else 0)
    assert failed == 0, proc.stdout
    return passed, failed


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found on PATH")
def test_plugin_core_unit_tests_with_gpp(tmp_path):
    binary = tmp_path / "test_selector_plugin_core"
    cmd = ["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{CSRC_DIR / 'include'}",
           str(CSRC_DIR / "plugin" / "selector_plugin_core.cpp"),
           str(CSRC_DIR / "tests" / "test_selector_plugin_core.cpp"), "-o", str(binary)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    passed, _ = _run_core_binary(binary)
    assert passed >= 60  # every CHECK ran (a truncated run would print fewer)


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ctest") is None, reason="cmake/ctest not found")
def test_plugin_core_with_cmake_and_ctest(tmp_path):
    build = tmp_path / "build"
    for cmd in (["cmake", "-S", str(CSRC_DIR), "-B", str(build), "-DCOVERPRUNER_WITH_CUDA=OFF",
                 "-DCOVERPRUNER_TRT_PLUGIN=OFF"],
                ["cmake", "--build", str(build), "-j", "2"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = subprocess.run(["ctest", "--test-dir", str(build), "--output-on-failure"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    assert "100% tests passed" in proc.stdout
