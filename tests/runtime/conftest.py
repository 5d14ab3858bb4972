"""Runtime test fixtures on the session-wide tiny LLaVA engine dir (tests/families/llava/fixtures.py)."""

import shutil

import pytest


@pytest.fixture(scope="module")
def pipe(tiny_export):
    from coverpruner.runtime import Pipeline

    return Pipeline.load(tiny_export, provider="cpu", threads=1)


@pytest.fixture
def engine_copy(tiny_export, tmp_path):
    """A private copy of the engine dir that a test may corrupt."""
    return shutil.copytree(tiny_export, tmp_path / "engine")
