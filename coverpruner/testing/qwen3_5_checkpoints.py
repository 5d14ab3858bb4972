"""Random-weight Qwen3.5 checkpoints in the HF format, written locally (no downloads).

`write_qwen3_5_checkpoint(output, preset)` writes config.json (Qwen3_5Config), model.safetensors, the byte-level
BPE test tokenizer (testing/qwen_vl_common.py's, Qwen's specials, plus <think> / </think> as single non-special
tokens as in the released tokenizer), preprocessor_config.json (Qwen2-VL image processor with 16-px patches and
0.5 mean / std, as Qwen3-VL) and the chat template of the Qwen3.5 checkpoints (QWEN3_5_CHAT_TEMPLATE: message
content trimmed, earlier assistant turns without their reasoning, the generation prompt opening a <think> block), so
`Qwen3_5ForConditionalGeneration` loads the directory like a hub checkpoint.

The decoder is hybrid: `layer_types` is transformers' default pattern (every 4th layer full attention, the others
Gated DeltaNet); a decoder cut to fewer than 4 layers gets its last layer as the full-attention one, so every
checkpoint has a layer the probe can read (the 4-layer cut of the shape-real presets is 3 linear + 1 full).
Weights: normal(0, init_range); Qwen3.5's zero-centred RMSNorms (scale 1 + w) get w ~ normal(0, init_range), the
gated norm of the linear layers 1 + normal; the decay parameters are drawn where they keep a memory of several
tokens (A_log = log U(0.05, 0.5), dt_bias ~ normal(0, 0.5)) so the recurrent state matters for the answer.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from coverpruner.testing.presets import presets_of
from coverpruner.testing.qwen_vl_common import (build_config, check_preset, image_processor, train_qwen_tokenizer,
                                                write_qwen_vl_checkpoint)

QWEN3_5_PRESETS = presets_of("qwen3_5")
THINK_TOKENS = ("<think>", "</think>")

# The chat template the Qwen3.5 checkpoints ship (the 2B / 4B / 9B / 27B ones: a generation prompt that opens a
# <think> block unless enable_thinking is false; vision placeholders as Qwen3-VL's; tools in XML form).
QWEN3_5_CHAT_TEMPLATE = r"""{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- macro render_content(content, do_vision_count, is_system_content=false) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for item in content %}
            {%- if 'image' in item or 'image_url' in item or item.type == 'image' %}
                {%- if is_system_content %}
                    {{- raise_exception('System message cannot contain images.') }}
                {%- endif %}
                {%- if do_vision_count %}
                    {%- set image_count.value = image_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}
                    {{- 'Picture ' ~ image_count.value ~ ': ' }}
                {%- endif %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif 'video' in item or item.type == 'video' %}
                {%- if is_system_content %}
                    {{- raise_exception('System message cannot contain videos.') }}
                {%- endif %}
                {%- if do_vision_count %}
                    {%- set video_count.value = video_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}
                    {{- 'Video ' ~ video_count.value ~ ': ' }}
                {%- endif %}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' }}
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- else %}
                {{- raise_exception('Unexpected item type in content.') }}
            {%- endif %}
        {%- endfor %}
    {%- elif content is none or content is undefined %}
        {{- '' }}
    {%- else %}
        {{- raise_exception('Unexpected content type.') }}
    {%- endif %}
{%- endmacro %}
{%- if not messages %}
    {{- raise_exception('No messages provided.') }}
{%- endif %}
{%- if tools and tools is iterable and tools is not mapping %}
    {{- '<|im_start|>system\n' }}
    {{- "# Tools\n\nYou have access to the following functions:\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>" }}
    {{- '\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>' }}
    {%- if messages[0].role == 'system' %}
        {%- set content = render_content(messages[0].content, false, true)|trim %}
        {%- if content %}
            {{- '\n\n' + content }}
        {%- endif %}
    {%- endif %}
    {{- '<|im_end|>\n' }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {%- set content = render_content(messages[0].content, false, true)|trim %}
        {{- '<|im_start|>system\n' + content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = render_content(message.content, false)|trim %}
        {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if ns.multi_step_tool %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- for message in messages %}
    {%- set content = render_content(message.content, true)|trim %}
    {%- if message.role == "system" %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
    {%- elif message.role == "user" %}
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
        {%- set reasoning_content = reasoning_content|trim %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content + '\n</think>\n\n' + content }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if loop.first %}
                    {%- if content|trim %}
                        {{- '\n\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
                    {%- else %}
                        {{- '<tool_call>\n<function=' + tool_call.name + '>\n' }}
                    {%- endif %}
                {%- else %}
                    {{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
                {%- endif %}
                {%- if tool_call.arguments is defined %}
                    {%- for args_name, args_value in tool_call.arguments|items %}
                        {{- '<parameter=' + args_name + '>\n' }}
                        {%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and args_value is not string) else args_value | string %}
                        {{- args_value }}
                        {{- '\n</parameter>\n' }}
                    {%- endfor %}
                {%- endif %}
                {{- '</function>\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if not loop.last and loop.nextitem.role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- elif loop.last %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role.') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- else %}
        {{- '<think>\n' }}
    {%- endif %}
{%- endif %}"""


def layer_types(layers: int) -> list[str]:
    """transformers' default Qwen3.5 pattern (full attention at layers 3, 7, ...), the last layer made the full one
    when the pattern has none (fewer than 4 layers)."""
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    return types


def _trim_vision(vision: dict, blocks: int) -> None:
    vision["depth"] = blocks


def build_qwen3_5_config(preset_name: str, tokenizer, layers: int | None = None):
    """Qwen3_5Config of a preset (no weights); token ids taken from `tokenizer`; ValueError below 1 layer."""
    from transformers import Qwen3_5Config

    p = QWEN3_5_PRESETS[preset_name]
    if layers is not None and layers < 1:
        raise ValueError(f"--layers must be >= 1, got {layers}")
    depth = p.text["num_hidden_layers"] if layers is None else layers
    tied = p.extra.get("tie_word_embeddings", False)  # the released configs say it at the top and in text_config
    p = dataclasses.replace(p, text={**p.text, "num_hidden_layers": depth, "layer_types": layer_types(depth),
                                     "tie_word_embeddings": tied})
    return build_config(Qwen3_5Config, p, tokenizer, None, _trim_vision, tie_word_embeddings=tied)


def _qwen35_init(model, std: float) -> None:
    """Qwen3.5's own parameter meanings on top of the generic random draw (see the module docstring)."""
    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet, Qwen3_5RMSNorm

    for module in model.modules():
        if isinstance(module, Qwen3_5RMSNorm):  # scale (1 + w): w around 0
            module.weight.normal_(0.0, std)
        elif isinstance(module, Qwen3_5GatedDeltaNet):
            module.A_log.copy_(torch.empty_like(module.A_log).uniform_(0.05, 0.5).log())
            module.dt_bias.normal_(0.0, 0.5)


def write_qwen3_5_checkpoint(output: str | Path, preset: str = "qwen3.5-tiny", layers: int | None = None,
                             seed: int = 0) -> Path:
    """Write a random-weight Qwen3.5 checkpoint of `preset` into `output`; returns the directory (deterministic for
    a given seed). generation_config.json: greedy, stopping on <|im_end|> and <|endoftext|>."""
    from transformers import Qwen3_5ForConditionalGeneration

    p = check_preset(QWEN3_5_PRESETS, preset)
    tok = train_qwen_tokenizer(seed=seed, added=THINK_TOKENS)
    return write_qwen_vl_checkpoint(output, p, tok, build_qwen3_5_config(preset, tok, layers),
                                    Qwen3_5ForConditionalGeneration, dict(do_sample=False), QWEN3_5_CHAT_TEMPLATE,
                                    262144, image_processor(p, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]),
                                    seed, init=_qwen35_init)
