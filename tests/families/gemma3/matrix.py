"""Gemma 3's facts for the family matrix (tests/matrix/): what the generic tests ask of this family."""

from __future__ import annotations

PRESET = "gemma3-tiny"

# candidates of assets/demo.png: one 336-px crop pooled to 12 x 12 soft tokens (pan-and-scan is off by default)
DEMO_CANDIDATES = 144
# compact positions: a pruned prompt uses fewer positions
PRUNING_FREES_CONTEXT = True
KEEP_ALL_OPTIONS: dict = {}

TRT_BUILD_ARGS = ["--budgets", "16,64", "--max-context", "256", "--max-batch", "2"]


def check_trt_profiles(section: dict, manifest: dict) -> None:
    """The vision graph takes up to 1 + 4 pan-and-scan crops (axes.crops); the decoder's attention_blocks ride
    inputs_embeds' batch and sequence axes."""
    assert section["engines"]["vision"]["profile"]["pixel_values"]["max"] == [5, 3, 336, 336]
    decoder = section["engines"]["decoder"]["profile"]
    assert decoder["attention_blocks"]["max"] == decoder["inputs_embeds"]["max"][:2] == [2, 256]


# --- "pipeline == independent HF reference" (tests/matrix/test_pipeline_reference.py) ---
# The reference (tests/families/gemma3/hf_reference.py): Gemma3Processor (chat template, pan-and-scan), HF image
# features, HF layer-0 attention of the whole model with its own masks, literal float64 selectors (one budget per
# image over all its crops), its own gather of the pruned rows, a greedy loop whose prefill gives HF the pruned
# token_type_ids (HF's block mask of the kept soft tokens) at compact positions.
NEW = 8
PROMPTS = {"plain": "What is shown in this image?", "pan-and-scan": "How many red houses are near the tall tree?"}
# one crop (a 163-token native prompt: past the 160-row window) and pan-and-scan (4 blocks, one budget over 576
# candidates, a 626-token native prompt)
PIPELINE_CASES = ["plain", "pan-and-scan"]
# the ORT form's host block masks are what differs from the standard form: pan-and-scan's four blocks test them; the
# one-crop case's single block runs in the ORT form in test_pipeline.py (chunked beside decodes at budget 16 ==
# batch 1 == the HF reference; the prefix cache around a block) (CI time: 6 fewer HF-reference runs)
ORT_PIPELINE_CASES = ["pan-and-scan"]


def pipeline_case(family, request, case_id: str):
    """(PIL image, prompt, generate options): a smooth 240 x 200 image (one crop, a 163-token prompt: longer than the
    160-row window), and 800 x 300 noise with pan-and-scan (3 crops + the whole image: 576 candidates; noise: a
    smooth image's flat crops pool to near-duplicate soft tokens, whose gains tie below float32's resolution)."""
    import numpy as np
    from PIL import Image

    from tests.families.gemma3.fixtures import wide_image

    if case_id == "plain":
        return wide_image(4, (200, 240)), PROMPTS[case_id], {}
    noise = np.random.default_rng(5).integers(0, 256, (300, 800, 3), dtype=np.uint8)
    return Image.fromarray(noise), PROMPTS[case_id], {"pan_and_scan": True}


def _pan(case_id: str) -> bool:
    return case_id == "pan-and-scan"


def hf_full(family, request, case_id: str) -> list[int]:
    """transformers' generate on the processor's inputs: the new token ids."""
    from tests.families.gemma3 import hf_reference as ref

    processor, model = request.getfixturevalue("gemma3_hf")
    image, prompt, _ = pipeline_case(family, request, case_id)
    return family.memo(("full", case_id), lambda: ref.hf_generate(model, processor, image, prompt, NEW, _pan(case_id)))


def hf_pruned(family, request, case_id: str, budget: int, method: str):
    """(new token ids, kept indices, demand float64 [n] or None, instruction positions int64 [T])."""
    from tests.families.gemma3 import hf_reference as ref

    processor, model = request.getfixturevalue("gemma3_hf")
    image, prompt, _ = pipeline_case(family, request, case_id)

    def make():
        a = ref.one_image(model, processor, image, prompt, budget, method, NEW, _pan(case_id))
        return a.tokens, a.keep[0], a.relevance[0], a.instruction[0]
    return family.memo(("pruned", case_id, budget, method), make)


def _candidates(case_id: str) -> int:
    return 144 * (4 if _pan(case_id) else 1)


def check_full(family, request, case_id: str, got, want) -> None:
    processor, _ = request.getfixturevalue("gemma3_hf")
    assert got.text == processor.tokenizer.decode(want, skip_special_tokens=True)
    assert got.num_visual_tokens == _candidates(case_id)
    assert len(got.images[0].panels) == (4 if _pan(case_id) else 1)  # the whole image, then each crop


def check_pruned(family, request, case_id: str, got, ref_out, budget: int) -> None:
    """Instruction positions are the reference's; the pruned prefill is the prompt less n - budget rows."""
    pipe = family.pipe
    image, prompt, options = pipeline_case(family, request, case_id)
    _, keep, _, instr = ref_out
    vision = pipe.family_runtime.prepare_image(image, pipe.resolve_options(options))
    turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    layout = pipe.encoder.encode_conversation(turn, [vision.num_candidates], [vision.facts])
    assert layout.instruction_turn[0].tolist() == instr.tolist()
    assert got.prefill_tokens == got.prompt_tokens - _candidates(case_id) + budget


# --- "every graph vs HF" (tests/matrix/test_graph_parity.py) ---
GRAPH_CASES = ["vision-crops", "embed-ids", "probe-plain", "probe-pan-and-scan", "selector-64"]
DECODER_CASES = ["pruned-blocks", "native-window"]


def _request(family, request, case_id: str):
    """(HF Request of the case, our layout) memoized per case."""
    from tests.families.gemma3 import hf_gemma3 as hf
    from tests.families.gemma3 import hf_reference as ref

    def make():
        processor, model = request.getfixturevalue("gemma3_hf")
        image, prompt, options = pipeline_case(family, request, case_id)
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        text, _ = ref.render(processor, messages)
        req = hf.native(model, hf.processor_inputs(processor, text, [image], _pan(case_id)))
        pipe = family.pipe
        vision = pipe.family_runtime.prepare_image(image, pipe.resolve_options(options))
        layout = pipe.encoder.encode_conversation(messages, [vision.num_candidates], [vision.facts])
        assert layout.input_ids.tolist() == req.inputs["input_ids"][0].tolist()
        return req, layout
    return family.memo(("request", case_id), make)


def graph_case(family, request, case_id: str):
    import numpy as np
    import torch

    from tests.families.gemma3 import hf_gemma3 as hf
    from tests.families.qwen_common import selector_case
    from tests.family_matrix import GraphCase

    _, model = request.getfixturevalue("gemma3_hf")
    graph = case_id.split("-")[0]
    if graph == "vision":
        req, _ = _request(family, request, "pan-and-scan")
        pixels = req.inputs["pixel_values"].numpy()
        want = req.features.numpy().reshape(pixels.shape[0], -1, req.features.shape[-1])
        # float32 through 2 SigLIP blocks, a 2 x 2 average pool and the projector: ~1e-6 of the output scale
        return GraphCase({"pixel_values": pixels}, want, atol=1e-5 * np.abs(want).max())
    if graph == "embed":  # Gemma scales the embeddings by sqrt(hidden) inside its token table: the graph carries it
        ids = np.array([[2, 5, 7, 8, 17, 265, 900, 1003, 1265]], np.int64)
        with torch.no_grad():
            want = model.get_input_embeddings()(torch.from_numpy(ids)).numpy()
        return GraphCase({"input_ids": ids}, want)
    if graph == "probe":
        req, layout = _request(family, request, case_id.split("-", 1)[1])
        att = hf.layer0_attention(model, req.inputs)  # transformers' own masks: window + block overlay
        instr, vis = layout.instruction_turn[0], layout.visual_positions
        want = att[:, instr][:, :, vis].mean(dim=(0, 1)).numpy()

        def check(got, want, sess):
            assert (want > 0).any() and want.std() > 0.05 * want.mean()  # a demand the selection can follow
        # float32 softmax over <= 626 keys: relative rounding ~1e-7 of the O(1/L) probabilities
        return GraphCase({"inputs_embeds": req.embeds.numpy(), "position_ids": np.arange(req.embeds.shape[1])[None],
                          "visual_positions": vis, "instruction_positions": instr}, want, atol=1e-5, check=check)
    req, _ = _request(family, request, "plain")  # selector-<budget>
    return selector_case(req.features.numpy(), int(case_id.split("-")[1]))


def decoder_case(family, request, case_id: str):
    """pruned-blocks: the pan-and-scan request with 40 of its 576 soft tokens kept (every crop keeps some: 4 blocks),
    prefill + 6 decode steps; native-window: the plain request unpruned (163 rows, a 160-row window), + 4 steps. HF
    runs the same rows with the rows' token_type_ids (its own block and window masks) and DynamicCache steps."""
    import numpy as np
    import torch
    from transformers import DynamicCache

    from tests.family_matrix import DecoderCase

    _, model = request.getfixturevalue("gemma3_hf")
    req, _ = _request(family, request, "pan-and-scan" if case_id == "pruned-blocks" else "plain")
    ids = req.inputs["input_ids"][0]
    rows = np.arange(len(ids))
    if case_id == "pruned-blocks":
        keep = np.sort(np.random.default_rng(3).choice(req.visual, 40, replace=False))
        rows = np.sort(np.concatenate([np.flatnonzero(~np.isin(rows, req.visual)), keep]))
    embeds, types = req.embeds[:, torch.from_numpy(rows)], (ids[torch.from_numpy(rows)] == model.config.image_token_id)
    blocks = np.cumsum(np.diff(np.concatenate([[0], types.numpy().astype(int)])) == 1) - 1  # one id per run
    blocks = np.where(types.numpy(), blocks, -1)[None].astype(np.int64)
    length, steps = embeds.shape[1], 6 if case_id == "pruned-blocks" else 4
    cache = DynamicCache(config=model.config.text_config)
    table = model.get_input_embeddings()

    def hf_logits(step, token):
        with torch.no_grad():
            if step == 0:
                out = model(inputs_embeds=embeds, token_type_ids=types.long()[None], position_ids=torch.arange(length)[None],
                            cache=cache, use_cache=True)
                causal = model(inputs_embeds=embeds, position_ids=torch.arange(length)[None]).logits[:, -1]
                assert (out.logits[:, -1] - causal).abs().max() > 1e-3, "the block mask does not matter here"
                return out.logits[:, -1].numpy()
            return model(inputs_embeds=table(torch.tensor([[token]])), position_ids=torch.tensor([[length + step - 1]]),
                         cache=cache, use_cache=True).logits[:, -1].numpy()

    def step_inputs(step, token):
        with torch.no_grad():
            return table(torch.tensor([[token]])).numpy(), np.array([[length + step - 1]], np.int64)

    return DecoderCase(embeds.numpy(), np.ones((1, length), np.int64), np.arange(length, dtype=np.int64)[None],
                       hf_logits, step_inputs, steps=steps, min_distinct_tokens=2, blocks=blocks)
