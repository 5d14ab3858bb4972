"""Session fixtures shared by every test: one checkpoint -> export chain and the family matrix.

`builds` makes each tiny preset's random checkpoint (coverpruner.testing, seed 0) and its fp32 engine dir (all
five graphs + manifest.json) at most once per run, on first use; every family fixture (`tiny_checkpoint`,
`next_export`, `qwen_checkpoint`, ...) and the matrix's `family` read from it, so nothing is built twice.

`family` is parametrised over MATRIX: one entry per model family's tiny preset. A test that takes it runs for
every family (tests/matrix/); a family joins by one MATRIX line plus its facts module
tests/families/<name>/matrix.py (tests/README.md).

The family-specific fixtures live in tests/families/<name>/fixtures.py, loaded here as plugins so every folder
(export, runtime, serving, ...) shares the same session instances.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

pytest_plugins = [
    "tests.families.llava.fixtures",
    "tests.families.llava_next.fixtures",
    "tests.families.qwen2_5_vl.fixtures",
]


@dataclass(frozen=True)
class MatrixEntry:
    """One family of the matrix: its registry name (coverpruner.families) and its tiny preset
    (coverpruner.testing); its facts are tests/families/<name>/matrix.py."""

    name: str
    preset: str


MATRIX = (
    MatrixEntry("llava", "tiny"),
    MatrixEntry("llava_next", "llava-next-tiny"),
    MatrixEntry("qwen2_5_vl", "qwen2.5-vl-tiny"),
)


class Builds:
    """Checkpoints and fp32 engine dirs of the tiny presets, each built once per session on first use."""

    def __init__(self, tmp_path_factory):
        self._tmp = tmp_path_factory
        self._checkpoints: dict[str, Path] = {}
        self._exports: dict[str, Path] = {}

    def checkpoint(self, preset: str) -> Path:
        if preset not in self._checkpoints:
            pytest.importorskip("transformers", reason="building a checkpoint needs transformers (export extra)")
            from coverpruner.testing.checkpoints import write_checkpoint

            self._checkpoints[preset] = write_checkpoint(self._tmp.mktemp(f"{preset}_checkpoint"), preset=preset,
                                                         seed=0)
        return self._checkpoints[preset]

    def export(self, preset: str) -> Path:
        if preset not in self._exports:
            from coverpruner.export.exporter import ExportOptions, export_model

            out = self._tmp.mktemp(f"{preset}_export")
            export_model(self.checkpoint(preset), out, preset, ExportOptions(dtype="fp32", progress=False))
            self._exports[preset] = out
        return self._exports[preset]


@pytest.fixture(scope="session")
def builds(tmp_path_factory) -> Builds:
    return Builds(tmp_path_factory)


@dataclass
class FamilyUnderTest:
    """What a generic test needs of one family: the checkpoint and engine dir (built on first access), a
    Pipeline on the engine dir (CPU, 1 thread), and `facts`, the module tests/families/<name>/matrix.py
    (its independent HF reference and the numbers the generic tests check)."""

    name: str
    preset: str
    facts: ModuleType
    _builds: Builds
    _cache: dict = field(default_factory=dict)

    @property
    def checkpoint(self) -> Path:
        return self._builds.checkpoint(self.preset)

    @property
    def export(self) -> Path:
        return self._builds.export(self.preset)

    @property
    def pipe(self):
        if "pipe" not in self._cache:
            from coverpruner.runtime import Pipeline

            self._cache["pipe"] = Pipeline.load(self.export, provider="cpu", threads=1)
        return self._cache["pipe"]


@pytest.fixture(scope="session", params=MATRIX, ids=[e.name for e in MATRIX])
def family(request, builds) -> FamilyUnderTest:
    entry: MatrixEntry = request.param
    return FamilyUnderTest(entry.name, entry.preset, importlib.import_module(f"tests.families.{entry.name}.matrix"),
                           builds)


@pytest.fixture(scope="session")
def trt_rtx():
    """TensorRT-RTX (builds engines without a GPU); skips with what to install when it is missing."""
    from tests.trt_plans import load_trt_rtx

    return load_trt_rtx()


@pytest.fixture(scope="session")
def demo_image():
    from importlib.resources import files

    return files("coverpruner") / "assets" / "demo.png"
