"""Evaluation fixtures: the session's tiny engine dir (tests/conftest.py) loaded once, single-threaded."""

import pytest


@pytest.fixture(scope="session")
def eval_pipe(tiny_export):
    from coverpruner.runtime import Pipeline

    return Pipeline.load(tiny_export, provider="cpu", threads=1)
