"""Contract v5 proof: a family planted in a temporary package has a decoder whose first layers carry state that is not
KV (LLaVA-1.5 with transformers' Qwen3.5 text model as its language model: 3 Gated DeltaNet layers with a conv and a
recurrent state each, then a gated full-attention layer) and whose probe reads that first full-attention layer. It
exports and runs in both decoder forms with tokens equal to an independent HF reference, touching no file outside
its package (tests/contract/planted_hybrid/, copied to tmp_path).

The reference is written here on the HF model: HF image features, the demand of HF's own first full-attention layer
(output_attentions records the attention layers only: attentions[0] is that layer's softmax after HF's Gated
DeltaNet layers ran the whole sequence), the literal float64 selector of tests/literal_selection.py, its own pruned
rows and compact positions (HF generate's defaults), HF's hybrid cache in generate.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tests.contract.planting import image, want  # noqa: F401 - the planted tests' shared fixtures

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch", reason="the reference runs the PyTorch model")

PROMPT = "What is shown in this image?"
NEW = 8
BUDGET = 16
PACKAGE = "planted_hybrid"


def _hybrid_checkpoint(tiny, out):
    """The tiny LLaVA checkpoint with its language model replaced by a 4-layer Qwen3.5 text model (random, seed 0;
    the CLIP tower and projector kept)."""
    import transformers
    from transformers import Qwen3_5TextConfig

    from coverpruner.testing.common import randomize
    from coverpruner.testing.qwen3_5_checkpoints import _qwen35_init

    shutil.copytree(tiny, out)
    old = transformers.LlavaForConditionalGeneration.from_pretrained(str(tiny))
    t = old.config.text_config
    text = Qwen3_5TextConfig(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=176, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=1024,
        rms_norm_eps=1e-5, bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id, pad_token_id=t.pad_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 3, 3], "mrope_interleaved": True})
    config = old.config
    config.text_config = text
    torch.manual_seed(0)
    with torch.no_grad():
        model = transformers.LlavaForConditionalGeneration(config)
        randomize(model.model.language_model, 0.2)
        randomize(model.lm_head, 0.2)
        _qwen35_init(model, 0.2)
        model.model.vision_tower.load_state_dict(old.model.vision_tower.state_dict())
        model.model.multi_modal_projector.load_state_dict(old.model.multi_modal_projector.state_dict())
    model.generation_config = old.generation_config
    model.save_pretrained(out)


@pytest.fixture(scope="module")
def planted(builds, tmp_path_factory):
    """(checkpoint dir, {form: engine dir}) exported with the planted family registered."""
    from tests.contract import planted_hybrid
    from tests.contract.planting import planted as plant

    root = tmp_path_factory.mktemp("planted_state")
    checkpoint = root / "checkpoint"
    _hybrid_checkpoint(builds.checkpoint("tiny"), checkpoint)
    with plant(planted_hybrid, checkpoint, root) as exports:
        yield checkpoint, exports


def reference(checkpoint, image):
    """(new token ids, kept indices, demand [n]) of the HF reference."""
    from tests.contract.planting import llava_request
    from tests.families.llava import hf_reference as ref
    from tests.literal_selection import coverage_reference

    model, ids, vpos, instr, feats, embeds = llava_request(checkpoint, image, PROMPT)
    relevance = ref.hf_layer0_relevance(model, embeds, vpos.numpy(), instr)  # HF's attentions[0]: layer 3's
    keep = coverage_reference(feats.numpy(), relevance, BUDGET, 0.3)
    image_id = model.config.image_token_id
    rows = torch.sort(torch.cat([torch.nonzero(ids != image_id).flatten(), vpos[torch.from_numpy(keep)]])).values
    with torch.no_grad():
        out = model.generate(inputs_embeds=embeds[:, rows], attention_mask=torch.ones(1, len(rows), dtype=torch.long),
                             max_new_tokens=NEW, do_sample=False)
    return out[0].tolist(), keep, relevance


def test_manifest_records_the_states_and_the_probe_layer(planted):
    from coverpruner.engine_dir import load_manifest

    for path in planted[1].values():
        manifest = load_manifest(path, verify=False)
        decoder = manifest.graphs["decoder"]
        assert manifest.family == PACKAGE and decoder.kv_layers == (3,)
        assert [(s.name, s.layers, s.shape) for s in decoder.states] == [
            ("conv", (0, 1, 2), (2 * 2 * 16 + 4 * 16, 3)), ("recurrent", (0, 1, 2), (4, 16, 16))]
        inputs = {t.name for t in decoder.inputs}
        assert "past_key_values.3.key" in inputs and "past_key_values.0.key" not in inputs
        assert manifest.raw["graphs"]["probe"]["layer"] == 3


@pytest.mark.parametrize("form", ["ort", "standard"])
def test_planted_family_equals_torch_reference(planted, image, want, form):
    from coverpruner.runtime import Pipeline

    tokens, keep, relevance = want
    pipe = Pipeline.load(planted[1][form], provider="cpu", threads=1, prefix_cache_mb=0)
    got = pipe.generate(image, PROMPT, budget=BUDGET, method="coverpruner", max_new_tokens=NEW)
    assert np.abs(got.relevance - relevance).max() <= 1e-5  # float32 softmax over ~170 keys after 3 layers
    assert got.kept_indices.tolist() == keep.tolist()
    assert got.token_ids == tokens


@pytest.mark.parametrize("form", ["ort", "standard"])
def test_prefix_cache_restores_a_turn_boundary(planted, image, want, form):
    """A second identical request restores the state snapshot taken where its messages end (its generation prompt
    runs again) and answers the same."""
    from coverpruner.runtime import Pipeline

    pipe = Pipeline.load(planted[1][form], provider="cpu", threads=1, prefix_cache_mb=16)
    first = pipe.generate(image, PROMPT, budget=BUDGET, method="coverpruner", max_new_tokens=NEW)
    again = pipe.generate(image, PROMPT, budget=BUDGET, method="coverpruner", max_new_tokens=NEW)
    assert first.cached_tokens == 0 and 0 < again.cached_tokens < again.prefill_tokens
    assert first.token_ids == again.token_ids == want[0]


def test_batched_decoding_gives_each_slot_its_states(planted, image, want):
    """Continuous batching (ORT form): two requests of different prompts share the decode calls; each answer is its
    batch-1 answer."""
    from coverpruner.runtime import Pipeline

    pipe = Pipeline.load(planted[1]["ort"], provider="cpu", threads=1, prefix_cache_mb=0)
    kwargs = dict(image=image, prompt=PROMPT, budget=BUDGET, method="coverpruner", max_new_tokens=NEW)
    alone = pipe.generate(**{**kwargs, "prompt": "Describe it."})
    results = pipe.batch_generate([kwargs, {**kwargs, "prompt": "Describe it."}], max_batch=2)
    assert results[0].token_ids == want[0] and results[1].token_ids == alone.token_ids


@pytest.mark.tensorrt
def test_tensorrt_rtx_builds_the_state_decoder(planted, trt_rtx, tmp_path):
    """TensorRT-RTX (no GPU needed) builds the planted standard-form decoder: its chunked gated delta rule (a Scan over
    the chunks) and its batch-only dynamic states."""
    from coverpruner.engine_dir import read_raw
    from coverpruner.engines.tensorrt import BuildOptions, build_engine_dir

    work = tmp_path / "dir"
    shutil.copytree(planted[1]["standard"], work)
    build_engine_dir(work, BuildOptions(max_context=128, graphs=("decoder", "probe")), trt_rtx)
    profile = read_raw(work)["tensorrt"]["engines"]["decoder"]["profile"]
    assert profile["past_key_values.0.conv"]["max"][1:] == [2 * 2 * 16 + 4 * 16, 3]
