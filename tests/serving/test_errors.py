"""Bad requests get a 4xx with OpenAI's error body naming the field, and the server keeps serving."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from tests.serving.conftest import PROMPT, data_url, user_message


def _msg(*parts):
    return [{"role": "user", "content": list(parts)}]


def _img(url):
    return {"type": "image_url", "image_url": {"url": url}}


TEXT = {"type": "text", "text": PROMPT}
LONG_PROMPT = " ".join(["word"] * 2000)  # the tiny model's context is 1024 positions

CASES = {
    # name: (request kwargs (demo PNG data URL substituted for "PNG"), status, param, code)
    "bad base64": (dict(messages=_msg(_img("data:image/png;base64,@@not-base64@@"), TEXT)), 400,
                   "messages[0].content[0].image_url.url", "invalid_base64"),
    "not an image": (dict(messages=_msg(_img(data_url(b"plain text, not pixels")), TEXT)), 400,
                     "messages[0].content[0].image_url.url", "invalid_image"),
    # issue 19: text-only requests, several images and system turns are answered; above max images (8 by default)
    "nine images": (dict(messages=_msg(*[_img("PNG")] * 9, TEXT)), 400, "messages", "too_many_images"),
    "image in an assistant turn": (dict(messages=_msg(TEXT) + [{"role": "assistant", "content": [_img("PNG")]}]
                                        + _msg(TEXT)), 400, "messages[1].content[0]", "invalid_image_url"),
    "last turn not the user's": (dict(messages=_msg(TEXT) + [{"role": "assistant", "content": "yes"}]), 400,
                                 "messages", "invalid_prompt"),
    "budget 0": (dict(messages=_msg(_img("PNG"), TEXT), extra_body={"budget": 0}), 400, "budget", "invalid_value"),
    "budget not a number": (dict(messages=_msg(_img("PNG"), TEXT), extra_body={"budget": "lots"}), 400, "budget",
                            "invalid_value"),
    "unknown method": (dict(messages=_msg(_img("PNG"), TEXT), extra_body={"method": "magic"}), 400, "method",
                       "invalid_value"),
    "relevance_weight out of range": (dict(messages=_msg(_img("PNG"), TEXT),
                                           extra_body={"method": "cdpruner", "relevance_weight": 1.5}), 400,
                                      "relevance_weight", "invalid_value"),
    "option of another method": (dict(messages=_msg(_img("PNG"), TEXT),
                                      extra_body={"method": "dart", "relevance_weight": 0.5}), 400,
                                 "relevance_weight", "invalid_value"),
    "unknown extra field": (dict(messages=_msg(_img("PNG"), TEXT), extra_body={"budgett": 8}), 400, "budgett",
                            "unknown_field"),
    "prompt too long": (dict(messages=_msg(_img("PNG"), {"type": "text", "text": LONG_PROMPT})), 400, "messages",
                        "context_length_exceeded"),
    "unknown model": (dict(messages=_msg(_img("PNG"), TEXT), model="gpt-4o"), 404, "model", "model_not_found"),
    "remote URL refused": (dict(messages=_msg(_img("https://example.com/cat.png"), TEXT)), 400,
                           "messages[0].content[0].image_url.url", "remote_images_disabled"),
    "local path refused": (dict(messages=_msg(_img("/etc/hostname"), TEXT)), 400,
                           "messages[0].content[0].image_url.url", "local_files_disabled"),
    "file URL refused": (dict(messages=_msg(_img("file:///etc/hostname"), TEXT)), 400,
                         "messages[0].content[0].image_url.url", "local_files_disabled"),
    "negative temperature": (dict(messages=_msg(_img("PNG"), TEXT), temperature=-1), 400, "temperature",
                             "invalid_value"),
    # issue 36: tool results are taken in a round trip; one that answers no call of an assistant turn is refused
    "tool turn": (dict(messages=[{"role": "tool", "content": "42"}] + _msg(_img("PNG"), TEXT)),
                  400, "messages[0].tool_call_id", "invalid_prompt"),
    "n=2": (dict(messages=_msg(_img("PNG"), TEXT), n=2), 400, "n", "invalid_value"),
    # issue 29: stop strings are bounded in count and length (the matcher's tables and per-token work)
    "17 stop strings": (dict(messages=_msg(_img("PNG"), TEXT), stop=[f"s{i}" for i in range(17)]), 400, "stop",
                        "invalid_value"),
    "a 1,025-character stop string": (dict(messages=_msg(_img("PNG"), TEXT), stop=["ok", "x" * 1025]), 400, "stop",
                                      "invalid_value"),
}


def _fill(obj, url):
    if isinstance(obj, dict):
        return {k: _fill(v, url) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, url) for v in obj]
    return url if obj == "PNG" else obj


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("stream", [False, True])
def test_bad_request_then_good_request(client, demo_png, name, stream):
    kwargs, status, param, code = CASES[name]
    kwargs = {"model": "tiny", "max_tokens": 4, **_fill(kwargs, data_url(demo_png))}
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(stream=stream, **kwargs)
    err = info.value
    assert err.status_code == status
    assert set(err.body) == {"message", "type", "param", "code"}
    assert (err.body["param"], err.body["code"]) == (param, code), err.body["message"]
    assert "\n" not in err.body["message"]
    ok = client.chat.completions.create(model="tiny", messages=user_message(data_url(demo_png)), max_tokens=4)
    assert ok.choices[0].message.content


def test_invalid_json_and_unknown_route(server):
    req = urllib.request.Request(f"{server}/v1/chat/completions", data=b"{not json",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req)
    assert info.value.code == 400 and json.loads(info.value.read())["error"]["code"] == "invalid_json"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{server}/v1/nothing-here")
    assert info.value.code == 404 and "error" in json.loads(info.value.read())


def test_local_files_when_allowed(tiny_export, reference, demo_png, tmp_path):
    from importlib.resources import files

    import openai as oa

    from coverpruner.serving import ServerConfig
    from tests.serving.conftest import start_server

    path = str(files("coverpruner") / "assets" / "demo.png")
    want = reference.generate(path, PROMPT, budget=16, max_new_tokens=6).text
    with start_server(ServerConfig(str(tiny_export), threads=1, model_name="tiny", allow_local_files=True)) as url:
        c = oa.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for ref in (path, f"file://{path}"):
            r = c.chat.completions.create(model="tiny", messages=user_message(ref), max_tokens=6,
                                          extra_body={"budget": 16})
            assert r.choices[0].message.content == want
        with pytest.raises(oa.BadRequestError) as info:
            c.chat.completions.create(model="tiny", messages=user_message(str(tmp_path / "missing.png")),
                                      max_tokens=6)
        assert info.value.body["code"] == "image_not_found"
