"""Random-weight Qwen2.5-VL checkpoints in the HF format, written locally (no downloads).

`write_qwen_checkpoint(output, preset)` writes config.json, model.safetensors, a byte-level BPE tokenizer
trained with `tokenizers` (testing/qwen_vl_common.py, shared with Qwen3-VL; Qwen's specials: <|endoftext|>,
<|im_start|>, <|im_end|>, <|vision_start|>, <|vision_end|>, <|image_pad|>, <|video_pad|>), preprocessor_config.json (Qwen2-VL image processor, PIL
backend) and the chat template of Qwen/Qwen2.5-VL-*-Instruct with the tool sections of its tokenizer_config.json
merged in (QWEN2_5_VL_TOOLS_CHAT_TEMPLATE: the published chat_template.json renders no tools), so that
`Qwen2_5_VLForConditionalGeneration` and `Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessorPil(...))`
load the directory like a hub checkpoint. (`AutoProcessor` would also build the video processor, which
needs torchvision; nothing here or in the runtime depends on it.)

Presets (testing/presets.py):
  qwen2.5-vl-tiny  vision: hidden 64, 4 heads, depth 4, full-attention blocks (1, 3), window 84 px = 3x3
                   merged patches (smaller than every test grid and not dividing most of them, so window
                   padding matters); text: hidden 64, 4 heads / 2 kv heads (GQA), q/k/v bias, head_dim 16,
                   mrope_section [2, 3, 3]; pixels limited to 28*28*[4, 160] (4..160 visual tokens).
  qwen2.5-vl-7b    real widths of Qwen2.5-VL-7B-Instruct (vision 1280 x 16 heads, 3584 out; text 3584, 28
                   heads / 4 kv heads, intermediate 18944, vocab 152064, mrope [16, 24, 24]) with `layers`
                   decoder layers (default 2) and 4 vision blocks (full attention at block 3), fp16 weights.
"""

from __future__ import annotations

from pathlib import Path

from coverpruner.testing.presets import presets_of
from coverpruner.testing.qwen_vl_common import (build_config, check_preset, image_processor, train_qwen_tokenizer,
                                                write_qwen_vl_checkpoint)

QWEN_PRESETS = presets_of("qwen2_5_vl")  # testing/presets.py's Qwen2.5-VL rows

# The chat template published with Qwen/Qwen2.5-VL-7B-Instruct (default system turn, ChatML, vision markers).
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in "
    "messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful "
    "assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] "
    "== 'image' or 'image' in content or 'image_url' in content %}{% set image_count.value = image_count.value + "
    "1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|>"
    "<|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = "
    "video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|>"
    "<|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen/Qwen2.5-VL-*-Instruct publish two templates: chat_template.json (above: images and videos, no tools) and, in
# tokenizer_config.json, Qwen2.5's text template (tools in the system turn, <tool_call> / <tool_response>, no
# images). Neither renders a tool conversation with images, so agents serve Qwen2.5-VL with the two merged (vLLM's
# --chat-template, verl's custom_chat_template). This is that merge: the tool sections of tokenizer_config.json's
# template verbatim (its system turn "You are a helpful assistant.", arguments as a JSON object through tojson),
# each content rendered as chat_template.json renders it (a string, or text / image / video parts). Without tools it
# renders every conversation of system, user and assistant turns as chat_template.json does.
QWEN2_5_VL_TOOLS_CHAT_TEMPLATE = (
    "{%- set image_count = namespace(value=0) %}{%- set video_count = namespace(value=0) %}"
    "{%- macro render_content(content) %}{%- if content is string %}{{- content }}{%- else %}"
    "{%- for item in content %}{%- if item['type'] == 'image' or 'image' in item or 'image_url' in item %}"
    "{%- set image_count.value = image_count.value + 1 %}{%- if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif -%}<|vision_start|><|image_pad|><|vision_end|>{%- elif item['type'] == 'video' or 'video' in item %}"
    "{%- set video_count.value = video_count.value + 1 %}{%- if add_vision_id %}Video {{ video_count.value }}: "
    "{% endif -%}<|vision_start|><|video_pad|><|vision_end|>{%- elif 'text' in item %}{{- item['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}{%- endmacro %}"
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- render_content(messages[0]['content']) }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>\" }}{%- for tool in tools %}{{- \"\\n\" }}"
    "{{- tool | tojson }}{%- endfor %}{{- \"\\n</tools>\\n\\nFor each function call, return a json object with "
    "function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' }}"
    "{{- render_content(messages[0]['content']) }}{{- '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}{%- if (message.role == \"user\") or (message.role == \"system\" and not "
    "loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}{{- render_content(message.content) }}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == \"assistant\" %}{{- '<|im_start|>' + message.role }}{%- if message.content %}"
    "{{- '\\n' }}{{- render_content(message.content) }}{%- endif %}{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == \"tool\" %}{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "
    "\"tool\") %}{{- '<|im_start|>user' }}{%- endif %}{{- '\\n<tool_response>\\n' }}"
    "{{- render_content(message.content) }}{{- '\\n</tool_response>' }}{%- if loop.last or "
    "(messages[loop.index0 + 1].role != \"tool\") %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _trim_windowed(vision: dict, blocks: int) -> None:
    """Fewer vision blocks: keep the full-attention blocks below `blocks` (or make the last one full)."""
    vision["depth"] = blocks
    vision["fullatt_block_indexes"] = [i for i in vision["fullatt_block_indexes"] if i < blocks] or [blocks - 1]


def build_qwen_config(preset_name: str, tokenizer, layers: int | None = None):
    """Qwen2_5_VLConfig of a preset (no weights); token ids taken from `tokenizer`."""
    from transformers import Qwen2_5_VLConfig

    return build_config(Qwen2_5_VLConfig, QWEN_PRESETS[preset_name], tokenizer, layers, _trim_windowed,
                        tie_word_embeddings=False)


def write_qwen_checkpoint(output: str | Path, preset: str = "qwen2.5-vl-tiny", layers: int | None = None,
                          seed: int = 0) -> Path:
    """Write a random-weight Qwen2.5-VL checkpoint of `preset` into `output`; returns the directory.

    Weights: normal(0, init_range) for linears, embeddings and biases, 1 + normal for norms; deterministic
    for a given seed. generation_config.json carries the real checkpoint's repetition_penalty (1.05). The
    checkpoint stores the tokenizer, the Qwen2-VL PIL image processor and chat_template.jinja; a
    `Qwen2_5_VLProcessor` cannot be built without torchvision (its video processor), so none is saved (tests build
    one around these parts).
    """
    from transformers import Qwen2_5_VLForConditionalGeneration

    p = check_preset(QWEN_PRESETS, preset)
    tok = train_qwen_tokenizer(seed=seed)
    # The published generation_config (greedy via top_k=1 with a repetition penalty).
    generation = dict(do_sample=True, repetition_penalty=1.05, temperature=0.1, top_p=0.001, top_k=1)
    return write_qwen_vl_checkpoint(output, p, tok, build_qwen_config(preset, tok, layers),
                                    Qwen2_5_VLForConditionalGeneration, generation, QWEN2_5_VL_TOOLS_CHAT_TEMPLATE, 32768,
                                    image_processor(p), seed)
