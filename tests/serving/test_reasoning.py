"""A Qwen3-VL checkpoint with the Thinking chat template (its generation prompt opens <think>): the server returns
the thinking as reasoning_content, separated from content, streamed and not, on chat and as a reasoning item on
/v1/responses; both equal to splitting the model's whole generated text at </think> (the Pipeline's own text of the
same request, split here by string operations, as Qwen's template splits an assistant turn).

Random weights never close their thinking by themselves: a logit_bias on </think> (one token of the vocabulary)
stands in for a trained model's; greedy decoding makes every answer the same.
"""

from __future__ import annotations

import json
import shutil

import openai
import pytest

from tests.serving.conftest import data_url, start_server, user_message
from tests.serving.test_tool_calls import token_id

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def thinking(builds, tmp_path_factory, demo_png):
    from coverpruner.runtime import Pipeline
    from coverpruner.serving import ServerConfig
    from coverpruner.testing.qwen3_vl_checkpoints import QWEN3_VL_THINKING_CHAT_TEMPLATE

    engine = tmp_path_factory.mktemp("thinking") / "engine"
    shutil.copytree(builds.export("qwen3-vl-tiny", "ort"), engine)
    manifest = json.loads((engine / "manifest.json").read_text())
    manifest["chat_template"] = QWEN3_VL_THINKING_CHAT_TEMPLATE
    (engine / "manifest.json").write_text(json.dumps(manifest))
    with start_server(ServerConfig(str(engine), workers=1, threads=1, model_name="tiny")) as url:
        yield (openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120),
               Pipeline.load(engine, provider="cpu", threads=1), token_id(engine, "</think>"),
               user_message(data_url(demo_png), "What is shown?"))


def test_reasoning_content_is_the_text_before_think_close(thinking):
    client, pipe, close, messages = thinking
    bias = {str(close): 3.0}
    whole = pipe.chat(messages, max_new_tokens=40, budget=8, logit_bias={close: 3.0}).text
    assert "</think>" in whole, whole  # the bias made the model close its thinking
    want_reasoning = whole.split("</think>")[0].strip("\n")
    want_content = whole.split("</think>", 1)[1].lstrip("\n")
    assert want_reasoning and want_content, whole

    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40, logit_bias=bias,
                                       extra_body={"budget": 8})
    m = r.choices[0].message
    assert (m.model_extra["reasoning_content"], m.content) == (want_reasoning, want_content)
    assert r.usage.completion_tokens == 40 or r.choices[0].finish_reason == "stop"  # max_tokens counts both

    reasoning, content = [], []
    for chunk in client.chat.completions.create(model="tiny", messages=messages, max_tokens=40, logit_bias=bias,
                                                stream=True, extra_body={"budget": 8}):
        for choice in chunk.choices:
            reasoning.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            content.append(choice.delta.content or "")
    assert ("".join(reasoning), "".join(content)) == (want_reasoning, want_content)

    resp = client.responses.create(model="tiny", input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": messages[0]["content"][0]["image_url"]["url"]},
        {"type": "input_text", "text": "What is shown?"}]}], max_output_tokens=40, extra_body={
            "logit_bias": bias, "budget": 8})
    kinds = [o.type for o in resp.output]
    assert kinds == ["reasoning", "message"], kinds
    assert resp.output[0].content[0].text == want_reasoning and resp.output_text == want_content


def test_full_budget_split_equals_transformers_generate(thinking, builds, demo_png):
    """At the full budget, reasoning_content and content are transformers' own generate (HF's processor with the
    Thinking template, HF's model, the same bias as a sequence_bias on </think>, greedy) decoded and split at
    </think> here, streamed and not."""
    import io

    import torch
    from PIL import Image

    from coverpruner.testing.qwen3_vl_checkpoints import QWEN3_VL_THINKING_CHAT_TEMPLATE
    from tests.families.qwen3_vl.hf_qwen3 import hf_model, hf_processor

    client, _, close, messages = thinking
    ckpt = builds.checkpoint("qwen3-vl-tiny")
    proc = hf_processor(ckpt)
    proc.chat_template = QWEN3_VL_THINKING_CHAT_TEMPLATE
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                                                       "text": "What is shown?"}]}],
                                    add_generation_prompt=True, tokenize=False)
    assert text.rstrip().endswith("<think>"), text  # the template opens the thinking
    inputs = proc(images=[Image.open(io.BytesIO(demo_png)).convert("RGB")], text=[text], return_tensors="pt")
    with torch.no_grad():
        out = hf_model(str(ckpt)).generate(**inputs, max_new_tokens=40, do_sample=False,
                                           sequence_bias={(close,): 3.0})
    whole = proc.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:].tolist(), skip_special_tokens=True)
    assert "</think>" in whole, whole
    want = (whole.split("</think>")[0].strip("\n"), whole.split("</think>", 1)[1].lstrip("\n"))

    kw = dict(model="tiny", messages=messages, max_tokens=40, logit_bias={str(close): 3.0},
              extra_body={"budget": "full"})
    m = client.chat.completions.create(**kw).choices[0].message
    assert (m.model_extra["reasoning_content"], m.content) == want
    reasoning, content = [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            reasoning.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            content.append(choice.delta.content or "")
    assert ("".join(reasoning), "".join(content)) == want


def test_a_later_turn_renders_the_reasoning(thinking):
    """The answer sent back with its reasoning_content is accepted (rendered by the template) and answered."""
    client, _, close, messages = thinking
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, logit_bias={str(close): 6.0},
                                       extra_body={"budget": 8})
    m = r.choices[0].message
    history = messages + [{"role": "assistant", "content": m.content,
                           "reasoning_content": m.model_extra["reasoning_content"]},
                          {"role": "user", "content": "And then?"}]
    again = client.chat.completions.create(model="tiny", messages=history, max_tokens=4, extra_body={"budget": 8})
    assert again.choices[0].finish_reason in ("stop", "length")


def test_enable_thinking_switch(thinking, tmp_path):
    """chat_template_kwargs reaches the template: a template whose generation prompt closes the thinking when
    enable_thinking is false (Qwen3's switch) starts the answer in the content; the Thinking template reads no such
    variable, so the server refuses it by name."""
    from coverpruner.errors import OptionError
    from coverpruner.runtime import Pipeline
    from coverpruner.testing.qwen3_vl_checkpoints import QWEN3_VL_THINKING_CHAT_TEMPLATE

    client, pipe, _, messages = thinking
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert info.value.body["param"] == "chat_template_kwargs.enable_thinking", info.value.body

    engine = tmp_path / "switch"
    shutil.copytree(pipe.model.manifest.root, engine)
    manifest = json.loads((engine / "manifest.json").read_text())
    prompt = "{{- '<|im_start|>assistant\\n<think>\\n' }}"
    assert prompt in QWEN3_VL_THINKING_CHAT_TEMPLATE
    manifest["chat_template"] = QWEN3_VL_THINKING_CHAT_TEMPLATE.replace(prompt, (
        "{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}"
        "{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}"))
    (engine / "manifest.json").write_text(json.dumps(manifest))
    switch = Pipeline.load(engine, provider="cpu", threads=1)
    text = [{"role": "user", "content": "Hi"}]
    assert switch.chat_request(text).reasoning is not None
    assert switch.chat_request(text, chat_template_kwargs={"enable_thinking": True}).reasoning is not None
    assert switch.chat_request(text, chat_template_kwargs={"enable_thinking": False}).reasoning is None
    with pytest.raises(OptionError, match="chat_template_kwargs.nope"):
        switch.chat_request(text, chat_template_kwargs={"nope": 1})
