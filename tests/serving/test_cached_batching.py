"""Issue 25's acceptance: the default coverpruner-serve (an fp32 ORT-form dir: --max-batch 8, --prefix-cache-mb
256) reuses pruned prefixes while it batches.

Conversations of a system prompt, an image turn and two text follow-ups go through the official openai client,
each turn carrying the server's own earlier answers. The reference is a server that neither batches nor caches
(--max-batch 1 --prefix-cache-mb 0), asked the same conversations one at a time: every answer must be equal, and
the default server must report usage.prompt_tokens_details.cached_tokens > 0 on every later turn, also with six
conversations at once beside a stream its client drops half-way, after which it answers normally.
"""

from __future__ import annotations

import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.serving.conftest import data_url, serve_app, start_server

pytestmark = pytest.mark.slow

SYSTEM = "You are a careful assistant that describes pictures."
FIRST = ("What is in this picture?", "Describe the colors.", "Count the objects.", "Where was this taken?",
         "Is it day or night?", "What stands out?")
FOLLOW_UPS = ("Tell me more.", "And in one word?")
TOKENS = 8


def _turns(client, png: bytes, first: str) -> list:
    """One conversation, turn by turn, each turn with the answers so far -> the three responses."""
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png)}},
                                             {"type": "text", "text": first}]}]
    out = []
    for follow_up in (*FOLLOW_UPS, None):
        r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=TOKENS, temperature=0,
                                           extra_body={"budget": 8})
        out.append(r)
        if follow_up is not None:
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": follow_up}]
    return out


def _client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _idle(url):
    deadline = time.monotonic() + 20
    while b'"running":0' not in urllib.request.urlopen(f"{url}/health").read().replace(b" ", b""):
        assert time.monotonic() < deadline, "the server still runs a request its client dropped"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def plain_answers(builds, demo_png):
    """The six conversations on a server without batching or prefix cache, one at a time: their texts."""
    from coverpruner.serving import ServerConfig

    config = ServerConfig(str(builds.export("tiny", "ort")), threads=1, model_name="tiny", max_batch=1,
                          prefix_cache_mb=0)
    with start_server(config) as url:
        client = _client(url)
        return [[r.choices[0].message.content for r in _turns(client, demo_png, q)] for q in FIRST]


def test_default_server_caches_prefixes_while_batching(builds, demo_png, plain_answers):
    from coverpruner.serving import ServerConfig, create_app

    app = create_app(ServerConfig(str(builds.export("tiny", "ort")), threads=1, model_name="tiny"))
    # the defaults this test is about: batching on, prefix cache on
    assert app.state.server.max_batch == 8 and app.state.server.pipelines[0].prefix_cache.enabled
    with serve_app(app) as url:
        client = _client(url)

        # one conversation alone
        alone = _turns(client, demo_png, FIRST[0])
        assert [r.choices[0].message.content for r in alone] == plain_answers[0]
        assert [r.usage.prompt_tokens_details.cached_tokens > 0 for r in alone[1:]] == [True, True]

        # six at once (a fresh cache would not matter: turns 2 and 3 reuse their own turn's prefix) and a stream
        # whose client goes away half-way
        def dropped():
            stream = client.chat.completions.create(
                model="tiny", stream=True, max_tokens=4 * TOKENS, extra_body={"budget": 8, "ignore_eos": True},
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(demo_png)}},
                                                       {"type": "text", "text": "Go on and on."}]}])
            for k, _ in enumerate(stream):
                if k == 2 * TOKENS:
                    break
            stream.close()

        with ThreadPoolExecutor(7) as ex:
            drop = ex.submit(dropped)
            runs = list(ex.map(lambda q: _turns(client, demo_png, q), FIRST))
            drop.result()
        for got, want in zip(runs, plain_answers):
            assert [r.choices[0].message.content for r in got] == want
            assert all(r.usage.prompt_tokens_details.cached_tokens > 0 for r in got[1:])

        # and afterwards it answers as before
        _idle(url)
        again = _turns(client, demo_png, FIRST[3])
        assert [r.choices[0].message.content for r in again] == plain_answers[3]
