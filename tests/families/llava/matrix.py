"""LLaVA-1.5's facts for the family matrix (tests/matrix/): what the generic tests ask of this family."""

from __future__ import annotations

# the tiny preset (coverpruner/testing/presets.py) the matrix builds for this family
PRESET = "tiny"

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
    assert got.num_visual_tokens == family.pipe.max_visual_tokens == 144


def check_pruned(family, request, case_id: str, got, ref_out, budget: int) -> None:
    """LLaVA-1.5: the image span is n rows; instruction positions are the reference's."""
    pipe = family.pipe
    _, prompt, _ = pipeline_case(family, request, case_id)
    _, keep, _, instr_pos = ref_out
    turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    layout = pipe.encoder.encode_conversation(turn, [pipe.max_visual_tokens])
    assert layout.instruction_turn[0].tolist() == instr_pos.tolist()
    assert len(keep) == budget and got.prefill_tokens == got.prompt_tokens - pipe.max_visual_tokens + budget


# --- "every graph vs HF" (tests/matrix/test_graph_parity.py), on the fixture request (sample image, PROMPT) ---
GRAPH_CASES = ["vision-batch2", "embed-reversed", "probe-request", "selector-64", "selector-16", "selector-200"]
DECODER_CASES = ["prefill-8-steps", "batch2-left-padded"]


def _image_features_hf(hf_model, pixel_values):
    import torch

    with torch.no_grad():
        out = hf_model.get_image_features(pixel_values=torch.from_numpy(pixel_values))
    feats = out.pooler_output if hasattr(out, "pooler_output") else out
    return torch.stack(list(feats)).numpy()  # [B,n,d]


def _native_embeds(hf_model, req):
    """HF's merge: token embeddings with the image rows replaced by get_image_features. [1,L,d] f32."""
    import torch

    with torch.no_grad():
        emb = hf_model.get_input_embeddings()(torch.from_numpy(req.input_ids)).clone()
    emb[0, torch.from_numpy(req.visual_positions)] = torch.from_numpy(_image_features_hf(hf_model, req.pixel_values)[0])
    return emb


def graph_case(family, request, case_id: str):
    import numpy as np
    import torch

    from tests.family_matrix import GraphCase

    hf_model, req = request.getfixturevalue("hf_model"), request.getfixturevalue("request_inputs")
    if case_id == "vision-batch2":
        rng = np.random.default_rng(1)
        batch = np.concatenate([req.pixel_values, rng.standard_normal(req.pixel_values.shape).astype(np.float32)])

        def check(got, want, sess):
            assert got.shape == (2, 144, 64)
        return GraphCase({"pixel_values": batch}, _image_features_hf(hf_model, batch), atol=1e-4, check=check)
    if case_id == "embed-reversed":
        ids = np.concatenate([req.input_ids, req.input_ids[:, ::-1]])
        with torch.no_grad():
            want = hf_model.get_input_embeddings()(torch.from_numpy(ids.copy())).numpy()
        return GraphCase({"input_ids": ids}, want)
    if case_id == "probe-request":
        return _probe_case(family, request, req)
    budget = int(case_id.split("-")[1])  # selector-<budget>: the selector graph == coverage_select on HF features
    from coverpruner.selection import coverage_select

    feats = _image_features_hf(hf_model, req.pixel_values)[0]
    relevance = np.random.default_rng(0).random(feats.shape[0]).astype(np.float32)
    return GraphCase({"image_features": feats, "relevance": relevance, "budget": np.array(budget, np.int64),
                      "tau": np.array(0.3, np.float32)}, coverage_select(feats, relevance, budget=budget, tau=0.3))


def _probe_case(family, request, req):
    """HF eager layer-0 attention of the native sequence, instruction rows x visual columns, mean over heads."""
    import numpy as np
    import torch
    from transformers import LlavaForConditionalGeneration

    from tests.family_matrix import GraphCase

    eager = LlavaForConditionalGeneration.from_pretrained(str(family.checkpoint), attn_implementation="eager").eval()
    embeds = _native_embeds(request.getfixturevalue("hf_model"), req)
    positions = torch.arange(embeds.shape[1])[None]
    with torch.no_grad():
        att = eager(inputs_embeds=embeds, position_ids=positions, output_attentions=True).attentions[0]  # [1,H,L,L]
    vis, ins = torch.from_numpy(req.visual_positions), torch.from_numpy(req.instruction_positions)
    want = att[0][:, ins][:, :, vis].mean(dim=(0, 1)).numpy()  # heads and instruction rows

    def check(got, want, sess):
        assert got.dtype == np.float32 and got.shape == (144,)
        # Not a degenerate (uniform) map: the test would not notice a wrong column/row selection otherwise.
        assert want.std() > 0.05 * want.mean()
    return GraphCase({"inputs_embeds": embeds.numpy(), "position_ids": positions.numpy(),
                      "visual_positions": req.visual_positions, "instruction_positions": req.instruction_positions},
                     want, atol=1e-5, check=check)


def _pruned_inputs(hf_model, req, keep):
    """[prefix; V[keep]; suffix] embeds with compact positions (LLaVA). Returns (embeds [1,L',d], positions)."""
    import numpy as np
    import torch

    embeds = _native_embeds(hf_model, req)[0]
    vis = req.visual_positions
    rows = np.concatenate([np.arange(vis[0]), vis[keep], np.arange(vis[-1] + 1, embeds.shape[0])])
    pruned = embeds[torch.from_numpy(rows)][None]
    return pruned, torch.arange(pruned.shape[1])[None]


def decoder_case(family, request, case_id: str):
    """prefill-8-steps: 16 kept rows, prefill + 8 decode steps on HF's DynamicCache; batch2-left-padded: batch 2,
    the second row left-padded by 3, masked prefill logits."""
    import numpy as np
    import torch

    from tests.family_matrix import DecoderCase, compact_decoder_case

    hf_model, req = request.getfixturevalue("hf_model"), request.getfixturevalue("request_inputs")
    if case_id == "batch2-left-padded":
        embeds, _ = _pruned_inputs(hf_model, req, keep=np.arange(0, 144, 4))
        length = embeds.shape[1]
        batch = torch.cat([embeds, torch.cat([torch.zeros(1, 3, embeds.shape[2]), embeds[:, 3:]], 1)])
        mask = np.ones((2, length), np.int64)
        mask[1, :3] = 0
        positions = torch.stack([torch.arange(length), (torch.arange(length) - 3).clamp(min=0)])

        def hf_batch(step, token):
            with torch.no_grad():
                return hf_model(inputs_embeds=batch, attention_mask=torch.from_numpy(mask),
                                position_ids=positions).logits[:, -1].numpy()
        return DecoderCase(batch.numpy(), mask, positions.numpy(), hf_batch)

    embeds, _ = _pruned_inputs(hf_model, req, keep=np.arange(0, 144, 9))  # 16 kept
    return compact_decoder_case(hf_model, embeds, steps=8)
