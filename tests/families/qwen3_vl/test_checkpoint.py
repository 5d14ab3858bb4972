"""The Qwen3-VL presets are real configs (transformers builds the model from them: on the meta device for the
shape-real ones), their DeepStack levels become decoder extras only for layers that exist (as HF adds them), and bad
images get one-line errors."""

from __future__ import annotations

import pytest

REAL = {  # preset: (text hidden, decoder heads, vision hidden, vision out)
    "qwen3-vl-2b": (2048, 16, 1024, 2048), "qwen3-vl-4b": (2560, 32, 1024, 2560), "qwen3-vl-8b": (4096, 32, 1152, 4096)}


@pytest.mark.parametrize("preset", sorted(REAL))
def test_shape_real_presets_build_with_deepstack_extras(preset):
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from coverpruner.families.qwen3_vl import Qwen3VLFamily
    from coverpruner.testing.qwen3_vl_checkpoints import build_qwen3_vl_config
    from coverpruner.testing.qwen_vl_common import train_qwen_tokenizer

    family = Qwen3VLFamily()
    for layers, levels in ((2, 2), (4, 3)):  # HF adds level k after decoder layer k only while that layer exists
        config = build_qwen3_vl_config(preset, train_qwen_tokenizer(), layers)
        with torch.device("meta"):
            model = Qwen3VLForConditionalGeneration(config)
        text, heads, vision, out = REAL[preset]
        assert model.model.language_model.layers[0].self_attn.q_norm.weight.shape == (128,)
        assert (config.text_config.hidden_size, config.text_config.num_attention_heads) == (text, heads)
        assert (config.vision_config.hidden_size, config.vision_config.out_hidden_size) == (vision, out)
        assert len(model.model.visual.deepstack_merger_list) == 3 and len(model.model.visual.blocks) == 4
        spec = family.decoder_spec(config)
        assert [(e.name, e.after_layer) for e in spec.extras] == [(f"visual_extra.{k}", k) for k in range(levels)]
        assert family.dims(config)["deepstack_levels"] == levels


def test_bad_images_are_one_line_errors(qwen3_export):
    import numpy as np

    from coverpruner.engine_dir import load_manifest
    from coverpruner.errors import ImageError
    from coverpruner.families import get_family

    rt = get_family("qwen3_vl").runtime(load_manifest(qwen3_export))
    with pytest.raises(ImageError, match=r"^image is 1000 x 4 pixels \(aspect ratio 250:1\); the limit is 200:1$") as err:
        rt.prepare_image(np.zeros((4, 1000, 3), np.uint8), {})
    assert "\n" not in str(err.value)
    with pytest.raises(ImageError) as err:
        rt.prepare_image(b"not an image", {})
    assert "\n" not in str(err.value)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(qwen3_export / "tokenizer.json"))
    with pytest.raises(ValueError, match="image markers"):
        rt.conversation_layout(tok, [{"role": "user", "content": [{"type": "image"},
                                                                   {"type": "text", "text": "look: <|vision_start|>"}]}],
                               [4])
