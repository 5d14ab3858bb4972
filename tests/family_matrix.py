"""The family matrix: every model family's tiny preset. A test taking the `family` fixture (tests/conftest.py) runs
once per line; the family's facts for the generic tests are tests/families/<name>/matrix.py."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MatrixEntry:
    """One family of the matrix: its registry name (coverpruner.families) and its tiny preset
    (coverpruner.testing)."""

    name: str
    preset: str


MATRIX = (
    MatrixEntry("llava", "tiny"),
    MatrixEntry("llava_next", "llava-next-tiny"),
    MatrixEntry("qwen2_5_vl", "qwen2.5-vl-tiny"),
)
