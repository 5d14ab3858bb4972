"""OpenAI-format chat messages -> the family layout's messages and the images in order.

What Pipeline.chat takes (docs/conversations.md): a list of {"role": "system" | "user" | "assistant" | "tool",
"content": str | [part, ...]} (an assistant's tool_calls and a tool's tool_call_id: normalize) with parts
{"type": "text", "text": str}, {"type": "image_url", "image_url":
{"url": data: URL | local path | file:// URL}} (or the URL string itself), {"type": "image", "image": path |
PIL image | uint8 array} and {"type": "video", "video": [frames] | local video file path | bytes of a video file,
"fps": float (optional), "max_frames": int (optional)} (coverpruner.video.VideoInput; the family samples it).
What the families' chat templates take: every content a list of {"type": "text"} / {"type": "image"} /
{"type": "video"} parts (an assistant's or a tool's empty content stays "" and a null one is left out: templates
tell them apart). transformers normalises the same way before rendering (a string is one text part, an image_url
part an image part); llava-hf's template renders nothing for a bare string.

Every problem is one PromptError / ImageError line naming ``messages[i]`` or ``messages[i].content[j]``.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from dataclasses import dataclass, field

from coverpruner.runtime.errors import ImageError, PromptError
from coverpruner.video import VideoInput

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Conversation:
    """messages: [{"role", "content": [{"type": "text", "text"} | {"type": "image"} | {"type": "video"}]}] (the
    layout's form); images: the visual inputs in message order, then part order: image objects (path, PIL image
    or uint8 array) and coverpruner.video.VideoInput for videos."""

    messages: list
    images: list
    #: the request's OpenAI function tools and further chat-template variables (chat_template_kwargs), both
    #: rendered by the chat template (families' chat features)
    tools: tuple = ()
    template_kwargs: dict = field(default_factory=dict)


def one_turn(image, prompt: str) -> list[dict]:
    """The messages of ``generate(image, prompt)``: one user message, the image then the prompt."""
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": prompt}]}]


def _data_url_image(url: str, where: str):
    from PIL import Image, UnidentifiedImageError

    header, _, payload = url.partition(",")
    if ";base64" not in header:
        raise ImageError(f"{where}: data URL must be base64-encoded (data:image/png;base64,...)", param=where)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{where}: data URL payload is not valid base64", param=where) from None
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageError(f"{where}: cannot decode the image ({type(exc).__name__}: {exc})", param=where) from None
    return img


def _image(part: dict, where: str):
    """The image object of an image / image_url part (a data: URL decoded, a local path passed on)."""
    if part["type"] == "image":
        if "image" not in part:
            raise PromptError(f"{where}: image part needs the field 'image' (path, PIL image or uint8 array)",
                              param=where)
        return part["image"]
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    if not isinstance(url, str) or not url:
        raise PromptError(f"{where}: image_url part needs image_url.url (a string)", param=where)
    if url.startswith("data:"):
        return _data_url_image(url, where)
    if url.startswith(("http://", "https://")):
        raise ImageError(f"{where}: remote image URLs are not fetched here; pass a local path or a data: URL",
                         param=where)
    return url.removeprefix("file://")


def _video(part: dict, where: str) -> VideoInput:
    """The VideoInput of a video part; PromptError (one line) for a missing video or a bad fps / max_frames."""
    video = part.get("video")
    if isinstance(video, (list, tuple)):
        if not video:
            raise PromptError(f"{where}: video part's frame list is empty", param=where)
    elif isinstance(video, str):
        if video.startswith(("http://", "https://")):
            raise ImageError(f"{where}: remote video URLs are not fetched here; pass a local path or the frames",
                             param=where)
        video = video.removeprefix("file://")
    elif not isinstance(video, (bytes, bytearray)):
        raise PromptError(f"{where}: video part needs the field 'video' (a list of frames, a video file path or "
                          "the file's bytes)", param=where)
    fps, max_frames = part.get("fps"), part.get("max_frames")
    if fps is not None and (not isinstance(fps, (int, float)) or isinstance(fps, bool) or not fps > 0):
        raise PromptError(f"{where}: fps must be a number > 0, got {fps!r}", param=where)
    if max_frames is not None and (not isinstance(max_frames, int) or isinstance(max_frames, bool)
                                   or max_frames < 2):
        raise PromptError(f"{where}: max_frames must be an integer >= 2, got {max_frames!r}", param=where)
    return VideoInput(video, None if fps is None else float(fps), max_frames, where)

#: Most messages + content parts one request may hold (a string content counts as one part). A limit of its own,
#: not the context's: adjacent text parts may merge into fewer tokens than parts, so the count cannot be bounded
#: by the context before tokenizing, and 100,000 one-letter parts held a worker for seconds before it.
MAX_PARTS = 4096


def check_part_count(messages) -> None:
    """PromptError too_many_parts when ``messages`` (a list) hold more than MAX_PARTS content parts: checked before
    any per-part work (tokenizing and positions grow with the part count; the server checks it before validating
    the body's fields)."""
    parts = sum(len(m["content"]) if isinstance(m, dict) and isinstance(m.get("content"), (list, tuple)) else 1
                for m in messages)
    if parts > MAX_PARTS:
        raise PromptError(f"messages hold {parts} content parts (a string content counts as one); at most {MAX_PARTS} per request",
                          code="too_many_parts", param="messages")


def normalize(messages, max_images: int | None = None) -> Conversation:
    """OpenAI messages -> Conversation. PromptError (one line) for a malformed message or more than
    ``max_images`` images; the images themselves are read later, by the family.

    A tool round trip is taken as OpenAI sends it: an assistant message with ``tool_calls`` ([{"id", "type":
    "function", "function": {"name", "arguments": a JSON text}}], ``content`` text or null) and optionally
    ``reasoning_content``; then one ``tool`` message per answered call ({"role": "tool", "content", "tool_call_id"},
    which must name a call of that assistant message). The layout gets each call's arguments as the JSON value they
    hold (what chat templates render with tojson, as vLLM hands them over), an assistant's null content as no
    content, and an empty one as ""."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise PromptError("messages must be a non-empty list of {'role', 'content'} objects")
    check_part_count(messages)
    out, images = [], []
    calls: set | None = None  # the call ids the latest assistant turn made (what tool messages may answer)
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            raise PromptError(f"messages[{i}] must be an object with 'role' and 'content'", param=f"messages[{i}]")
        role = msg["role"]
        if role not in ROLES:
            raise PromptError(f"messages[{i}].role must be one of {list(ROLES)}, got {role!r}",
                              param=f"messages[{i}].role")
        if role == "assistant":
            turn = _assistant(msg, i)
            calls = {c["id"] for c in turn.get("tool_calls", [])}
        elif role == "tool":
            turn = _tool_result(msg, i, calls)
        else:
            if "content" not in msg:
                raise PromptError(f"messages[{i}] must be an object with 'role' and 'content'",
                                  param=f"messages[{i}]")
            turn = {"role": role, "content": _parts(msg["content"], i, role, images)}
            calls = None
        out.append(turn)
    if out[-1]["role"] not in ("user", "tool"):
        raise PromptError(f"messages[{len(out) - 1}]: the last message must be the user's or a tool result (got "
                          f"{out[-1]['role']!r})")
    if not any(p["type"] != "text" or p["text"].strip() for m in out if m["role"] == "user" for p in m["content"]):
        raise PromptError("the user messages hold no text and no image")
    if max_images is not None and len(images) > max_images:
        what = "images" if not any(isinstance(v, VideoInput) for v in images) else "images and videos"
        raise PromptError(f"the messages hold {len(images)} {what}; at most {max_images} per request "
                          "(max_images)", code="too_many_images")
    return Conversation(out, images)


def _parts(content, i: int, role: str, images: list) -> list[dict]:
    """A message's content (a string or parts) -> its parts ({"type": "text" | "image" | "video"}); the images and
    videos are appended to ``images``."""
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not isinstance(content, (list, tuple)):
        raise PromptError(f"messages[{i}].content must be a string or a list of parts", param=f"messages[{i}].content")
    parts = []
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        if isinstance(part, str):  # a common slip: the text without its part object
            raise PromptError(f"{where}: a content list holds parts, not bare strings; write "
                              f"{{\"type\": \"text\", \"text\": {part[:40]!r}}}", param=where)
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise PromptError(f"{where}: text part needs a string field 'text'", param=where)
            parts.append({"type": "text", "text": part["text"]})
        elif kind in ("image", "image_url"):
            if role != "user":
                raise PromptError(f"{where}: images belong in user messages, not {role!r}", param=where)
            images.append(_image(part, where))
            parts.append({"type": "image"})
        elif kind == "video":
            if role != "user":
                raise PromptError(f"{where}: videos belong in user messages, not {role!r}", param=where)
            images.append(_video(part, where))
            parts.append({"type": "video"})
        else:
            raise PromptError(f"{where}: part type {kind!r} is not supported; expected 'text', 'image_url', "
                              "'image' or 'video'", param=where)
    return parts


def _text_content(content, i: int, role: str):
    """An assistant's or a tool's content -> what its template gets: None (no content), "" (kept a string: a
    template tells empty content from none by its truth), else text parts."""
    if content is None or content == "":
        return content
    return _parts(content, i, role, [])


def _assistant(msg: dict, i: int) -> dict:
    """An assistant turn: its content, its tool_calls (arguments parsed) and its reasoning_content."""
    turn = {"role": "assistant"}
    content = _text_content(msg.get("content"), i, "assistant")
    if content is not None:
        turn["content"] = content
    calls = msg.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, (list, tuple)):
            raise PromptError(f"messages[{i}].tool_calls must be a list of calls", param=f"messages[{i}].tool_calls")
        turn["tool_calls"] = [_call(call, f"messages[{i}].tool_calls[{k}]") for k, call in enumerate(calls)]
        if len({c["id"] for c in turn["tool_calls"]}) < len(turn["tool_calls"]):
            raise PromptError(f"messages[{i}].tool_calls: two calls share an id", param=f"messages[{i}].tool_calls")
    if content is None and not calls:
        raise PromptError(f"messages[{i}]: an assistant message needs content or tool_calls", param=f"messages[{i}]")
    reasoning = msg.get("reasoning_content")
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise PromptError(f"messages[{i}].reasoning_content must be a string",
                              param=f"messages[{i}].reasoning_content")
        turn["reasoning_content"] = reasoning
    return turn


def _call(call, where: str) -> dict:
    """One tool call of an assistant turn -> {"id", "type": "function", "function": {"name", "arguments": the JSON
    value}}; PromptError naming the field otherwise."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or call.get("type", "function") != "function" or not isinstance(fn, dict):
        raise PromptError(f"{where} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}",
                          param=where)
    if not isinstance(call.get("id"), str) or not call["id"]:
        raise PromptError(f"{where}.id must be a non-empty string", param=f"{where}.id")
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise PromptError(f"{where}.function.name must be a non-empty string", param=f"{where}.function.name")
    arguments = fn.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            raise PromptError(f"{where}.function.arguments is not JSON: {exc}",
                              param=f"{where}.function.arguments") from None
    return {"id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": arguments}}


def _tool_result(msg: dict, i: int, calls: set | None) -> dict:
    """A tool turn: it must answer a call of the latest assistant turn (the turns between are tool results)."""
    call_id = msg.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise PromptError(f"messages[{i}].tool_call_id must name the call this tool message answers",
                          param=f"messages[{i}].tool_call_id")
    if calls is None or call_id not in calls:
        made = "made no calls" if not calls else f"made the calls {sorted(calls)}"
        raise PromptError(f"messages[{i}].tool_call_id {call_id!r} answers no call of the assistant turn before it "
                          f"(which {made}); a tool message follows the assistant message whose call it answers",
                          param=f"messages[{i}].tool_call_id")
    content = _text_content(msg.get("content"), i, "tool")
    turn = {"role": "tool", "content": "" if content is None else content, "tool_call_id": call_id}
    if isinstance(msg.get("name"), str):
        turn["name"] = msg["name"]
    return turn
