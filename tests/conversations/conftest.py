"""Session fixtures for the conversation references: every family's tiny checkpoint with their HF processor and
eager float32 model (`hf_family(name)`), sample images of different sizes and conversations.

The checkpoints are tests/conftest.py's Builds of coverpruner.testing's tiny presets (fixtures only);
everything the references compute comes from transformers (tests/conversations/reference.py).
"""

from __future__ import annotations

import importlib

import pytest

from tests.family_matrix import family_folders

pytest.importorskip("transformers", reason="the conversation references run the HF models")

#: family -> its tiny preset (tests/families/<name>/matrix.py PRESET: the checkpoint the matrix exports)
PRESETS = {name: importlib.import_module(f"tests.families.{name}.matrix").PRESET for name in family_folders()}


@pytest.fixture(scope="session")
def conv_checkpoints(builds):
    """name -> Path of the family's tiny checkpoint (tests/conftest.py Builds: the one the matrix exports)."""
    return lambda name: builds.checkpoint(PRESETS[name])


@pytest.fixture(scope="session")
def hf_family(conv_checkpoints):
    """name -> reference.HFFamily (checkpoint, HF processor, eager float32 model), loaded once."""
    from tests.conversations.reference import load_family

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = load_family(name, conv_checkpoints(name))
        return cache[name]

    return get
