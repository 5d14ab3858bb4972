"""A family is found, not listed: the registry's families are the packages under coverpruner/families/, the test
matrix's are the folders tests/families/<name>/ with a matrix.py, and both equal the families of the preset
table; a new package is picked up without editing any list (docs/architecture.md, "Adding a family")."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import coverpruner.families as families
from coverpruner.testing.presets import PRESETS
from tests.family_matrix import MATRIX, STANDARD_MATRIX, fixture_plugins

PACKAGES = Path(families.__file__).parent


def packages_on_disk() -> list[str]:
    return sorted(p.parent.name for p in PACKAGES.glob("*/__init__.py"))


def test_registry_is_the_packages_on_disk():
    assert families.family_names() == packages_on_disk() == [
        "gemma3", "llava", "llava_next", "qwen2_5_vl", "qwen3_5", "qwen3_vl"]
    for name in families.family_names():
        assert families.get_family(name).name == name  # the manifest "family" is the package name


def test_matrix_is_every_family_with_its_tiny_preset():
    assert [e.name for e in STANDARD_MATRIX] == families.family_names() == sorted({p.family for p in PRESETS.values()})
    # each family once per decoder form, with the same preset
    assert sorted((e.name, e.preset, e.form) for e in MATRIX) == sorted(
        (e.name, e.preset, form) for e in STANDARD_MATRIX for form in ("standard", "ort"))
    for entry in MATRIX:
        assert PRESETS[entry.preset].family == entry.name
    assert fixture_plugins() == [f"tests.families.{e.name}.fixtures" for e in STANDARD_MATRIX]


def test_every_preset_names_an_existing_writer():
    root = PACKAGES.parents[1]
    for name, preset in PRESETS.items():
        module, func = preset.writer.split(":")
        source = (root / module.replace(".", "/")).with_suffix(".py").read_text()
        assert f"def {func}(" in source, (name, preset.writer)


def test_a_new_family_package_is_found_without_editing_a_list(tmp_path, monkeypatch):
    """A fourth package (planted in a second directory of coverpruner.families' search path) joins the registry:
    its name, model type and alias, with nothing else edited."""
    pkg = tmp_path / "fourth"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from coverpruner.families.contract import FamilyEntry\n\n"
        "class FourthFamily:\n    name = 'fourth'\n    request_options = ()\n\n"
        "FAMILY = FamilyEntry('coverpruner.families.fourth:FourthFamily', ('fourth_vl',), {'fourth-7b': 'x/fourth'})\n")
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    monkeypatch.setattr(families, "FAMILIES", families.discover())
    families.get_family.cache_clear()
    try:
        assert families.family_names() == ["fourth", "gemma3", "llava", "llava_next", "qwen2_5_vl", "qwen3_5",
                                           "qwen3_vl"]
        assert families.family_for_model_type("fourth_vl").name == "fourth"
        assert families.resolve_alias("fourth-7b") == "x/fourth"
    finally:
        families.get_family.cache_clear()
        sys.modules.pop("coverpruner.families.fourth", None)
    importlib.invalidate_caches()
