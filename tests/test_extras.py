"""The console scripts without their optional extras (coverpruner/extras.py): one line naming the extra, exit 2;
and the runtime answering with none of the torch / server packages importable (the cheap CI equivalent of a
fresh `pip install ".[run]"` venv, whose size and run are recorded by hand in docs/tensorrt.md).

A missing extra is simulated in a subprocess by a meta-path finder that refuses the extra's top-level modules, as
Python does for a package that is not installed (ModuleNotFoundError with its name)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from coverpruner import extras
from coverpruner.demo import DEMO_IMAGE

from .hardening.conftest import repo_env

REPO = Path(__file__).resolve().parents[1]
BLOCKER = textwrap.dedent("""
    import sys
    BLOCKED = set(sys.argv[1].split(","))

    class NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    from coverpruner.extras import run_command
    sys.exit(run_command(sys.argv[2], sys.argv[3:]))
""")
EXPORT_EXTRA = "torch,transformers,safetensors,onnxscript,onnx_ir"
SERVE_EXTRA = "fastapi,uvicorn,prometheus_client,llguidance,ray"


def without(blocked: str, command: str, *argv: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER, blocked, command, *map(str, argv)], capture_output=True,
                          text=True, timeout=300, env=repo_env(), cwd=cwd)


def test_every_console_script_goes_through_extras():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(extras.COMMANDS)
    for name, target in scripts.items():
        module, _, func = target.partition(":")
        assert module == "coverpruner.extras" and getattr(extras, func).__doc__.startswith(name), (name, target)


def test_the_extras_named_exist_in_pyproject():
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras.PROVIDED_BY.values()) <= set(optional)
    # the two ONNX Runtime builds come from different extras, and the base install names neither
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if d.startswith("onnxruntime")], deps
    assert all(d.startswith("onnxruntime>=") for d in optional["run"])
    assert all(d.startswith("onnxruntime-gpu") for d in optional["gpu"])


def test_an_unknown_missing_module_is_not_blamed_on_an_extra():
    exc = ModuleNotFoundError("No module named 'nosuch'", name="nosuch")
    assert extras.missing_extra_message("coverpruner-run", exc) is None
    exc = ModuleNotFoundError("No module named 'pyarrow.parquet'", name="pyarrow.parquet")
    assert "'eval' extra" in extras.missing_extra_message("coverpruner-eval", exc)


@pytest.mark.parametrize("blocked,command,argv,extra", [
    ("onnxruntime", "coverpruner-run", ["DIR", "--prompt", "hi"], "coverpruner[run]"),
    ("onnxruntime", "coverpruner-doctor", ["--workdir", "WORK"], "coverpruner[run]"),
    ("onnxruntime", "coverpruner-serve", ["DIR"], "coverpruner[run]"),
    (SERVE_EXTRA, "coverpruner-serve", ["DIR"], "coverpruner[serve]"),
    (EXPORT_EXTRA, "coverpruner-make-checkpoint", ["--preset", "tiny", "--output", "WORK/ckpt"], "coverpruner[export]"),
    (EXPORT_EXTRA, "coverpruner-demo", ["--workdir", "WORK"], "coverpruner[export]"),
    (EXPORT_EXTRA, "coverpruner-export", ["--model", "CKPT", "--output", "WORK/out"], "coverpruner[export]"),
], ids=["run-no-ort", "doctor-no-ort", "serve-no-ort", "serve-no-serve", "checkpoint-no-export", "demo-no-export",
        "export-no-export"])
def test_each_command_without_its_extra_is_one_line_and_exit_2(builds, tmp_path, blocked, command, argv, extra):
    needs = {"DIR": lambda: builds.export("tiny"), "CKPT": lambda: builds.checkpoint("tiny")}
    argv = [str(needs[a]()) if a in needs else a.replace("WORK", str(tmp_path)) for a in argv]
    proc = without(blocked, command, *argv, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and err.startswith(f"{command}: error: needs ") and extra in err, err
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "ckpt").exists(), "written half-way"


@pytest.mark.slow
def test_the_runtime_answers_with_no_torch_and_no_server_packages(builds):
    """What a `pip install ".[run]"` venv has: coverpruner-run answers on the CPU with torch, transformers and the
    server packages all unimportable."""
    engine = builds.export("tiny")
    proc = without(f"{EXPORT_EXTRA},{SERVE_EXTRA},pyarrow,matplotlib,av", "coverpruner-run", engine,
                   "--image", DEMO_IMAGE, "--prompt", "What is shown?", "--budget", "8", "--max-new-tokens", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip(), "no answer printed"
