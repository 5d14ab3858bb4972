"""Pydantic models of the OpenAI chat-completions request and response that the server speaks.

Only what the pipeline can honour is modelled; the request keeps unknown fields (``extra="allow"``) so that
the server can pass CoverPruner's own options through and refuse the rest by name. Which ones are options is
declared here, from runtime.options.GenerationOptions' fields, explicitly (never read from a Python signature:
a new keyword of a Pipeline method does not become an API field): every field is filled by an OpenAI field
(OPENAI_FIELDS), taken as an extra body field (EXTRA_FIELDS) or set by the server (SERVER_FIELDS); the family's
request options (GenerationOptions.family) are extra body fields under their own names, listed by the loaded
pipeline (Pipeline.family_options).
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from coverpruner.runtime.options import MAX_NEW_TOKENS, MAX_SEED, MAX_TOP_LOGPROBS, GenerationOptions

#: GenerationOptions fields OpenAI's own body fields fill -> that body field (named in errors about the option)
OPENAI_FIELDS = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "seed": "seed",
                 "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
                 "logit_bias": "logit_bias", "response_format": "response_format", "stop": "stop", "n": "n",
                 "logprobs": "logprobs", "top_logprobs": "top_logprobs", "tools": "tools", "tool_choice": "tool_choice",
                 "parallel_tool_calls": "parallel_tool_calls"}
#: OpenAI body fields this server takes but that change nothing here (bookkeeping for OpenAI's own platform)
NOOP_FIELDS = ("user", "metadata", "store", "service_tier")
#: OpenAI body fields this server refuses -> why (the 400 names the field and this reason); a null value or the
#: value that means "off" (REFUSED_UNLESS) is taken
REFUSED_FIELDS = {
    "functions": "the deprecated functions API is not supported; send tools and tool_choice",
    "function_call": "the deprecated functions API is not supported; send tools and tool_choice",
    "audio": "this server answers in text only",
    "modalities": "this server answers in text only",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "this server has no web search",
}
#: the value of a refused field that asks for nothing (taken silently)
REFUSED_UNLESS = {"modalities": ["text"]}
#: GenerationOptions fields a body may set as extra fields (``extra_body`` of the openai client)
EXTRA_FIELDS = ("budget", "method", "tau", "demand", "ignore_eos", "stop_token_ids", "chat_template_kwargs")
#: GenerationOptions fields the server sets itself: max_images (--max-images) and family (the family's options,
#: extra fields under their own names)
SERVER_FIELDS = ("max_images", "family")
#: a pipeline error's param (a GenerationOptions field) -> the body field it is, where their names differ
BODY_NAMES = {k: v for k, v in OPENAI_FIELDS.items() if k != v}


def extra_fields() -> dict:
    """The extra body fields that are GenerationOptions fields -> their defaults."""
    defaults = GenerationOptions()  # its fields' defaults (default_factory ones included), checked
    return {name: getattr(defaults, name) for name in EXTRA_FIELDS}

# strict: JSON types as OpenAI documents them, no coercion ("16" or true is not an int, "yes" not a bool);
# allow_inf_nan=False: Python's json module reads Infinity / NaN, which no OpenAI field means


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # parts ({"type": "text", "text"} / {"type": "image_url", "image_url": {"url"} or str}) are checked in
    # serving.request, which names the offending part in its error
    content: Union[str, list[dict[str, Any]], None] = None
    name: str | None = None
    # a tool round trip (runtime/messages.py checks them, each error naming its field): an assistant's calls and
    # thinking, and the call a tool message answers
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """POST /v1/chat/completions body. Extra fields land in ``model_extra`` (pipeline options)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None  # token id (a decimal string: a JSON key) -> bias in [-100, 100]
    # n answers forked from one prefill (bounded by the server's --max-batch: serving.app); logprobs of every
    # answer token with top_logprobs alternatives (serving.choices)
    n: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    # NOOP_FIELDS: taken, change nothing
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # constrained output and tool calls (runtime/grammar.py, runtime/tool_calls.py): checked there, each error
    # naming its field
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool | None = None
    # REFUSED_FIELDS (n, logprobs, ...) land in model_extra and are refused by name in serving.request


# -- responses ------------------------------------------------------------------------------------

class Usage(BaseModel):
    prompt_tokens: int  # native prompt length L (all visual tokens)
    completion_tokens: int
    total_tokens: int
    prefill_tokens: int  # sequence length the decoder saw after pruning
    prompt_tokens_details: dict | None = None  # {"cached_tokens": pruned-prefix rows reused from the prefix cache}


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None  # serving/tools.py: the answer's calls (content None without text)
    reasoning_content: str | None = None  # a thinking model's reasoning (serving/tools.py)


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: dict | None = None  # serving.choices.chat_logprobs


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    coverpruner: dict[str, Any]


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: dict | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    coverpruner: dict[str, Any] | None = None
