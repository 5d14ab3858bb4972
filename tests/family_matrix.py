"""The family matrix: every model family's tiny preset, found on disk. A test taking the `family` fixture
(tests/conftest.py) runs once per entry; a family joins by its folder tests/families/<name>/ with a matrix.py
(its facts for the generic tests, `PRESET` naming its tiny preset) and a fixtures.py (its session fixtures),
no list to edit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FAMILY_TESTS = Path(__file__).resolve().parent / "families"


@dataclass(frozen=True)
class MatrixEntry:
    """One family of the matrix: its registry name (coverpruner.families) and its tiny preset
    (coverpruner.testing)."""

    name: str
    preset: str


def family_folders() -> list[str]:
    """Names of the folders tests/families/<name>/ that hold a matrix.py, sorted."""
    return sorted(p.parent.name for p in FAMILY_TESTS.glob("*/matrix.py"))


def fixture_plugins() -> list[str]:
    """The fixtures.py of every family folder, as pytest plugin module names."""
    return [f"tests.families.{p.parent.name}.fixtures" for p in sorted(FAMILY_TESTS.glob("*/fixtures.py"))]


def _matrix() -> tuple[MatrixEntry, ...]:
    import importlib

    return tuple(MatrixEntry(name, importlib.import_module(f"tests.families.{name}.matrix").PRESET)
                 for name in family_folders())


MATRIX = _matrix()
