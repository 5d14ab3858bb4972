"""From a validated ChatCompletionRequest to what ``Pipeline.stream`` takes: image, prompt, options.

The pipeline answers one user turn about one image, so a request must hold exactly one user message
whose content has one ``image_url`` part and text parts (joined with newlines, in order). Pruning and
family options come as extra body fields; which ones exist is read from ``Pipeline.stream``'s
signature, so options that later families add (``newline_policy``, ``image_size``, ...) pass through
without changes here, and any other extra field is refused by name.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from coverpruner.runtime import METHODS, Pipeline
from coverpruner.runtime.errors import OptionError
from coverpruner.runtime.pipeline import parse_budget
from coverpruner.serving.errors import bad_request
from coverpruner.serving.images import load_image_url
from coverpruner.serving.schema import ChatCompletionRequest

#: Pipeline.stream arguments the OpenAI fields fill (not accepted as extra body fields).
_MAPPED = {"self", "image", "prompt", "max_new_tokens", "temperature", "top_p", "seed"}
DEFAULT_MAX_TOKENS = 128


def pipeline_options(pipeline=None) -> dict:
    """Extra body fields the server accepts -> their defaults: keyword arguments of both Pipeline.generate and
    .stream that no OpenAI field maps to, plus the loaded family's request options when the pipeline lists
    them (``Pipeline.family_options()``, taken through ``**options``)."""
    params = [inspect.signature(f).parameters for f in (Pipeline.generate, Pipeline.stream)]
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    options = {name: p.default for name, p in params[1].items()
               if name not in _MAPPED and p.kind in kinds and name in params[0]}
    family_options = getattr(pipeline, "family_options", None)
    if callable(family_options):
        options.update(family_options())
    return options


@dataclass
class GenerationRequest:
    """One request ready for a worker: image (PIL), prompt text, Pipeline.stream keyword options."""

    image: object
    prompt: str
    options: dict
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    image_param: str = "messages[0].content"  # field path of the image URL, for errors about the image


def build_request(req: ChatCompletionRequest, defaults: dict, allow_local_files: bool,
                  allow_remote_images: bool, allowed: dict | None = None, validate=None,
                  remote_timeout_s: float | None = None) -> GenerationRequest:
    """Check the messages and options, then decode the image. Raises APIError(400) naming the field.

    defaults: the engine manifest's defaults (``budget``, ``method``) used when the body has none.
    allowed: the extra fields accepted (default ``pipeline_options()`` without a loaded pipeline).
    validate(prompt, options): the pipeline's own checks (options, prompt size), run before the image is
    fetched or decoded so that a bad option costs no decoding.
    """
    prompt, image_url, image_param = _one_turn(req)
    options = _options(req, defaults, pipeline_options() if allowed is None else allowed)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(not s for s in stop):
        raise bad_request("stop strings must not be empty", "stop")
    _check_text(stop, "stop")
    if validate is not None:
        validate(prompt, options)
    image = load_image_url(image_url, image_param, allow_local_files, allow_remote_images,
                           **({} if remote_timeout_s is None else {"timeout_s": remote_timeout_s}))
    return GenerationRequest(image, prompt, options, stop, req.stream,
                             bool(req.stream_options and req.stream_options.include_usage), image_param)


def _check_text(texts, param: str) -> None:
    """Text must be encodable as UTF-8: JSON lets a lone surrogate (\\ud800) through, the tokenizer does not."""
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise bad_request(f"text holds a lone UTF-16 surrogate {text[exc.start]!r} at character {exc.start}; "
                              "send valid Unicode", param, "invalid_text") from None


def _one_turn(req: ChatCompletionRequest) -> tuple[str, str, str]:
    """-> (prompt text, image URL, the image URL's field path)."""
    if len(req.messages) != 1 or req.messages[0].role != "user":
        roles = [m.role for m in req.messages]
        raise bad_request(f"the model answers one user message about one image; got roles {roles}", "messages",
                          "unsupported_conversation")
    content = req.messages[0].content
    if isinstance(content, str) or not content:
        raise bad_request("the user message has no image; add an image_url content part", "messages[0].content",
                          "missing_image")
    texts, images = [], []
    for i, part in enumerate(content):
        param = f"messages[0].content[{i}]"
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str):
                raise bad_request("image_url part needs image_url.url (a string)", f"{param}.image_url.url",
                                  "invalid_image_url")
            images.append((f"{param}.image_url.url", url))
        elif kind == "text":
            raise bad_request("text part needs a string field 'text'", f"{param}.text")
        else:
            raise bad_request(f"content part type {kind!r} is not supported; expected 'text' or 'image_url'",
                              f"{param}.type")
    if not images:
        raise bad_request("the user message has no image; add an image_url content part", "messages[0].content",
                          "missing_image")
    if len(images) > 1:
        raise bad_request(f"the user message has {len(images)} images; this server answers about exactly one",
                          images[1][0], "too_many_images")
    _check_text(texts, "messages[0].content")
    prompt = "\n".join(t for t in texts if t.strip())
    if not prompt:
        raise bad_request("the user message has no text; add a text content part with the question",
                          "messages[0].content", "missing_text")
    return prompt, images[0][1], images[0][0]


def _options(req: ChatCompletionRequest, defaults: dict, allowed: dict) -> dict:
    extra = dict(req.model_extra or {})
    unknown = sorted(set(extra) - set(allowed))
    if unknown:
        raise bad_request(f"unknown field {unknown[0]!r}; besides OpenAI's fields this server takes "
                          f"{sorted(allowed)}", unknown[0], "unknown_field")
    opts = dict(extra)
    if req.max_tokens is not None and req.max_completion_tokens is not None \
            and req.max_tokens != req.max_completion_tokens:
        raise bad_request("max_tokens and max_completion_tokens disagree; send one", "max_completion_tokens")
    opts["max_new_tokens"] = req.max_completion_tokens or req.max_tokens or DEFAULT_MAX_TOKENS
    if req.temperature is not None:
        opts["temperature"] = req.temperature
    if req.top_p is not None:
        opts["top_p"] = req.top_p
    if req.seed is not None:
        opts["seed"] = req.seed
    if "budget" in allowed:
        try:
            opts["budget"] = parse_budget(opts.get("budget", defaults.get("budget", allowed["budget"])))
        except OptionError as exc:
            raise bad_request(str(exc), "budget") from None
        if opts["budget"] is None:
            opts["budget"] = "full"
    if "method" in allowed:
        opts["method"] = opts.get("method") or defaults.get("method", allowed["method"])
        if opts["method"] not in METHODS:
            raise bad_request(f"unknown method {opts['method']!r}; expected one of {list(METHODS)}", "method")
    return opts


def option_param(message: str, options: dict) -> str | None:
    """The body field an OptionError message is about (the first option name it mentions)."""
    names = {"max_new_tokens": "max_tokens"}
    for name in sorted(options, key=len, reverse=True):
        if name in message:
            return names.get(name, name)
    return None
