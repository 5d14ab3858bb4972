"""LLaVA-NeXT's facts for the family matrix (tests/matrix/): what the generic tests ask of this family."""

from __future__ import annotations

TRT_BUILD_ARGS = ["--budgets", "16,64", "--max-context", "256"]


def check_trt_profiles(section: dict, manifest: dict) -> None:
    """The vision engine runs over 1-5 tiles of 84 px (the manifest's `axes.tiles`); 180 candidates at most."""
    engines = section["engines"]
    assert engines["vision"]["profile"]["pixel_values"] == {"min": [1, 3, 84, 84], "opt": [5, 3, 84, 84],
                                                            "max": [5, 3, 84, 84]}
    n = manifest["visual"]["max_visual_tokens"]
    assert n == 180 and engines["probe"]["profile"]["visual_positions"]["max"] == [n]
    assert engines["selector"]["profile"]["image_features"]["max"][0] == n
