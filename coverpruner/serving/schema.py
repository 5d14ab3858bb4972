"""Pydantic models of the OpenAI chat-completions request and response that the server speaks.

Only what a one-image, one-question VLM can honour is modelled; the request keeps unknown fields
(``extra="allow"``) so that the server can pass the pipeline's own options (``budget``, ``method``,
``tau`` and whatever later families add) through, and refuse the rest by name.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from coverpruner.runtime.options import MAX_NEW_TOKENS, MAX_SEED

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
    n: int = Field(default=1, ge=1, le=1)  # one answer per request
    logprobs: Literal[False] | None = None
    user: str | None = None


# -- responses ------------------------------------------------------------------------------------

class Usage(BaseModel):
    prompt_tokens: int  # native prompt length L (all visual tokens)
    completion_tokens: int
    total_tokens: int
    prefill_tokens: int  # sequence length the decoder saw after pruning
    prompt_tokens_details: dict | None = None  # {"cached_tokens": pruned-prefix rows reused from the prefix cache}


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: None = None


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


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    coverpruner: dict[str, Any] | None = None
