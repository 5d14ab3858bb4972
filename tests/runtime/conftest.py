"""Runtime test fixtures on top of the session-wide tiny checkpoint / engine dir (tests/conftest.py)."""

import shutil

import pytest


@pytest.fixture(scope="module")
def pipe(tiny_export):
    from coverpruner.runtime import Pipeline

    return Pipeline.load(tiny_export, provider="cpu", threads=1)


@pytest.fixture(scope="module")
def hf(tiny_checkpoint):
    """(LlavaForConditionalGeneration with eager attention, its HF processor)."""
    transformers = pytest.importorskip("transformers")
    model = transformers.LlavaForConditionalGeneration.from_pretrained(
        str(tiny_checkpoint), attn_implementation="eager").eval()
    return model, transformers.AutoProcessor.from_pretrained(str(tiny_checkpoint))


@pytest.fixture
def engine_copy(tiny_export, tmp_path):
    """A private copy of the engine dir that a test may corrupt."""
    return shutil.copytree(tiny_export, tmp_path / "engine")


@pytest.fixture(scope="session")
def demo_image():
    from importlib.resources import files

    return files("coverpruner") / "assets" / "demo.png"
