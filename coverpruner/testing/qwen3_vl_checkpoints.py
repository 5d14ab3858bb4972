"""Random-weight Qwen3-VL checkpoints in the HF format, written locally (no downloads).

`write_qwen3_vl_checkpoint(output, preset)` writes config.json (Qwen3VLConfig), model.safetensors, the byte-level
BPE test tokenizer (testing/qwen_vl_common.py's, Qwen's specials), preprocessor_config.json (Qwen2-VL image
processor with Qwen3-VL's 16-px patches and 0.5 mean/std) and the tool-capable chat template of the
Qwen3-VL-*-Instruct checkpoints (no default system turn; tools, tool calls and tool responses rendered as there), so
`Qwen3VLForConditionalGeneration` loads the directory like a hub checkpoint.

Presets (testing/presets.py): qwen3-vl-tiny (64 wide, 3 vision blocks with DeepStack after blocks 0 and 1, 2
decoder layers, q/k norm, interleaved mrope_section [2, 3, 3]); qwen3-vl-2b / 4b / 8b (real widths, fp16) with
`layers` decoder layers (default 2) and `vision_layers` (preset: 4) vision blocks whose DeepStack levels keep
their count and sit after blocks 0, 1, 2 (the real checkpoints' blocks are deeper than 4).
"""

from __future__ import annotations

from pathlib import Path

from coverpruner.testing.presets import presets_of
from coverpruner.testing.qwen_vl_common import (build_config, check_preset, image_processor, train_qwen_tokenizer,
                                                write_qwen_vl_checkpoint)

QWEN3_VL_PRESETS = presets_of("qwen3_vl")

# The chat template of Qwen/Qwen3-VL-*-Instruct (ChatML; a system turn only when given; tools in the system turn).
QWEN3_VL_CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}{%- if messages[0].content "
    "is string %}{{- messages[0].content }}{%- else %}{%- for content in messages[0].content %}{%- if 'text' in "
    "content %}{{- content.text }}{%- endif %}{%- endfor %}{%- endif %}{{- '\\n\\n' }}{%- endif %}{{- \"# Tools\\n\\n"
    "You may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures "
    "within <tools></tools> XML tags:\\n<tools>\" }}{%- for tool in tools %}{{- \"\\n\" }}{{- tool | tojson }}"
    "{%- endfor %}{{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}{%- else %}{%- if messages[0].role == "
    "'system' %}{{- '<|im_start|>system\\n' }}{%- if messages[0].content is string %}{{- messages[0].content }}"
    "{%- else %}{%- for content in messages[0].content %}{%- if 'text' in content %}{{- content.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- set image_count = namespace(value=0) %}{%- set video_count = namespace(value=0) %}"
    "{%- for message in messages %}{%- if message.role == \"user\" %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}{%- else %}{%- for content in message.content %}"
    "{%- if content.type == 'image' or 'image' in content or 'image_url' in content %}"
    "{%- set image_count.value = image_count.value + 1 %}{%- if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif content.type == 'video' or 'video' in content %}{%- set video_count.value = video_count.value + 1 %}"
    "{%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in content %}{{- content.text }}{%- endif %}{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == \"assistant\" %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}{%- else %}{%- for content_item in message.content %}"
    "{%- if 'text' in content_item %}{{- content_item.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}{%- if (loop.first and message.content) "
    "or (not loop.first) %}{{- '\\n' }}{%- endif %}{%- if tool_call.function %}{%- set tool_call = "
    "tool_call.function %}{%- endif %}{{- '<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}"
    "{{- '\", \"arguments\": ' }}{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}"
    "{{- tool_call.arguments | tojson }}{%- endif %}{{- '}\\n</tool_call>' }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- elif message.role == \"tool\" %}{%- if loop.first or (messages[loop.index0 - 1].role "
    "!= \"tool\") %}{{- '<|im_start|>user' }}{%- endif %}{{- '\\n<tool_response>\\n' }}{%- if message.content is "
    "string %}{{- message.content }}{%- else %}{%- for content in message.content %}{%- if content.type == 'image' "
    "or 'image' in content or 'image_url' in content %}{%- set image_count.value = image_count.value + 1 %}"
    "{%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif content.type == 'video' or 'video' in content %}{%- set video_count.value = video_count.value + 1 %}"
    "{%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in content %}{{- content.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '\\n</tool_response>' }}{%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# The chat template of Qwen/Qwen3-VL-*-Thinking: the Instruct template's system, tool and vision sections, each
# content rendered once by a macro (string or parts), Qwen3's thinking rules for assistant turns (reasoning_content,
# else the text before </think>; shown for the turns after the last user query only) and a generation prompt that
# opens the thinking: "<|im_start|>assistant\n<think>\n". No enable_thinking switch (the Thinking checkpoints always
# think). Written from the published file's structure (not fetched here: this machine has no network).
QWEN3_VL_THINKING_CHAT_TEMPLATE = r"""{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- macro render_content(content, do_vision_count) %}
    {%- if content is string %}
        {{- content }}
    {%- else %}
        {%- for item in content %}
            {%- if 'image' in item or 'image_url' in item or item.type == 'image' %}
                {%- if do_vision_count %}
                    {%- set image_count.value = image_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                <|vision_start|><|image_pad|><|vision_end|>
            {%- elif 'video' in item or item.type == 'video' %}
                {%- if do_vision_count %}
                    {%- set video_count.value = video_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                <|vision_start|><|video_pad|><|vision_end|>
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- render_content(messages[0].content, false) + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + render_content(messages[0].content, false) + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = render_content(message.content, false) %}
        {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = render_content(message.content, true) %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n<think>\n' }}
{%- endif %}
"""
#: the chat templates a Qwen3-VL checkpoint is written with (write_qwen3_vl_checkpoint's ``template``)
QWEN3_VL_TEMPLATES = {"instruct": QWEN3_VL_CHAT_TEMPLATE, "thinking": QWEN3_VL_THINKING_CHAT_TEMPLATE}


def _trim_deepstack(vision: dict, blocks: int) -> None:
    """Fewer vision blocks: keep every DeepStack level, after the first blocks."""
    vision["depth"] = blocks
    vision["deepstack_visual_indexes"] = list(range(min(len(vision["deepstack_visual_indexes"]), blocks)))


def build_qwen3_vl_config(preset_name: str, tokenizer, layers: int | None = None):
    """Qwen3VLConfig of a preset (no weights); token ids taken from `tokenizer`."""
    from transformers import Qwen3VLConfig

    p = QWEN3_VL_PRESETS[preset_name]
    return build_config(Qwen3VLConfig, p, tokenizer, layers, _trim_deepstack,
                        tie_word_embeddings=p.extra.get("tie_word_embeddings", False))


def write_qwen3_vl_checkpoint(output: str | Path, preset: str = "qwen3-vl-tiny", layers: int | None = None,
                              seed: int = 0, template: str = "instruct") -> Path:
    """Write a random-weight Qwen3-VL checkpoint of `preset` into `output`; returns the directory.

    Weights: normal(0, init_range) for linears and embeddings, 1 + normal for norms (q/k norms included, so a
    missing q/k norm shows); deterministic for a given seed. generation_config.json: greedy, stopping on
    <|im_end|> and <|endoftext|>. The image processor: Qwen2-VL's PIL one with 16-px patches and Qwen3-VL's 0.5
    mean / std. template: "instruct" (the Instruct checkpoints' chat template) or "thinking" (the Thinking ones').
    """
    from transformers import Qwen3VLForConditionalGeneration

    p = check_preset(QWEN3_VL_PRESETS, preset)
    if template not in QWEN3_VL_TEMPLATES:
        raise ValueError(f"template must be one of {sorted(QWEN3_VL_TEMPLATES)}, got {template!r}")
    tok = train_qwen_tokenizer(seed=seed)
    return write_qwen_vl_checkpoint(output, p, tok, build_qwen3_vl_config(preset, tok, layers),
                                    Qwen3VLForConditionalGeneration, dict(do_sample=False), QWEN3_VL_TEMPLATES[template],
                                    262144, image_processor(p, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]),
                                    seed)
