"""A Jetson install never needs a compiler: the runtime's requirements (base + `run` + `serve`) resolve to binary
wheels for aarch64 on JetPack 6 (Ubuntu 22.04: glibc 2.35, Python 3.10) and JetPack 7 (Ubuntu 24.04: glibc 2.39,
Python 3.12), by pip's own resolver (`pip install --dry-run --platform ... --only-binary=:all:`), read from
pyproject.toml. On the device, ONNX Runtime is NVIDIA's onnxruntime-gpu wheel (docs/tensorrt.md) in place of the
`run` extra's CPU build resolved here: same module, same dependencies. Skipped when the package index is
unreachable."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UNREACHABLE = re.compile(r"NewConnectionError|Temporary failure in name resolution|Name or service not known|"
                         r"Network is unreachable|ConnectTimeout|ReadTimeout|Could not fetch URL")


def runtime_requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *extras["run"], *extras["serve"]]


@pytest.mark.slow
@pytest.mark.parametrize("python,glibc", [("3.10", 35), ("3.12", 39)], ids=["jetpack6", "jetpack7"])
def test_the_runtime_resolves_to_aarch64_wheels(tmp_path, python, glibc):
    platforms = [f"manylinux_2_{g}_aarch64" for g in range(17, glibc + 1)] + ["manylinux2014_aarch64"]
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
           str(report), "--python-version", python, "--implementation", "cp", "--only-binary=:all:",
           *[arg for p in platforms for arg in ("--platform", p)], *runtime_requirements()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and UNREACHABLE.search(proc.stdout + proc.stderr):
        pytest.skip(f"package index unreachable: {UNREACHABLE.search(proc.stdout + proc.stderr).group(0)}")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    names = {i["metadata"]["name"].lower().replace("_", "-") for i in installs}
    assert {"numpy", "onnx", "onnxruntime", "tokenizers", "fastapi", "llguidance"} <= names, names
    assert not names & {"torch", "transformers"}, "the runtime install pulls torch"
    for item in installs:
        wheel = item["download_info"]["url"].rsplit("/", 1)[-1]
        assert wheel.endswith(".whl"), wheel
        tags = wheel[:-4].split("-")[-1]
        assert tags == "any" or "aarch64" in tags, wheel
