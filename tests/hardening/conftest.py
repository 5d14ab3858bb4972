"""Hardening fixtures: a private copy of the session's tiny engine dir (for tests that change files in it),
and a helper that runs a CLI's ``main`` and returns (exit code, stdout, stderr)."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest


@pytest.fixture
def engine_copy(tiny_export, tmp_path) -> Path:
    """A copy of the tiny engine dir this test may corrupt."""
    return Path(shutil.copytree(tiny_export, tmp_path / "engine"))


def run_main(main, capsys, *argv):
    """main([...]) -> (code, stdout, stderr); a traceback escaping main fails the test with it."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    """The single non-empty stderr line of a refused command (asserts there is exactly one)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one error line, got {lines!r}"
    assert "Traceback" not in err
    return lines[0]


REPO = Path(__file__).resolve().parents[2]


def repo_env() -> dict:
    """Environment for a ``python -m coverpruner...`` subprocess that imports this checkout."""
    return {**os.environ, "PYTHONPATH": str(REPO)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
