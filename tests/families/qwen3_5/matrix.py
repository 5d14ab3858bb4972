"""Qwen3.5's facts for the family matrix (tests/matrix/): what the generic tests ask of this family."""

from __future__ import annotations

from tests.families import qwen_common as common

PRESET = "qwen3.5-tiny"

# candidates of assets/demo.png (480x360 -> 448x320 -> 14 x 10 merged tokens), as the Qwen3-VL tower's
DEMO_CANDIDATES = 140
# M-RoPE: kept rows keep their native positions and decoding continues after the unpruned prompt's last position
PRUNING_FREES_CONTEXT = False
KEEP_ALL_OPTIONS: dict = {}

TRT_BUILD_ARGS = ["--budgets", "16,64", "--max-context", "512"]


def check_trt_profiles(section: dict, manifest: dict) -> None:
    """One dynamic patch axis and 3-row M-RoPE positions; the decoder states (contract v5) are batch-only dynamic."""
    vision_axes = {a for spec in manifest["graphs"]["vision"]["inputs"] for a in spec["shape"] if isinstance(a, str)}
    assert vision_axes == {"num_patches"}
    assert section["engines"]["vision"]["profile"]["pixel_values"]["max"] == [640, 1536]
    decoder = section["engines"]["decoder"]["profile"]
    assert decoder["position_ids"]["max"] == [3, 1, 512]
    record = manifest["graphs"]["decoder"]
    assert record["kv_layers"] == [3] and [s["name"] for s in record["states"]] == ["conv", "recurrent"]
    conv = decoder["past_key_values.0.conv"]
    assert conv["min"][1:] == conv["max"][1:] == [2 * 2 * 16 + 4 * 16, 3]
    assert decoder["past_key_values.2.recurrent"]["max"][1:] == [4, 16, 16]


# --- "pipeline == independent HF reference" (tests/matrix/test_pipeline_reference.py) ---
# The reference (tests/families/qwen3_5/hf_reference.py with tests/families/qwen_common.py): HF processor layout,
# HF get_rope_index positions, the demand of HF's first full-attention layer (attentions[0], after HF's own Gated
# DeltaNet layers), literal float64 selectors, a greedy loop over HF's text model with its own hybrid cache.
NEW, PROMPT, GRAPH_PROMPT = common.NEW, common.PROMPT, common.GRAPH_PROMPT
PIPELINE_CASES = ["300x250"]
_facts = common.QwenFacts("qwen35_hf", "qwen35_checkpoint", "tests.families.qwen3_5.hf_reference", 72)
pipeline_case, hf_pruned, check_full = _facts.pipeline_case, _facts.hf_pruned, _facts.check_full


def check_pruned(family, request, case_id: str, got, ref_out, budget: int) -> None:
    """The pruned prefill's length (the reference's tokens are checked by the generic test). Unlike attention-only
    Qwens, pruning is not masking here: a Gated DeltaNet layer runs through every row it is given."""
    req = ref_out[3]
    assert got.prefill_tokens == req.embeds.shape[1] - (req.visual.size - budget)


def hf_full(family, request, case_id: str) -> list[int]:
    """HF generate on the processor's inputs (greedy): the whole model."""
    import torch

    model, req = request.getfixturevalue("qwen35_hf"), _facts.native(family, request, case_id)
    model.model.rope_deltas = None  # HF keeps rope deltas between calls
    with torch.no_grad():
        out = model.generate(**req.inputs, max_new_tokens=NEW, do_sample=False)
    return out[0, req.inputs["input_ids"].shape[1]:].tolist()


# --- "every graph vs HF" (tests/matrix/test_graph_parity.py) ---
# vision: the Qwen3-VL tower's cases (18x16, 8x26, 26x20 patches); probe: HF's first full-attention layer on the
# whole native sequence; decoder: prefill of the native layout and one decode step, KV and states through the graph.
VISION_SIZES = [(300, 250), (140, 420), (400, 330)]
PROBE_SIZES = [(300, 250)]
GRAPH_CASES = ([f"vision-{h}x{w}" for h, w in VISION_SIZES] + ["embed-ids"] + [f"probe-{h}x{w}" for h, w in PROBE_SIZES]
               + ["selector-64", "selector-16"])
DECODER_CASES = ["prefill-decode-300x250"]


def _graph_request(family, request, size):
    from tests.families.qwen3_5.fixtures import our_request
    from tests.families.qwen3_vl.hf_qwen3 import hf_inputs

    return common.graph_request(family, request, size, "qwen35_hf", hf_inputs, our_request)


def graph_case(family, request, case_id: str):
    from coverpruner.families.qwen3_preprocess import Qwen3ImageSettings
    from coverpruner.families.qwen3_vision import vision_inputs

    model = request.getfixturevalue("qwen35_hf")
    graph = case_id.split("-")[0]
    if graph == "vision":
        img, out = common.hf_image(model, family.checkpoint, Qwen3ImageSettings, common.case_size(case_id))
        vc = model.config.vision_config
        feed = vision_inputs(img.pixel_values, img.grid_thw, vc.spatial_merge_size, vc.num_position_embeddings)
        want = out.pooler_output[0].numpy()
        # float32 through 3 blocks of 64-wide sums and a 256-wide merger: measured ~1e-6 of the output scale
        from tests.family_matrix import GraphCase

        return GraphCase(feed, want, rtol=0, atol=1e-5 * abs(want).max())
    if graph == "embed":
        return common.embed_case(model)
    if graph == "probe":
        ref, embeds, _, layout, positions = _graph_request(family, request, common.case_size(case_id))
        return common.probe_case(model, ref, embeds, layout, positions)
    img, out = common.hf_image(model, family.checkpoint, Qwen3ImageSettings, (300, 250))  # selector-<budget>
    return common.selector_case(out.pooler_output[0].numpy(), int(case_id.split("-")[1]))


def decoder_case(family, request, case_id: str):
    """Prefill of the native sequence (HF: the whole model on the processor's inputs), then one decode step at
    max(native)+1; the KV of the full layer and the states of the linear ones go through the graph."""
    ref, embeds, _, _, positions = _graph_request(family, request, common.case_size(case_id))
    return common.hf_decoder_case(request.getfixturevalue("qwen35_hf"), ref, embeds, positions, [],
                                  reset_rope_deltas=True)
