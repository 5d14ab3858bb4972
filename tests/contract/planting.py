"""Planting a family for a contract test: its package copied into a temporary folder on sys.path, its FAMILY first in
the registry (so the LLaVA checkpoint's model_type finds it), the checkpoint exported in both decoder forms; all
undone on exit. The planted package is the only code of the family: nothing outside it changes.

The planted tests' shared module fixtures live here too (a test module imports them): ``image`` (noise_image) and
``want``, the test module's own ``reference(checkpoint, image)`` on its ``planted`` checkpoint.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

import pytest


@contextlib.contextmanager
def planted(package, checkpoint: Path, root: Path):
    """package: the imported planted package (tests/contract/planted_*); checkpoint: a LLaVA checkpoint dir ->
    yields {"ort": engine dir, "standard": engine dir}."""
    import coverpruner.families as families
    from coverpruner.export.exporter import ExportOptions, export_model

    name = package.__name__.rsplit(".", 1)[-1]
    shutil.copytree(package.__path__[0], root / name, ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(root))
    entry = __import__(name).FAMILY
    saved = families.FAMILIES
    # first in the registry (FAMILIES is a plain dict that tests may extend: families/__init__.py)
    families.FAMILIES = {name: entry, **saved}
    families.get_family.cache_clear()
    try:
        exports = {}
        for form in ("ort", "standard"):
            exports[form] = root / f"export_{form}"
            # the graphs a request runs (the peers' selector graphs are no part of the contract: left out, faster)
            export_model(checkpoint, exports[form], "planted", ExportOptions(
                dtype="fp32", progress=False, decoder_form=form,
                graphs=("vision", "embed", "probe", "selector", "decoder")))
        yield exports
    finally:
        families.FAMILIES = saved
        families.get_family.cache_clear()
        sys.path.remove(str(root))
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]


def llava_request(checkpoint: Path, image, prompt: str):
    """A planted test's HF side of one LLaVA request [image, prompt] (tests/families/llava/hf_reference.py's
    pieces): (eager model, input ids [L], image rows [n], instruction positions [T], HF image features [n, d],
    embeds [1, L, d] with the features at the image rows)."""
    import torch
    import transformers

    from tests.families.llava import hf_reference as ref

    model = transformers.LlavaForConditionalGeneration.from_pretrained(str(checkpoint), attn_implementation="eager")
    model.eval()
    processor = transformers.AutoProcessor.from_pretrained(str(checkpoint))
    inputs, text = ref.hf_inputs(processor, image, prompt)
    ids = inputs["input_ids"][0]
    image_id = model.config.image_token_id
    vpos = torch.nonzero(ids == image_id).flatten()
    instr = ref.instruction_positions(processor, text, prompt, ids, image_id)
    feats = ref.hf_image_features(model, inputs["pixel_values"])  # [n, d]
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids[None]).clone()
    embeds[0, vpos] = feats
    return model, ids, vpos, instr, feats, embeds


def noise_image():
    """The planted tests' image: 240 x 180 uniform noise (distinct visual tokens: no near-ties in the selection)."""
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(3).integers(0, 256, (180, 240, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def image():
    return noise_image()


@pytest.fixture(scope="module")
def want(request, planted, image):
    """The test module's reference answer: its reference(checkpoint, image) on the planted checkpoint."""
    return request.module.reference(planted[0], image)
