"""The console scripts' entry points: each imports its command and, when a package of an optional extra is
missing, prints one line naming the extra to install and exits 2 (instead of a ModuleNotFoundError traceback).

The extras (pyproject.toml) are named for what a user does; ONNX Runtime comes from exactly one of `run` (the CPU
build, `onnxruntime`) or `gpu` (the CUDA build, `onnxruntime-gpu`, or NVIDIA's Jetson wheel): both builds install
the same `onnxruntime` package directory, so the base install names neither.
"""

from __future__ import annotations

import importlib
import sys

ORT_HINT = 'pip install "coverpruner[run]" (CPU) or "coverpruner[gpu]" (CUDA; Jetson: docs/tensorrt.md)'
#: top-level module -> the extra that installs it
PROVIDED_BY = {
    "onnxruntime": "run",
    "torch": "export", "transformers": "export", "safetensors": "export", "onnxscript": "export",
    "onnx_ir": "export",
    "fastapi": "serve", "uvicorn": "serve", "prometheus_client": "serve", "llguidance": "serve",
    "ray": "serve-ray",
    "pyarrow": "eval", "matplotlib": "eval",
    "av": "video",
    "lmms_eval": "lmms-eval",
}
#: console script -> "module:function"
COMMANDS = {
    "coverpruner-export": "coverpruner.export.cli:main",
    "coverpruner-make-checkpoint": "coverpruner.testing.cli:main",
    "coverpruner-build": "coverpruner.engines.build_cli:main",
    "coverpruner-run": "coverpruner.runtime.cli:main",
    "coverpruner-demo": "coverpruner.demo:main",
    "coverpruner-serve": "coverpruner.serving.cli:main",
    "coverpruner-eval": "coverpruner.evaluation.cli:main",
    "coverpruner-doctor": "coverpruner.doctor:main",
}


def missing_extra_message(command: str, exc: ModuleNotFoundError) -> str | None:
    """One line for a module an extra provides; None for any other missing module (a real bug: re-raised)."""
    top = (exc.name or "").split(".")[0]
    extra = PROVIDED_BY.get(top)
    if extra is None:
        return None
    if extra == "run":
        return f"{command}: error: needs ONNX Runtime (no module {top!r}): {ORT_HINT}"
    return (f"{command}: error: needs the {extra!r} extra (no module {top!r}): pip install \"coverpruner[{extra}]\" "
            f"(in a checkout: pip install -e \".[{extra}]\")")


def run_command(command: str, argv: list[str] | None = None) -> int:
    """Import and run one console script; exit code 2 with one line when an extra's package is missing."""
    module, _, func = COMMANDS[command].partition(":")
    try:
        return getattr(importlib.import_module(module), func)(argv)
    except ModuleNotFoundError as exc:
        message = missing_extra_message(command, exc)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 2


def _entry(command: str):
    def main(argv: list[str] | None = None) -> int:
        return run_command(command, argv)

    main.__name__ = main.__qualname__ = command.replace("coverpruner-", "").replace("-", "_")
    main.__doc__ = f"{command} (see {COMMANDS[command]})"
    return main


export = _entry("coverpruner-export")
make_checkpoint = _entry("coverpruner-make-checkpoint")
build = _entry("coverpruner-build")
run = _entry("coverpruner-run")
demo = _entry("coverpruner-demo")
serve = _entry("coverpruner-serve")
evaluate = _entry("coverpruner-eval")
doctor = _entry("coverpruner-doctor")
