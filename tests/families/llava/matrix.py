"""LLaVA-1.5's facts for the family matrix (tests/matrix/): what the generic tests ask of this family."""

from __future__ import annotations

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
