"""The server's answers equal Pipeline.generate for the same image, prompt and options."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from tests.serving.conftest import PROMPT, data_url, user_message


def _stream_text(client, **kwargs):
    pieces, chunks = [], list(client.chat.completions.create(stream=True, **kwargs))
    for ch in chunks:
        if ch.choices and ch.choices[0].delta.content:
            pieces.append(ch.choices[0].delta.content)
    return "".join(pieces), chunks


@pytest.mark.parametrize("options", [
    {"budget": 16},
    {"budget": 8, "method": "divprune"},
    {"budget": "full"},
    {"budget": 24, "tau": 0.7},
    {"budget": 12, "method": "dart"},  # the peers' pruners (issue 26) and their own options
    {"budget": 12, "method": "dart", "pivots": 3},
    {"budget": 12, "method": "cdpruner", "relevance_weight": 0.5},
])
def test_non_streaming_equals_generate(client, reference, demo_png, options):
    want = reference.generate(Image.open(io.BytesIO(demo_png)), PROMPT, max_new_tokens=12, **options)
    r = client.chat.completions.create(model="tiny", messages=user_message(data_url(demo_png)), max_tokens=12,
                                       extra_body=options)
    assert r.choices[0].message.content == want.text
    assert r.choices[0].finish_reason == {"eos": "stop", "length": "length"}[want.finish_reason]
    assert r.usage.prompt_tokens == want.prompt_tokens
    assert r.usage.completion_tokens == len(want.token_ids)
    assert r.usage.model_extra["prefill_tokens"] == want.prefill_tokens
    cp = r.model_extra["coverpruner"]
    assert cp["kept_indices"] == want.kept_indices.tolist()
    assert cp["n"] == want.num_visual_tokens
    assert set(cp["timings_ms"]) == set(want.timings)


def test_streaming_equals_generate(client, reference, demo_png):
    want = reference.generate(Image.open(io.BytesIO(demo_png)), PROMPT, budget=16, max_new_tokens=20)
    text, chunks = _stream_text(client, model="tiny", messages=user_message(data_url(demo_png)),
                                max_completion_tokens=20, extra_body={"budget": 16},
                                stream_options={"include_usage": True})
    assert text == want.text
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].model_extra["coverpruner"]["kept_indices"] == want.kept_indices.tolist()
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.token_ids)
    assert len({c.id for c in chunks}) == 1


def test_sampling_options_pass_through(client, reference, demo_png):
    opts = dict(temperature=0.9, top_p=0.8, seed=7)
    want = reference.generate(Image.open(io.BytesIO(demo_png)), PROMPT, budget=16, max_new_tokens=16, **opts)
    r = client.chat.completions.create(model="tiny", messages=user_message(data_url(demo_png)), max_tokens=16,
                                       extra_body={"budget": 16}, **opts)
    assert r.choices[0].message.content == want.text


@pytest.mark.parametrize("fmt,mime", [("JPEG", "image/jpeg"), ("WEBP", "image/webp")])
def test_jpeg_and_webp_images(client, reference, demo_png, fmt, mime):
    buf = io.BytesIO()
    Image.open(io.BytesIO(demo_png)).convert("RGB").save(buf, fmt)
    want = reference.generate(Image.open(io.BytesIO(buf.getvalue())), PROMPT, budget=16, max_new_tokens=8)
    r = client.chat.completions.create(model="tiny", messages=user_message(data_url(buf.getvalue(), mime)),
                                       max_tokens=8, extra_body={"budget": 16})
    assert r.choices[0].message.content == want.text


def test_stop_string_cuts_the_answer(client, reference, demo_png):
    want = reference.generate(Image.open(io.BytesIO(demo_png)), PROMPT, budget=16, max_new_tokens=12).text
    stop = want[len(want) // 2: len(want) // 2 + 3]  # a string from the middle of the answer
    cut = want[:want.find(stop)]
    r = client.chat.completions.create(model="tiny", messages=user_message(data_url(demo_png)), max_tokens=12,
                                       extra_body={"budget": 16}, stop=[stop])
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
    text, _ = _stream_text(client, model="tiny", messages=user_message(data_url(demo_png)), max_tokens=12,
                           extra_body={"budget": 16}, stop=stop)
    assert text == cut


def test_stop_string_ends_decoding_where_it_matches(client, reference, demo_png, server):
    """Issue 35: a stop string completed by token 10 of a max_tokens 200 request ends decoding there: usage counts
    the tokens up to that one, the answer stops before the string (streamed too: no part of it leaks), and the
    request's slot is free when the answer arrives."""
    import json
    import urllib.request

    from tests.stops import stop_at

    want = reference.generate(Image.open(io.BytesIO(demo_png)), PROMPT, budget=16, max_new_tokens=14, ignore_eos=True)
    stop, cut = stop_at(reference.encoder.decode, want.token_ids, 10)
    kwargs = dict(model="tiny", messages=user_message(data_url(demo_png)), max_tokens=200,
                  extra_body={"budget": 16, "ignore_eos": True}, stop=[stop])
    r = client.chat.completions.create(**kwargs)
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (cut, "stop")
    assert r.usage.completion_tokens == 10
    assert json.loads(urllib.request.urlopen(f"{server}/health").read())["running"] == 0
    text, chunks = _stream_text(client, **kwargs)
    assert text == cut and chunks[-1].choices[0].finish_reason == "stop"


def test_models_health_metrics(client, server):
    import urllib.request

    assert [m.id for m in client.models.list().data] == ["tiny"]
    health = urllib.request.urlopen(f"{server}/health").read().decode()
    assert '"status":"ok"' in health
    metrics = urllib.request.urlopen(f"{server}/metrics").read().decode()
    for name in ("coverpruner_requests_total", "coverpruner_stage_seconds_bucket", "coverpruner_kept_token_ratio",
                 "coverpruner_queue_depth", "coverpruner_errors_total"):
        assert name in metrics
    assert 'coverpruner_stage_seconds_count{stage="prefill"}' in metrics


def test_server_default_budget_and_method(tiny_export, reference, demo_png):
    """--budget / --method set the defaults for requests without those fields (harnesses that cannot send them)."""
    import openai

    from coverpruner.serving import ServerConfig
    from tests.serving.conftest import start_server

    want = reference.generate(Image.open(io.BytesIO(demo_png)), PROMPT, budget=12, method="divprune",
                              max_new_tokens=8)
    with start_server(ServerConfig(str(tiny_export), threads=1, model_name="tiny", budget=12,
                                   method="divprune")) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        r = c.chat.completions.create(model="tiny", messages=user_message(data_url(demo_png)), max_tokens=8)
    assert r.choices[0].message.content == want.text
    assert r.model_extra["coverpruner"]["kept_indices"] == want.kept_indices.tolist()
