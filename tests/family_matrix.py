"""The family matrix: every model family's tiny preset, exported with each decoder form. A test taking the
`family` fixture (tests/conftest.py) runs once per line; the family's facts for the generic tests are
tests/families/<name>/matrix.py."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MatrixEntry:
    """One family of the matrix: its registry name (coverpruner.families) and its tiny preset
    (coverpruner.testing)."""

    name: str
    preset: str
    #: the engine dir's decoder form (graphs.decoder.form): "standard" or "ort"
    form: str = "standard"

    @property
    def id(self) -> str:
        """Test id: the family name, with "-ort" for the ORT-form decoder."""
        return self.name if self.form == "standard" else f"{self.name}-{self.form}"


_FAMILIES = (
    ("llava", "tiny"),
    ("llava_next", "llava-next-tiny"),
    ("qwen2_5_vl", "qwen2.5-vl-tiny"),
)
#: every family with both decoder forms: the pipeline must answer the same with either
MATRIX = tuple(MatrixEntry(name, preset, form) for form in ("standard", "ort") for name, preset in _FAMILIES)
