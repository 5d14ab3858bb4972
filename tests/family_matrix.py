"""The family matrix: every model family's tiny preset, found on disk, exported with each decoder form. A test
taking the `family` fixture (tests/conftest.py) runs once per entry; a family joins by its folder
tests/families/<name>/ with a matrix.py (its facts for the generic tests, `PRESET` naming its tiny preset) and a
fixtures.py (its session fixtures), no list to edit."""

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
    #: the engine dir's decoder form (graphs.decoder.form): "standard" or "ort"
    form: str = "standard"

    @property
    def id(self) -> str:
        """Test id: the family name, with "-ort" for the ORT-form decoder."""
        return self.name if self.form == "standard" else f"{self.name}-{self.form}"


def family_folders() -> list[str]:
    """Names of the folders tests/families/<name>/ that hold a matrix.py, sorted."""
    return sorted(p.parent.name for p in FAMILY_TESTS.glob("*/matrix.py"))


def fixture_plugins() -> list[str]:
    """The fixtures.py of every family folder, as pytest plugin module names."""
    return [f"tests.families.{p.parent.name}.fixtures" for p in sorted(FAMILY_TESTS.glob("*/fixtures.py"))]


def _matrix() -> tuple[MatrixEntry, ...]:
    import importlib

    # every family with both decoder forms: the pipeline must answer the same with either
    return tuple(MatrixEntry(name, importlib.import_module(f"tests.families.{name}.matrix").PRESET, form)
                 for form in ("standard", "ort") for name in family_folders())


MATRIX = _matrix()
#: the standard-form entries: graph parity (vision/embed/probe/selector are the same graphs in both forms; the
#: ORT-form decoder has its own transformers test, tests/export/test_ortform_decoder.py)
STANDARD_MATRIX = tuple(e for e in MATRIX if e.form == "standard")


# --- "every graph vs HF" (tests/matrix/test_graph_parity.py): what a family's matrix.py hands the generic test ---
@dataclass
class GraphCase:
    """One run of vision / embed / probe / selector .onnx against the HF model (or, for the selector, against
    coverpruner.selection on HF's features). feed: {input name: array}; want: the reference output; the generic
    test checks got.shape == want.shape and np.testing.assert_allclose(got, want, rtol, atol) (0, 0: bit-equal).
    post(got) -> what `want` describes (e.g. LLaVA-NeXT's packing of the tile features); check(got, want,
    session) holds the family's extra assertions (shapes, a non-uniform demand, positions matter, ...)."""

    feed: dict
    want: object
    rtol: float = 0.0
    atol: float = 0.0
    post: object = None
    check: object = None


@dataclass
class DecoderCase:
    """Prefill (+ `steps` greedy decode steps) of decoder.onnx against the HF model, both fed HF's greedy token.

    embeds float32 [B,L,d], mask int64 [B,L], positions the prefill's position_ids feed ([B,L] or [R,B,L]);
    hf_logits(step, token) -> float32 [B,V], HF's last-position logits at step 0 (prefill, token None) or after
    feeding `token`; step_inputs(step, token) -> (inputs_embeds [1,1,d], position_ids feed) of decode step
    `step` >= 1; check_present(present) the family's checks of the prefill's present.* (list, 2 per layer);
    extras: the decoder extras of a contract-v4 decoder ({input name: float32 [B,L,d]}), fed at prefill and as zeros
    [B,1,d] at decode steps (as the runtime feeds them). blocks: a contract-v5 decoder's attention_blocks int64 [B,L]
    (each prefill row's block, -1 for text), fed at prefill, -1 at decode steps.
    Generic checks: logits [B,1,V] within atol of HF's at every step, same greedy token, present length = the
    sequence so far, at least `min_distinct_tokens` different tokens (a constant answer would make it weak)."""

    embeds: object
    mask: object
    positions: object
    hf_logits: object
    step_inputs: object = None
    steps: int = 0
    atol: float = 1e-4
    min_distinct_tokens: int = 1
    check_present: object = None
    extras: dict | None = None
    blocks: object = None


def compact_decoder_case(hf_model, embeds, steps: int, min_distinct_tokens: int = 2) -> DecoderCase:
    """A DecoderCase for a model with compact positions (LLaVA-1.5, LLaVA-NeXT): prefill of `embeds` (torch
    float32 [1,L,d], positions 0..L-1), then `steps` decode steps at L, L+1, ...; HF runs the same steps on its own
    DynamicCache with the same token (HF's greedy choice)."""
    import numpy as np
    import torch
    from transformers import DynamicCache

    length = embeds.shape[1]
    cache = DynamicCache(config=hf_model.config.text_config)
    table = hf_model.get_input_embeddings()

    def hf_logits(step, token):
        with torch.no_grad():
            step_in = embeds if step == 0 else table(torch.tensor([[token]]))
            pos = torch.arange(length)[None] if step == 0 else torch.tensor([[length + step - 1]])
            mask = torch.ones((1, length + step), dtype=torch.int64)
            return hf_model(inputs_embeds=step_in, attention_mask=mask, position_ids=pos, past_key_values=cache,
                            use_cache=True).logits[:, -1].numpy()

    def step_inputs(step, token):
        with torch.no_grad():
            return table(torch.tensor([[token]])).numpy(), np.array([[length + step - 1]], np.int64)

    return DecoderCase(embeds.numpy(), np.ones((1, length), np.int64), np.arange(length, dtype=np.int64)[None],
                       hf_logits, step_inputs, steps=steps, min_distinct_tokens=min_distinct_tokens)
