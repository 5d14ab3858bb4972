"""An error after the stream started is one OpenAI error event followed by [DONE]; the server keeps serving."""

from __future__ import annotations

import json
import urllib.request

import openai

from coverpruner.serving import ServerConfig, create_app
from tests.serving.conftest import data_url, serve_app, user_message


def _failing_forward(real):
    """The decoder's forward: the prefill and one decode step run, the next call fails like a crashed session."""
    calls = []

    def forward(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("decoder session failed")
        return real(*args, **kwargs)

    return forward


def test_error_mid_stream_is_an_error_event_then_done(tiny_export, demo_png):
    app = create_app(ServerConfig(str(tiny_export), threads=1, model_name="tiny"))
    with serve_app(app) as url:
        decoder = app.state.server.pipelines[0].decoder  # the one worker's decoder (--max-batch 1 on this dir)
        real = decoder.forward
        decoder.forward = _failing_forward(real)
        body = json.dumps({"model": "tiny", "messages": user_message(data_url(demo_png)), "max_tokens": 12,
                           "budget": 16, "stream": True}).encode()
        req = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as resp:
            assert resp.status == 200
            events = [line[len("data: "):] for line in resp.read().decode().splitlines() if line.startswith("data: ")]
        decoder.forward = real
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])["error"]
        assert err["code"] == "internal_error" and "decoder session failed" in err["message"]
        chunks = [json.loads(e) for e in events[:-2]]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert sum(1 for c in chunks if c["choices"][0]["delta"].get("content")) == 2
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        assert c.chat.completions.create(model="tiny", messages=user_message(data_url(demo_png)),
                                         max_tokens=4).choices[0].message.content
