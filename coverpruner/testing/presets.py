"""The one table of random-checkpoint presets: name -> the shapes of one checkpoint and its model family.

Presets:
  tiny             LLaVA-1.5: CLIP 168px/14 (144 patches + CLS; "default" drops CLS -> 144 visual tokens), Llama
                   with grouped-query attention (4 heads, 2 kv heads), hidden 64; for tests and demos (seconds).
  llava-1.5-7b     real widths (CLIP ViT-L/14-336, hidden 4096, 32 heads, intermediate 11008, vocab 32064),
                   fp16 weights; for latency and memory work (use --layers 2).
  llava-next-tiny  LLaVA-NeXT: the tiny widths with 84-px tiles (6 x 6 patches) and llava-v1.6's pinpoints.
  llava-next-7b    llava-v1.6-vicuna-7b widths (CLIP-L/336 + vicuna-7b, 672-px pinpoints).
  qwen2.5-vl-tiny  Qwen2.5-VL: a 64-wide window-attention ViT and Qwen2 decoder with M-RoPE.
  qwen2.5-vl-7b    Qwen2.5-VL-7B-Instruct widths.
  qwen3-vl-tiny    Qwen3-VL: a 64-wide ViT (16-px patches, learned 8x8 position grid, DeepStack after blocks 0 and 1)
                   and a Qwen3 decoder (q/k norm, interleaved M-RoPE).
  qwen3-vl-2b/4b/8b  Qwen3-VL-{2B,4B,8B}-Instruct widths (shape-real, few layers).
  gemma3-tiny      Gemma 3: a 64-wide SigLIP (336 px / 14 = 24 x 24 patches, pooled 2 x 2 to 144 soft tokens) and a
                   Gemma 3 decoder (sliding layer 0, full layer 1, window 160, q/k norm, query_pre_attn_scalar 24).
  gemma-3-4b/12b/27b  google/gemma-3-{4b,12b,27b}-it widths (shape-real, few layers).
  qwen3.5-tiny     Qwen3.5: the Qwen3-VL tiny tower without DeepStack and a hybrid decoder (3 Gated DeltaNet layers,
                   then 1 gated full-attention layer with q/k norm and partial interleaved M-RoPE).
  qwen3.5-0.8b/2b/4b/9b  Qwen3.5-{0.8B,2B,4B,9B} widths (shape-real; use --layers 4: 3 linear + 1 full).
Each row names its family (registry name) and its writer ("module:function", testing/<family>_checkpoints.py),
which turns the preset into an HF checkpoint directory; a new family adds rows here and its writer module.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    """Shapes of one random checkpoint. `vision`/`text` are CLIPVisionConfig/LlamaConfig kwargs."""

    vision: dict
    text: dict
    tokenizer_vocab: int
    dtype: str  # torch dtype name the weights are created and saved in
    init_range: float
    extra: dict = field(default_factory=dict)
    family: str = "llava"  # the registry name of the model family the checkpoint belongs to
    # "module:function" of the checkpoint writer (checkpoints.write_checkpoint imports it when asked)
    writer: str = "coverpruner.testing.llava_checkpoints:write_llava_checkpoint"


@dataclass(frozen=True)
class QwenPreset:
    """Shapes of one random checkpoint: Qwen2.5-VL / Qwen3-VL vision and text config kwargs, pixel limits."""

    vision: dict
    text: dict
    min_pixels: int
    max_pixels: int
    dtype: str
    init_range: float
    vision_layers: int | None = None
    family: str = "qwen2_5_vl"
    extra: dict = field(default_factory=dict)  # further config kwargs (e.g. tie_word_embeddings)
    writer: str = "coverpruner.testing.qwen_checkpoints:write_qwen_checkpoint"


# ---------------------------------------------------------------------------------------------- LLaVA-1.5
_TINY = Preset(
    vision=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                image_size=168, patch_size=14, projection_dim=64, hidden_act="quick_gelu"),
    text=dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5),
    tokenizer_vocab=1000,
    dtype="float32",
    # Wider than HF's 0.02 so attention maps and greedy tokens are far from uniform / constant.
    init_range=0.1,
)
_LLAVA_7B = Preset(
    vision=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                image_size=336, patch_size=14, projection_dim=768, hidden_act="quick_gelu",
                layer_norm_eps=1e-5),
    text=dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
              num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5, vocab_size=32064),
    tokenizer_vocab=1000,
    dtype="float16",
    init_range=0.02,
)



# llava-v1.6 pinpoints, (height, width) in pixels, as multiples of the tile size.
_V16_GRIDS = [[1, 2], [2, 1], [2, 2], [3, 1], [1, 3]]

_NEXT_WRITER = "coverpruner.testing.llava_next_checkpoints:write_next_checkpoint"

_QWEN3_WRITER = "coverpruner.testing.qwen3_vl_checkpoints:write_qwen3_vl_checkpoint"
# The 2B / 4B / 8B rows are the config.json widths of Qwen/Qwen3-VL-{2B,4B,8B}-Instruct (checked against copies of
# those files in public code). transformers' Qwen3VLVisionConfig defaults are the 8B tower (depth 27, 1152 wide,
# DeepStack 8/16/24) but its text defaults (intermediate 22016, 32 layers) are no released model: not a source.
# Qwen3-VL's processor limits (preprocessor_config.json of the Instruct checkpoints): 256..16384 visual tokens.
_QWEN3_PIXELS = dict(min_pixels=65536, max_pixels=16777216)
# the vision tower of the 2B / 4B checkpoints (the 8B has its own, wider one)
_QWEN3_SMALL_VISION = dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                           deepstack_visual_indexes=[5, 11, 17], hidden_act="gelu_pytorch_tanh")
_QWEN3_ROPE = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20], "mrope_interleaved": True}


def _qwen3_text(hidden: int, ffn: int, layers: int, heads: int) -> dict:
    return dict(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=8, head_dim=128, max_position_embeddings=262144, rms_norm_eps=1e-6,
                vocab_size=151936, rope_parameters=_QWEN3_ROPE)


_GEMMA3_WRITER = "coverpruner.testing.gemma3_checkpoints:write_gemma3_checkpoint"
# The 4B / 12B / 27B rows are the config.json widths of google/gemma-3-{4b,12b,27b}-it (text_config + vision_config,
# checked against copies of those files in public code); keys those files omit take transformers' Gemma3TextConfig
# defaults (head_dim 256, query_pre_attn_scalar 256, rms_norm_eps 1e-6, vocab 262,208, max positions 131,072). Every
# one: SigLIP-so400m/14 at 896 px (1152 wide, 27 blocks, 4304 ffn, 16 heads) pooled 4 x 4 to 256 soft tokens,
# sliding window 1024 on five of six layers (layer 0 sliding), linear rope scaling x8 on the full layers.
_GEMMA3_VISION = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                      image_size=896, patch_size=14, vision_use_head=False, layer_norm_eps=1e-6)
_GEMMA3_PATTERN = ["sliding_attention"] * 5 + ["full_attention"]
_GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}


def _gemma3_text(hidden: int, ffn: int, layers: int, heads: int, kv_heads: int, head_dim: int = 256,
                 scalar: int = 256) -> dict:
    return dict(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, head_dim=head_dim, query_pre_attn_scalar=scalar, sliding_window=1024,
                layer_pattern=_GEMMA3_PATTERN, rope_parameters=_GEMMA3_ROPE, max_position_embeddings=131072,
                rms_norm_eps=1e-6, vocab_size=262208, hidden_activation="gelu_pytorch_tanh",
                final_logit_softcapping=30.0)
_QWEN35_WRITER = "coverpruner.testing.qwen3_5_checkpoints:write_qwen3_5_checkpoint"
# Qwen3.5's decoder (text_config of the released config.json files): GQA full-attention layers with head_dim 256, an
# output gate and partial rotary (0.25 of head_dim: 64 dims, mrope_section [11, 11, 10] interleaved, theta 1e7);
# Gated DeltaNet layers with 16 key heads of 128 and 16 (0.8B, 2B) or 32 (4B, 9B) value heads of 128, conv kernel 4;
# vocabulary 248,320. Sources (public copies of each checkpoint's config.json, read through the code search):
#   0.8B: text 1024 / ffn 3584 / 24 layers / 8 heads / 2 kv / value heads 16, tied; vision 12 x 768 (ffn 3072,
#         12 heads) -> 1024 (a full copy of Qwen/Qwen3.5-0.8B's config.json in a C++ config test);
#   4B:   text 2560 / 9216 / 32 layers / 16 heads / 4 kv / value heads 32, tied (a MaxText guard test "against
#         Qwen/Qwen3.5-4B's config.json" and two copies of the config); vision 24 x 1024 (ffn 4096, 16 heads) -> 2560
#         (a copy of a Qwen3.5-4B-based checkpoint's config);
#   9B:   text 4096 / 12288 / 16 heads / 4 kv / head_dim 256 (a Qwen3.5-9B shape contract); 32 layers (the
#         release's model table); value heads 32 (transformers' Qwen3_5TextConfig defaults, documented as the
#         Qwen3.5-9B style); not tied; vision 27 x 1152 (ffn 4304) -> 4096 (a Qwen3.5 vision config with the 9B's
#         4096 output; the same tower as Qwen3-VL-8B's);
#   2B:   text 2048 wide, 24 layers (the release's model table and a parameter-count note on Qwen/Qwen3.5-2B);
#         ffn 6144, 8 heads / 2 kv, value heads 16 and the 24 x 1024 tower -> 2048 are NOT confirmed from a copy of
#         its config: they follow Qwen3-VL-2B's widths and Qwen3.5-0.8B's head layout (to be checked against the
#         checkpoint before quoting 2B figures).
# Processor limits: the Qwen3-VL processor's (Qwen3.5 loads Qwen3VLProcessor with Qwen2VLImageProcessor).
_QWEN35_ROPE = {"rope_type": "default", "rope_theta": 10000000.0, "mrope_section": [11, 11, 10],
                "mrope_interleaved": True, "partial_rotary_factor": 0.25}


def _qwen35_text(hidden: int, ffn: int, layers: int, heads: int, kv: int, value_heads: int) -> dict:
    return dict(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=value_heads,
                linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                max_position_embeddings=262144, rms_norm_eps=1e-6, vocab_size=248320, rope_parameters=_QWEN35_ROPE)


def _qwen35_vision(depth: int, hidden: int, ffn: int, heads: int, out: int) -> dict:
    return dict(depth=depth, hidden_size=hidden, intermediate_size=ffn, num_heads=heads, out_hidden_size=out,
                patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                hidden_act="gelu_pytorch_tanh")


PRESETS: dict[str, Preset | QwenPreset] = {
    "tiny": _TINY,
    "llava-1.5-7b": _LLAVA_7B,
    # LLaVA-1.5's tiny model with 84-px tiles (6 x 6 patches), so a 2x2 grid stays small.
    "llava-next-tiny": Preset(
        vision={**_TINY.vision, "image_size": 84}, text=_TINY.text, tokenizer_vocab=_TINY.tokenizer_vocab,
        dtype="float32", init_range=_TINY.init_range, extra=dict(grids=_V16_GRIDS), family="llava_next",
        writer=_NEXT_WRITER,
    ),
    # llava-v1.6-vicuna-7b has llava-1.5-7b's widths (CLIP ViT-L/14-336 + vicuna-7b); only the anyres grid differs.
    "llava-next-7b": Preset(
        vision=_LLAVA_7B.vision, text=_LLAVA_7B.text, tokenizer_vocab=1000, dtype="float16", init_range=0.02,
        extra=dict(grids=_V16_GRIDS), family="llava_next",
        writer=_NEXT_WRITER,
    ),
    "qwen2.5-vl-tiny": QwenPreset(
        vision=dict(depth=4, hidden_size=64, intermediate_size=96, num_heads=4, out_hidden_size=64,
                    window_size=84, fullatt_block_indexes=[1, 3], patch_size=14, spatial_merge_size=2,
                    temporal_patch_size=2, tokens_per_second=2, hidden_act="silu"),
        text=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-6,
                  # theta 1e4 (not the real 1e6) so that every rotary pair turns noticeably over a few
                  # hundred positions and wrong positions change the answer.
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}),
        min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 160, dtype="float32",
        # 0.2: at 0.1 the 64-wide model falls into repeating one token; 0.2 gives varied greedy answers.
        init_range=0.2,
    ),
    "qwen2.5-vl-7b": QwenPreset(
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                    window_size=112, fullatt_block_indexes=[7, 15, 23, 31], patch_size=14, spatial_merge_size=2,
                    temporal_patch_size=2, tokens_per_second=2, hidden_act="silu"),
        text=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                  num_key_value_heads=4, max_position_embeddings=128000, rms_norm_eps=1e-6, vocab_size=152064,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}),
        min_pixels=56 * 56, max_pixels=28 * 28 * 16384, dtype="float16", init_range=0.02, vision_layers=4,
    ),
    "qwen3-vl-tiny": QwenPreset(
        vision=dict(depth=3, hidden_size=64, intermediate_size=96, num_heads=4, out_hidden_size=64, patch_size=16,
                    spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                    deepstack_visual_indexes=[0, 1], hidden_act="gelu_pytorch_tanh"),
        text=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, rms_norm_eps=1e-6,
                  # theta 1e4 as qwen2.5-vl-tiny: wrong positions change the answer; sections sum to head_dim / 2
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                   "mrope_interleaved": True}),
        min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 160, dtype="float32", init_range=0.2,
        family="qwen3_vl", writer=_QWEN3_WRITER,
    ),
    "qwen3-vl-2b": QwenPreset(
        vision={**_QWEN3_SMALL_VISION, "out_hidden_size": 2048}, text=_qwen3_text(2048, 6144, 28, 16),
        **_QWEN3_PIXELS, dtype="float16", init_range=0.02, vision_layers=4, family="qwen3_vl", writer=_QWEN3_WRITER,
        extra=dict(tie_word_embeddings=True),
    ),
    "qwen3-vl-4b": QwenPreset(
        vision={**_QWEN3_SMALL_VISION, "out_hidden_size": 2560}, text=_qwen3_text(2560, 9728, 36, 32),
        **_QWEN3_PIXELS, dtype="float16", init_range=0.02, vision_layers=4, family="qwen3_vl", writer=_QWEN3_WRITER,
        extra=dict(tie_word_embeddings=True),
    ),
    "qwen3-vl-8b": QwenPreset(
        vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096,
                    patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                    deepstack_visual_indexes=[8, 16, 24], hidden_act="gelu_pytorch_tanh"),
        text=_qwen3_text(4096, 12288, 36, 32), **_QWEN3_PIXELS, dtype="float16", init_range=0.02, vision_layers=4,
        family="qwen3_vl", writer=_QWEN3_WRITER,
    ),
    # 336 px / 14 = 24 x 24 patches pooled 2 x 2 to 12 x 12 = 144 soft tokens per image (crop); layer 0 sliding and
    # layer 1 full as the real stack begins; a window of 160 rows: longer than one image block, shorter than a
    # one-image prompt; query_pre_attn_scalar 24 != head_dim 16 (a 1/sqrt(head_dim) scaling would differ); rope as
    # the real checkpoints (local 1e4; global 1e6 with linear scaling x8).
    "gemma3-tiny": Preset(
        vision=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=336,
                    patch_size=14, vision_use_head=False, layer_norm_eps=1e-6),
        text=dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=160,
                  layer_pattern=["sliding_attention", "full_attention"], rope_parameters=_GEMMA3_ROPE,
                  max_position_embeddings=2048, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
                  final_logit_softcapping=30.0),
        tokenizer_vocab=1000, dtype="float32", init_range=0.3,
        # untied: with the input embedding in the residual stream a tied head repeats the last prompt token forever
        extra=dict(mm_tokens_per_image=144, tie_word_embeddings=False),
        family="gemma3", writer=_GEMMA3_WRITER,
    ),
    "gemma-3-4b": Preset(vision=_GEMMA3_VISION, text=_gemma3_text(2560, 10240, 34, 8, 4), tokenizer_vocab=1000,
                         dtype="float16", init_range=0.02, extra=dict(mm_tokens_per_image=256, vision_layers=4),
                         family="gemma3", writer=_GEMMA3_WRITER),
    "gemma-3-12b": Preset(vision=_GEMMA3_VISION, text=_gemma3_text(3840, 15360, 48, 16, 8), tokenizer_vocab=1000,
                          dtype="float16", init_range=0.02, extra=dict(mm_tokens_per_image=256, vision_layers=4),
                          family="gemma3", writer=_GEMMA3_WRITER),
    "gemma-3-27b": Preset(vision=_GEMMA3_VISION, text=_gemma3_text(5376, 21504, 62, 32, 16, 128, 168),
                          tokenizer_vocab=1000, dtype="float16", init_range=0.02,
                          extra=dict(mm_tokens_per_image=256, vision_layers=4), family="gemma3",
                          writer=_GEMMA3_WRITER),
    "qwen3.5-tiny": QwenPreset(
        vision=dict(depth=3, hidden_size=64, intermediate_size=96, num_heads=4, out_hidden_size=64, patch_size=16,
                    spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                    hidden_act="gelu_pytorch_tanh"),
        # 4 layers: 3 Gated DeltaNet + 1 full attention (the default pattern); head_dim 64 so the partial rotary's
        # 16 dims (cos/sin 8 wide, what ONNX Runtime's GroupQueryAttention takes) carry sections [2, 3, 3]; theta 1e4
        # as the other tiny Qwens so that wrong positions change the answer
        text=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                  max_position_embeddings=2048, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                   "mrope_interleaved": True, "partial_rotary_factor": 0.25}),
        min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 160, dtype="float32", init_range=0.2,
        family="qwen3_5", writer=_QWEN35_WRITER,
    ),
    "qwen3.5-0.8b": QwenPreset(
        vision=_qwen35_vision(12, 768, 3072, 12, 1024), text=_qwen35_text(1024, 3584, 24, 8, 2, 16),
        **_QWEN3_PIXELS, dtype="float16", init_range=0.02, vision_layers=4, family="qwen3_5", writer=_QWEN35_WRITER,
        extra=dict(tie_word_embeddings=True),
    ),
    "qwen3.5-2b": QwenPreset(
        vision=_qwen35_vision(24, 1024, 4096, 16, 2048), text=_qwen35_text(2048, 6144, 24, 8, 2, 16),
        **_QWEN3_PIXELS, dtype="float16", init_range=0.02, vision_layers=4, family="qwen3_5", writer=_QWEN35_WRITER,
        extra=dict(tie_word_embeddings=True),
    ),
    "qwen3.5-4b": QwenPreset(
        vision=_qwen35_vision(24, 1024, 4096, 16, 2560), text=_qwen35_text(2560, 9216, 32, 16, 4, 32),
        **_QWEN3_PIXELS, dtype="float16", init_range=0.02, vision_layers=4, family="qwen3_5", writer=_QWEN35_WRITER,
        extra=dict(tie_word_embeddings=True),
    ),
    "qwen3.5-9b": QwenPreset(
        vision=_qwen35_vision(27, 1152, 4304, 16, 4096), text=_qwen35_text(4096, 12288, 32, 16, 4, 32),
        **_QWEN3_PIXELS, dtype="float16", init_range=0.02, vision_layers=4, family="qwen3_5", writer=_QWEN35_WRITER,
    ),
}


def presets_of(family: str) -> dict:
    """{name: preset} of one model family (registry name), in table order."""
    return {name: p for name, p in PRESETS.items() if p.family == family}
