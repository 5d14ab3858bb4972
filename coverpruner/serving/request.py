"""From a validated ChatCompletionRequest to what ``Pipeline.chat_request`` takes: messages and one typed
GenerationOptions (built and validated once, here; the app then builds the runtime Request once from both).

A request is a conversation (system, user and assistant messages, any number of images up to the server's
max images, text-only turns). The image_url parts are decoded here (the server's rules for data: URLs, local
files and remote URLs, each refusal naming its field) and handed on as {"type": "image", "image": PIL image}
parts; video_url parts (only when the engine takes video: its family offers the max_video_frames option) are read to the encoded file's bytes
and handed on as {"type": "video", "video": bytes, "fps"?, "max_frames"?}; the frames are decoded by the pipeline.
Everything else about the messages is checked by Pipeline.chat_request (runtime/messages.py). Pruning and
family options come as extra body fields: the GenerationOptions fields serving.schema.EXTRA_FIELDS declares,
and the loaded family's request options (``Pipeline.family_options()``), so options that later families add
(``newline_policy``, ``image_size``, ...) pass through without changes here; any other extra field is refused by
name.
"""

from __future__ import annotations

from dataclasses import dataclass

from coverpruner.runtime.errors import CoverPrunerError, OptionError
from coverpruner.runtime.options import METHODS, GenerationOptions, parse_budget
from coverpruner.selection import METHOD_OPTIONS
from coverpruner.serving.errors import bad_request, from_pipeline_error
from coverpruner.serving.images import load_image_url
from coverpruner.serving.schema import BODY_NAMES, REFUSED_FIELDS, REFUSED_UNLESS, ChatCompletionRequest, extra_fields
from coverpruner.serving.videos import MAX_VIDEO_BYTES, load_video_url, sampling_fields

#: OpenAI roles the pipeline takes ("developer" is OpenAI's newer name for a system message)
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
DEFAULT_MAX_TOKENS = 128


def pipeline_options(pipeline=None) -> dict:
    """Extra body fields the server accepts -> their defaults: the GenerationOptions fields serving.schema declares
    (EXTRA_FIELDS), plus the loaded family's request options when a pipeline is given
    (``Pipeline.family_options()``), plus every option a selection method declares (coverpruner.selection's
    METHOD_OPTIONS: pivots, relevance_weight; the default depends on the method, and the pipeline refuses one the
    request's method does not take)."""
    options = extra_fields()
    if pipeline is not None:
        options.update(pipeline.family_options())
    options.update({name: None for name in METHOD_OPTIONS})
    return options


@dataclass
class GenerationRequest:
    """One request on its way to a worker: messages (images decoded to PIL), its GenerationOptions (stop strings,
    n, logprobs and tools included), the streaming settings, and ``request``: the runtime Request the
    app builds once from messages and options (Pipeline.chat_request), which the worker submits as it is."""

    messages: list
    options: GenerationOptions
    stream: bool = False
    include_usage: bool = False
    request: object = None  # runtime.stages.Request

    @property
    def n(self) -> int:
        return self.options.n

    @property
    def top_logprobs(self) -> int | None:
        """None (no logprobs) or the alternatives reported per token."""
        return self.options.logprob_count


def build_request(req: ChatCompletionRequest, defaults: dict, allow_local_files: bool,
                  allow_remote_images: bool, allowed: dict | None = None, validate=None,
                  remote_timeout_s: float | None = None, family: str | None = None,
                  max_video_bytes: int = MAX_VIDEO_BYTES, takes_video: bool = False, bound=None) -> GenerationRequest:
    """Check the messages and options, then decode the images and read the videos. Raises APIError(400) naming
    the field.

    defaults: the engine manifest's defaults (``budget``, ``method``) used when the body has none.
    allowed: the extra fields accepted (default ``pipeline_options()`` without a loaded pipeline).
    bound(options): the server's own settings and bounds applied to the options by name (max_images, video
    frames) before they become the one GenerationOptions of the request.
    validate(messages, options): the pipeline's own checks (options, prompt size, messages; the image parts left
    out: Pipeline.check_chat), run before any image is fetched or decoded so that a bad option costs no decoding.
    family: the engine's family (manifest ``family``), named in the refusal of a video part.
    max_video_bytes: largest encoded video (``--max-video-bytes``).
    takes_video: whether the engine takes video (the app reads it from the family's request options, so serving
    keeps no list of families); video_url parts are refused (400 video_not_supported) otherwise.
    """
    pending = _conversation(req, family, takes_video)
    named = _options(req, defaults, pipeline_options() if allowed is None else allowed)
    if bound is not None:
        bound(named)
    try:
        options = GenerationOptions.of(None, **named)
    except CoverPrunerError as exc:
        raise from_pipeline_error(exc, BODY_NAMES) from None
    if validate is not None:
        validate(_without_images(pending), options)
    timeout = {} if remote_timeout_s is None else {"timeout_s": remote_timeout_s}

    def fetch(part: dict) -> dict:
        if part["type"] == "image_url":
            return {"type": "image", "image": load_image_url(part["url"], part["param"], allow_local_files,
                                                             allow_remote_images, **timeout)}
        if part["type"] == "video_url":
            data = load_video_url(part["url"], part["param"], allow_local_files, allow_remote_images,
                                  max_video_bytes, **timeout)
            return {"type": "video", "video": data, **part["sampling"]}
        return part

    messages = [msg if not isinstance(msg.get("content"), list)
                else {**msg, "content": [fetch(p) for p in msg["content"]]} for msg in pending]
    return GenerationRequest(messages, options, req.stream, bool(req.stream_options and req.stream_options.include_usage))


def _check_text(texts, param: str) -> None:
    """Text must be encodable as UTF-8: JSON lets a lone surrogate (\\ud800) through, the tokenizer does not."""
    for text in texts:
        if text.isascii():  # O(1) in CPython: no surrogate (encoding a 40 MB text held the GIL 50 ms)
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise bad_request(f"text holds a lone UTF-16 surrogate {text[exc.start]!r} at character {exc.start}; "
                              "send valid Unicode", param, "invalid_text") from None


def _without_images(pending: list[dict]) -> list[dict]:
    """The conversation with each image part a 1 x 1 stand-in and each video part two 28 x 28 stand-in frames
    (one temporal patch of Qwen's smallest grid) with the part's fps / max_frames: what the pipeline's checks of
    the options, the messages, the number of images and the text's size need, before any image or video is
    fetched or decoded."""
    from PIL import Image

    stand_in = Image.new("RGB", (1, 1))
    frame = Image.new("RGB", (28, 28))

    def stand_in_part(part: dict) -> dict:
        if part["type"] == "image_url":
            return {"type": "image", "image": stand_in}
        if part["type"] == "video_url":
            return {"type": "video", "video": [frame, frame], **part["sampling"]}
        return part

    return [msg if not isinstance(msg.get("content"), list)
            else {**msg, "content": [stand_in_part(p) for p in msg["content"]]} for msg in pending]


def _conversation(req: ChatCompletionRequest, family: str | None = None, takes_video: bool = False) -> list[dict]:
    """The messages, every text checked, every image_url part kept as {"type": "image_url", "url", "param"} and
    every video_url part as {"type": "video_url", "url", "param", "sampling": {fps?, max_frames?}} (read by
    build_request only once the options and texts passed)."""
    out = []
    for i, msg in enumerate(req.messages):
        role = _ROLES.get(msg.role)
        if role is None:
            raise bad_request(f"messages[{i}].role {msg.role!r} is not supported; expected one of "
                              f"{sorted(_ROLES)}", f"messages[{i}].role", "unsupported_role")
        if role in ("assistant", "tool"):  # a tool round trip's turns: checked by runtime/messages.py
            out.append(_reply_turn(msg, role, i))
            continue
        content = msg.content if msg.content is not None else ""
        if isinstance(content, str):
            _check_text([content], f"messages[{i}].content")
            out.append({"role": role, "content": content})
            continue
        parts = []
        for j, part in enumerate(content):
            param = f"messages[{i}].content[{j}]"
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                _check_text([part["text"]], f"{param}.text")
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "image_url":
                parts.append(_url_part(part, "image_url", "images", param, role, msg.role))
            elif kind == "video_url":
                parts.append(_video_part(part, param, role, msg.role, family, takes_video))
            elif kind == "text":
                raise bad_request("text part needs a string field 'text'", f"{param}.text")
            else:
                raise bad_request(f"content part type {kind!r} is not supported; expected 'text', 'image_url' or "
                                  "'video_url'", f"{param}.type")
        out.append({"role": role, "content": parts})
    return out


def _reply_turn(msg, role: str, i: int) -> dict:
    """An assistant or tool message -> its turn for runtime/messages.py (content, tool_calls, tool_call_id, name,
    reasoning_content as sent; a null content stays absent: templates tell it from ""); its content is text only."""
    turn = {"role": role, **{k: v for k, v in (("content", msg.content), ("tool_calls", msg.tool_calls),
                                               ("tool_call_id", msg.tool_call_id), ("name", msg.name),
                                               ("reasoning_content", msg.reasoning_content)) if v is not None}}
    content = turn.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            kind = part.get("type")
            if kind in ("image_url", "video_url"):  # refused as in any turn that is not the user's
                _url_part(part, kind, "images" if kind == "image_url" else "videos", f"messages[{i}].content[{j}]",
                          role, msg.role)
            if kind != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"{role} messages hold text parts only", f"messages[{i}].content[{j}]")
            _check_text([part["text"]], f"messages[{i}].content[{j}].text")
        turn["content"] = [{"type": "text", "text": p["text"]} for p in content]
    elif content is not None:
        _check_text([content], f"messages[{i}].content")
    if msg.reasoning_content is not None:
        _check_text([msg.reasoning_content], f"messages[{i}].reasoning_content")
    return turn


def _video_part(part: dict, param: str, role: str, sent_role: str, family: str | None, takes_video: bool) -> dict:
    """A video_url part -> {"type": "video_url", "url", "param", "sampling"}; 400 naming ``param`` when the model
    takes no video, the URL is missing or fps / max_frames are malformed."""
    if not takes_video:
        raise bad_request(f"this model ({family or 'unknown'} family) does not take video; video_url parts need an "
                          "engine whose family takes video (docs/video.md)", param, "video_not_supported")
    return {**_url_part(part, "video_url", "videos", param, role, sent_role), "sampling": sampling_fields(part, param)}


def _url_part(part: dict, kind: str, noun: str, param: str, role: str, sent_role: str) -> dict:
    """An image_url / video_url part -> {"type": kind, "url", "param"}; 400 (code invalid_<kind>) naming
    ``param`` when <kind>.url is not a string (the URL string form is taken too) or the message is not a user's."""
    url = part.get(kind)
    url = url.get("url") if isinstance(url, dict) else url
    if not isinstance(url, str):
        raise bad_request(f"{kind} part needs {kind}.url (a string)", f"{param}.{kind}.url", f"invalid_{kind}")
    if role != "user":
        raise bad_request(f"{noun} belong in user messages, not {sent_role!r} ones", param, f"invalid_{kind}")
    return {"type": kind, "url": url, "param": f"{param}.{kind}.url"}


def _options(req: ChatCompletionRequest, defaults: dict, allowed: dict) -> dict:
    extra = dict(req.model_extra or {})
    for name in sorted(set(extra) & set(REFUSED_FIELDS)):
        value = extra.pop(name)
        if value is not None and value != REFUSED_UNLESS.get(name, None):
            raise bad_request(f"{name} is not supported: {REFUSED_FIELDS[name]}", name)
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
    if req.response_format is not None:
        opts["response_format"] = req.response_format
    for name in ("frequency_penalty", "presence_penalty", "logit_bias", "stop", "n", "logprobs", "top_logprobs",
                 "tools", "tool_choice", "parallel_tool_calls"):
        if getattr(req, name) is not None:
            opts[name] = getattr(req, name)
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
