"""Pipeline.generate (ONNX graphs, numpy) == references built directly on the HF PyTorch model.

budget full: == HF generate on the unpruned model with the HF processor.
budgets 64/16, methods coverpruner/divprune: == HF image features -> HF layer-0 attention demand (instruction
positions from the HF tokenizer's offsets) -> the literal float64 greedy / DivPrune written in the tests -> pruned
inputs_embeds with compact positions -> HF generate; kept indices, instruction positions and demand equal too.
"""

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
from tests.families.llava import hf_reference as ref  # noqa: E402

NEW = 10
PROMPTS = ["What is shown in this image?", "How many red houses are near the tall tree?"]


def _image(kind, demo_image):
    if kind == "demo":
        return Image.open(demo_image)
    rng = np.random.default_rng(5)
    return Image.fromarray(rng.integers(0, 256, (200, 260, 3), dtype=np.uint8))


@pytest.mark.parametrize("kind,prompt", [("demo", PROMPTS[0]), ("noise", PROMPTS[1])])
@pytest.mark.parametrize("method", ["coverpruner", "divprune"])
def test_full_budget_equals_hf_generate(tiny_pipe, hf, demo_image, kind, prompt, method):
    model, processor = hf
    image = _image(kind, demo_image)
    want = ref.hf_full_generate(model, processor, image, prompt, NEW)
    got = tiny_pipe.generate(image, prompt, budget="full", method=method, max_new_tokens=NEW)
    assert got.token_ids == want
    assert got.kept_indices.tolist() == list(range(tiny_pipe.num_visual_tokens))
    assert got.text == processor.tokenizer.decode(want, skip_special_tokens=True)
    assert got.relevance is None and got.prefill_tokens == got.prompt_tokens


@pytest.mark.parametrize("kind,prompt", [("demo", PROMPTS[0]), ("noise", PROMPTS[1])])
@pytest.mark.parametrize("budget", [64, 16])
@pytest.mark.parametrize("method", ["coverpruner", "divprune"])
def test_pruned_equals_hf_reference(tiny_pipe, hf, demo_image, kind, prompt, budget, method):
    model, processor = hf
    image = _image(kind, demo_image)
    got = tiny_pipe.generate(image, prompt, budget=budget, method=method, max_new_tokens=NEW)
    want, keep, relevance, instr_pos = ref.pruned_generate(model, processor, image, prompt, budget, method, NEW)
    # LLaVA-1.5: the image span is n rows
    assert tiny_pipe.encoder.encode(prompt, tiny_pipe.max_visual_tokens).instruction_positions.tolist() == instr_pos.tolist()
    assert got.kept_indices.tolist() == keep.tolist()
    assert len(keep) == budget and got.prefill_tokens == got.prompt_tokens - tiny_pipe.num_visual_tokens + budget
    if method == "coverpruner":
        np.testing.assert_allclose(got.relevance, relevance, rtol=1e-4, atol=1e-7)
    assert got.token_ids == want


def test_pruning_changes_the_answer_path(tiny_pipe, demo_image):
    """Guard against a parity test that passes because budgets do nothing: prefill lengths and kept sets differ,
    and at 16 tokens the greedy tokens differ from the full model's on this checkpoint."""
    full = tiny_pipe.generate(demo_image, PROMPTS[0], budget="full", max_new_tokens=NEW)
    r64 = tiny_pipe.generate(demo_image, PROMPTS[0], budget=64, method="coverpruner", max_new_tokens=NEW)
    r16 = tiny_pipe.generate(demo_image, PROMPTS[0], budget=16, method="divprune", max_new_tokens=NEW)
    assert full.prefill_tokens - r64.prefill_tokens == tiny_pipe.num_visual_tokens - 64
    assert set(r16.kept_indices) != set(r64.kept_indices[:16])
    assert r16.token_ids != full.token_ids or r64.token_ids != full.token_ids
