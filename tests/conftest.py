"""Session fixtures shared by every test: one checkpoint -> export chain and the family matrix.

`builds` makes each tiny preset's random checkpoint (coverpruner.testing, seed 0) and its fp32 engine dir (all
five graphs + manifest.json) at most once per run, on first use; every family fixture (`tiny_checkpoint`,
`next_export`, `qwen_checkpoint`, ...) and the matrix's `family` read from it, so nothing is built twice.

`family` is parametrised over MATRIX (tests/family_matrix.py): one entry per model family's tiny preset. A test
that takes it runs for every family (tests/matrix/); a family joins by one MATRIX line plus its facts module
tests/families/<name>/matrix.py (tests/README.md).

The family-specific fixtures live in tests/families/<name>/fixtures.py, loaded here as plugins so every folder
(export, runtime, serving, ...) shares the same session instances.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from tests.family_matrix import MATRIX, MatrixEntry

pytest_plugins = [
    "tests.families.llava.fixtures",
    "tests.families.llava_next.fixtures",
    "tests.families.qwen2_5_vl.fixtures",
]


class Builds:
    """Checkpoints and fp32 engine dirs of the tiny presets, each built once per session on first use."""

    def __init__(self, tmp_path_factory):
        self._tmp = tmp_path_factory
        self._checkpoints: dict[str, Path] = {}
        self._exports: dict[str, Path] = {}
        self._memo: dict[tuple, object] = {}

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


    def memo(self, key: tuple, make):
        """make() once per session for `key` (e.g. a family's Pipeline or an HF reference answer)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]


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

    @property
    def checkpoint(self) -> Path:
        return self._builds.checkpoint(self.preset)

    @property
    def export(self) -> Path:
        return self._builds.export(self.preset)

    @property
    def pipe(self):
        """Pipeline.load(export, cpu, 1 thread), shared by the session's matrix tests of this family."""
        from coverpruner.runtime import Pipeline

        return self.memo("pipe", lambda: Pipeline.load(self.export, provider="cpu", threads=1))

    def memo(self, key, make):
        """make() once per session for this family and `key` (an HF reference answer, a request, ...)."""
        return self._builds.memo((self.preset, key), make)


def pytest_generate_tests(metafunc):
    """`family` runs over MATRIX; with `case_id` too, over each family's PIPELINE_CASES (ids "llava-demo")."""
    if "family" not in metafunc.fixturenames:
        return
    if "case_id" not in metafunc.fixturenames:
        metafunc.parametrize("family", MATRIX, ids=[e.name for e in MATRIX], indirect=True, scope="session")
        return
    pairs = [(entry, case_id) for entry in MATRIX for case_id in _facts(entry.name).PIPELINE_CASES]
    metafunc.parametrize(["family", "case_id"], pairs, ids=[f"{e.name}-{c}" for e, c in pairs], indirect=["family"],
                         scope="session")


def _facts(name: str) -> ModuleType:
    return importlib.import_module(f"tests.families.{name}.matrix")


@pytest.fixture(scope="session")
def family(request, builds) -> FamilyUnderTest:
    """One family of MATRIX (parametrised by pytest_generate_tests above)."""
    entry: MatrixEntry = request.param
    return FamilyUnderTest(entry.name, entry.preset, _facts(entry.name), builds)


@pytest.fixture(scope="session")
def trt_rtx():
    """TensorRT-RTX (builds engines without a GPU); skips with what to install when it is missing."""
    from tests.trt_plans import load_trt_rtx

    return load_trt_rtx()


@pytest.fixture(scope="session")
def demo_image():
    from importlib.resources import files

    return files("coverpruner") / "assets" / "demo.png"
