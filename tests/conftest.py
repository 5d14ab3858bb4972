"""Session fixtures shared by every test: one checkpoint -> export chain and the family matrix.

`builds` makes each tiny preset's random checkpoint (coverpruner.testing, seed 0) and its fp32 engine dir (all
five graphs + manifest.json) at most once per run, on first use (under pytest-xdist the workers share them on
disk: the first worker to need one builds it under a file lock, into a temporary folder renamed when complete); every family fixture (`tiny_checkpoint`,
`next_export`, `qwen_checkpoint`, ...) and the matrix's `family` read from it, so nothing is built twice.

`family` is parametrised over MATRIX (tests/family_matrix.py): one entry per model family's tiny preset. A test
that takes it runs for every family (tests/matrix/); a family joins by its facts module
tests/families/<name>/matrix.py (with `PRESET`), found on disk (tests/README.md).

The family-specific fixtures live in tests/families/<name>/fixtures.py, found on disk and loaded here as plugins
so every folder (export, runtime, serving, ...) shares the same session instances.
"""

from __future__ import annotations

import importlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from tests.family_matrix import MATRIX, STANDARD_MATRIX, MatrixEntry, fixture_plugins

pytest_plugins = fixture_plugins()  # tests/families/<name>/fixtures.py of every family folder


class Builds:
    """Checkpoints and fp32 engine dirs of the tiny presets, each built once per run on first use (shared on disk
    by the xdist workers of one run)."""

    def __init__(self, tmp_path_factory):
        self._tmp = tmp_path_factory
        base = tmp_path_factory.getbasetemp()
        # xdist: every worker's basetemp is <run>/popen-gwN, so <run>/builds is the run's one shared folder
        self._shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "builds"
        self._shared.mkdir(parents=True, exist_ok=True)
        self._memo: dict[tuple, object] = {}

    def _built(self, name: str, make) -> Path:
        """<shared>/<name>, made by make(folder) once per run: under a lock, into a temporary folder that is
        renamed when complete, so a worker never sees a half-built one."""
        from filelock import FileLock

        final = self._shared / name
        with FileLock(str(self._shared / f"{name}.lock")):
            if not final.exists():
                partial = self._shared / f"{name}.partial"
                shutil.rmtree(partial, ignore_errors=True)
                partial.mkdir()
                make(partial)
                partial.rename(final)
        return final

    def checkpoint(self, preset: str) -> Path:
        pytest.importorskip("transformers", reason="building a checkpoint needs transformers (export extra)")

        def make(folder: Path) -> None:
            from coverpruner.testing.checkpoints import write_checkpoint

            assert write_checkpoint(folder, preset=preset, seed=0) == folder

        return self._built(f"{preset}_checkpoint", make)

    def export(self, preset: str, form: str = "standard") -> Path:
        """The preset's fp32 engine dir with decoder form `form` ("standard": what the family fixtures and the
        TensorRT builds use; "ort": the ORT-form decoder)."""
        checkpoint = self.checkpoint(preset)

        def make(folder: Path) -> None:
            from coverpruner.export.exporter import ExportOptions, export_model

            export_model(checkpoint, folder, preset, ExportOptions(dtype="fp32", progress=False, decoder_form=form))

        return self._built(f"{preset}_{form}_export", make)

    def memo(self, key: tuple, make):
        """make() once per session for `key` (e.g. a family's Pipeline or an HF reference answer)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]


#: test files that run on one xdist worker together (--dist loadgroup): both build every family's engine dirs on
#: first use, so on two workers one would wait on the other's file lock for each export (minutes idle)
SHARED_WORKER = {"tests/matrix/test_pipeline_api.py": "matrix-pipeline",
                 "tests/matrix/test_pipeline_reference.py": "matrix-pipeline"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the marks into scheduling groups
def pytest_collection_modifyitems(config, items):
    """--dist loadgroup schedules by file (each file's tests on one worker: its module fixtures built once), with
    the files of SHARED_WORKER grouped."""
    for item in items:
        path = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(SHARED_WORKER.get(path, path)))


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
    #: decoder form of `export` ("standard" or "ort")
    form: str = "standard"

    @property
    def checkpoint(self) -> Path:
        return self._builds.checkpoint(self.preset)

    @property
    def export(self) -> Path:
        return self._builds.export(self.preset, self.form)

    @property
    def pipe(self):
        """Pipeline.load(export, cpu, 1 thread), shared by the session's matrix tests of this family."""
        from coverpruner.runtime import Pipeline

        return self.memo(("pipe", self.form), lambda: Pipeline.load(self.export, provider="cpu", threads=1))

    def memo(self, key, make):
        """make() once per session for this family and `key` (an HF reference answer, a request, ...); shared by
        both decoder forms (the references do not depend on it)."""
        return self._builds.memo((self.preset, key), make)


def pytest_generate_tests(metafunc):
    """`family` runs over MATRIX; with `case_id` too, over each family's PIPELINE_CASES (ids "llava-demo"); with
    `graph_case` / `decoder_case`, over its GRAPH_CASES / DECODER_CASES (ids "llava-vision-batch2")."""
    if "family" not in metafunc.fixturenames:
        return
    for cases in ("graph_case", "decoder_case"):  # each family's GRAPH_CASES / DECODER_CASES (graph parity)
        if cases in metafunc.fixturenames:
            pairs = [(entry, c) for entry in STANDARD_MATRIX for c in getattr(_facts(entry.name), cases.upper() + "S")]
            metafunc.parametrize(["family", cases], pairs, ids=[f"{e.name}-{c}" for e, c in pairs],
                                 indirect=["family"], scope="session")
            return
    if "case_id" not in metafunc.fixturenames:
        metafunc.parametrize("family", MATRIX, ids=[e.id for e in MATRIX], indirect=True, scope="session")
        return
    pairs = [(entry, case_id) for entry in MATRIX for case_id in _pipeline_cases(entry)]
    metafunc.parametrize(["family", "case_id"], pairs, ids=[f"{e.id}-{c}" for e, c in pairs], indirect=["family"],
                         scope="session")


def _facts(name: str) -> ModuleType:
    return importlib.import_module(f"tests.families.{name}.matrix")


def _pipeline_cases(entry: MatrixEntry) -> list[str]:
    """The family's PIPELINE_CASES, for the ORT form its ORT_PIPELINE_CASES when it names a subset (the cases whose
    decoder calls differ between the forms: CI time)."""
    facts = _facts(entry.name)
    return list(getattr(facts, "ORT_PIPELINE_CASES", facts.PIPELINE_CASES) if entry.form == "ort"
                else facts.PIPELINE_CASES)


@pytest.fixture(scope="session")
def family(request, builds) -> FamilyUnderTest:
    """One family of MATRIX (parametrised by pytest_generate_tests above)."""
    entry: MatrixEntry = request.param
    return FamilyUnderTest(entry.name, entry.preset, _facts(entry.name), builds, entry.form)


@pytest.fixture(scope="session")
def trt_rtx():
    """TensorRT-RTX (builds engines without a GPU); skips with what to install when it is missing."""
    from tests.trt_plans import load_trt_rtx

    return load_trt_rtx()


@pytest.fixture(scope="session")
def demo_image():
    from importlib.resources import files

    return files("coverpruner") / "assets" / "demo.png"
