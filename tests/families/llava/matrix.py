"""LLaVA-1.5's facts for the family matrix (tests/matrix/): what the generic tests ask of this family."""

from __future__ import annotations

# candidates of assets/demo.png (tests/matrix/test_pipeline_api.py): CLIP 168/14 -> 12 x 12, every image
DEMO_CANDIDATES = 144
# compact positions: a pruned prompt uses fewer positions
PRUNING_FREES_CONTEXT = True
# generate options under which budget >= n keeps every visual row (every visual row is a candidate)
KEEP_ALL_OPTIONS: dict = {}

# coverpruner-build flags of "TensorRT-RTX builds every graph" (batch 2: the decoder's batch axis is exercised)
TRT_BUILD_ARGS = ["--budgets", "16,64", "--max-context", "256", "--max-batch", "2"]


def check_trt_profiles(section: dict, manifest: dict) -> None:
    """LLaVA-1.5's own profile facts: decoder profiles from the generic axes at batch 2, a batched vision."""
    n, hidden = manifest["visual"]["max_visual_tokens"], manifest["dims"]["hidden_size"]
    dec = section["engines"]["decoder"]["profile"]
    assert dec["inputs_embeds"] == {"min": [1, 1, hidden], "opt": [1, min(256, n + 64), hidden],
                                    "max": [2, 256, hidden]}
    assert dec["past_key_values.0.key"]["min"][2] == 0 and dec["past_key_values.0.key"]["max"][2] == 255
    assert dec["attention_mask"]["max"] == [2, 256]
    assert section["engines"]["vision"]["profile"]["pixel_values"]["max"][0] == 2


# --- "pipeline == independent HF reference" (tests/matrix/test_pipeline_reference.py) ---
# The reference (tests/families/llava/hf_reference.py): HF processor -> HF image features -> HF eager layer-0
# demand at instruction positions from the HF tokenizer's offsets -> literal float64 selectors -> pruned
# inputs_embeds with compact positions -> HF generate.
NEW = 10
PROMPTS = ["What is shown in this image?", "How many red houses are near the tall tree?"]
PIPELINE_CASES = ["demo", "noise"]


def pipeline_case(family, request, case_id: str):
    """(PIL image, prompt, generate options) of one case."""
    import numpy as np
    from PIL import Image

    if case_id == "demo":
        return Image.open(request.getfixturevalue("demo_image")), PROMPTS[0], {}
    rng = np.random.default_rng(5)
    return Image.fromarray(rng.integers(0, 256, (200, 260, 3), dtype=np.uint8)), PROMPTS[1], {}


def hf_full(family, request, case_id: str) -> list[int]:
    """Unpruned HF generate with the HF processor: the new token ids."""
    from tests.families.llava import hf_reference as ref

    model, processor = request.getfixturevalue("hf")
    image, prompt, _ = pipeline_case(family, request, case_id)
    return family.memo(("full", case_id), lambda: ref.hf_full_generate(model, processor, image, prompt, NEW))


def hf_pruned(family, request, case_id: str, budget: int, method: str):
    """(new token ids, kept indices, demand float32 [n] or None, instruction positions int64 [T])."""
    from tests.families.llava import hf_reference as ref

    model, processor = request.getfixturevalue("hf")
    image, prompt, _ = pipeline_case(family, request, case_id)
    return ref.pruned_generate(model, processor, image, prompt, budget, method, NEW)


def check_full(family, request, case_id: str, got, want) -> None:
    _, processor = request.getfixturevalue("hf")
    assert got.text == processor.tokenizer.decode(want, skip_special_tokens=True)
    assert got.num_visual_tokens == family.pipe.num_visual_tokens == family.pipe.max_visual_tokens == 144


def check_pruned(family, request, case_id: str, got, ref_out, budget: int) -> None:
    """LLaVA-1.5: the image span is n rows; instruction positions are the reference's."""
    pipe = family.pipe
    _, prompt, _ = pipeline_case(family, request, case_id)
    _, keep, _, instr_pos = ref_out
    assert pipe.encoder.encode(prompt, pipe.max_visual_tokens).instruction_positions.tolist() == instr_pos.tolist()
    assert len(keep) == budget and got.prefill_tokens == got.prompt_tokens - pipe.num_visual_tokens + budget
