"""Issue 25's and 35's acceptance: the default coverpruner-serve (an fp32 ORT-form dir: --max-batch 8, --prefix-cache-mb
256, its scheduler, admission beside decoding, prefix blocks) answers as a server that neither batches nor caches
(--max-batch 1 --prefix-cache-mb 0) while it reuses pruned prefixes.

Conversations of a system prompt, an image turn and two text follow-ups go through the official openai client,
each turn carrying the server's own earlier answers, one at a time on the reference and also six at once beside a
stream its client drops half-way on the default server: every answer must be equal, and the default server must
report usage.prompt_tokens_details.cached_tokens > 0 on every later turn. Requests with a stop string, with n > 1
and with a json_schema, streamed and not, answer as on the reference too; and a conversation that shares a
system prompt and image with one still decoding finds that one's prompt blocks on its first turn.
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
def plain_url(builds):
    """A server without batching or prefix cache."""
    from coverpruner.serving import ServerConfig

    config = ServerConfig(str(builds.export("tiny", "ort")), threads=1, model_name="tiny", max_batch=1,
                          prefix_cache_mb=0)
    with start_server(config) as url:
        yield url


@pytest.fixture(scope="module")
def default_url(builds):
    """The default server of an ORT-form dir."""
    from coverpruner.serving import ServerConfig, create_app

    app = create_app(ServerConfig(str(builds.export("tiny", "ort")), threads=1, model_name="tiny"))
    # the defaults these tests are about: batching on, prefix cache on
    assert app.state.server.max_batch == 8 and app.state.server.pipelines[0].prefix_cache.enabled
    with serve_app(app) as url:
        yield url


@pytest.fixture(scope="module")
def plain_answers(plain_url, demo_png):
    """The six conversations on the reference server, one at a time: their texts."""
    client = _client(plain_url)
    return [[r.choices[0].message.content for r in _turns(client, demo_png, q)] for q in FIRST]


def test_default_server_caches_prefixes_while_batching(default_url, demo_png, plain_answers):
    client = _client(default_url)

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
    _idle(default_url)
    again = _turns(client, demo_png, FIRST[3])
    assert [r.choices[0].message.content for r in again] == plain_answers[3]


def _answers(client, png: bytes, stream: bool, **kwargs) -> list:
    """[(text, finish_reason)] per choice of one request about the image, streamed or not."""
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png)}},
                                             {"type": "text", "text": FIRST[1]}]}]
    if not stream:
        r = client.chat.completions.create(model="tiny", messages=messages, **kwargs)
        return [(c.message.content, c.finish_reason) for c in r.choices]
    texts, finish = {}, {}
    for chunk in client.chat.completions.create(model="tiny", messages=messages, stream=True, **kwargs):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            finish[c.index] = c.finish_reason or finish.get(c.index)
    return [(texts[i], finish[i]) for i in sorted(texts)]


def test_stop_n_and_json_schema_answer_as_the_reference(plain_url, default_url, demo_png):
    """Stop strings, n answers and a json_schema, streamed and not, all at once on the default server: each answer as
    the reference's (n answers: greedy ones all equal the reference's one; a sampled answer 0 is the seed's own
    stream, the reference's answer with that seed)."""
    from tests.serving.test_structured_output import FORMAT

    plain, default = _client(plain_url), _client(default_url)
    extra = {"budget": 8, "ignore_eos": True}
    long = _answers(plain, demo_png, False, max_tokens=24, temperature=0, extra_body=extra)[0][0]
    stop = long[len(long) // 2:len(long) // 2 + 4]
    cases = {"stop": dict(max_tokens=200, temperature=0, stop=[stop], extra_body=extra),
             "schema": dict(max_tokens=160, temperature=1.0, seed=7, response_format=FORMAT,
                            extra_body={"budget": 8}),
             "n greedy": dict(max_tokens=12, temperature=0, n=3, extra_body=extra),
             "n sampled": dict(max_tokens=12, temperature=1.0, seed=5, n=2, extra_body=extra)}
    want = {}
    for name, kwargs in cases.items():
        single = {k: v for k, v in kwargs.items() if k != "n"}
        want[name] = _answers(plain, demo_png, False, **single)[0]
    jobs = [(name, stream) for name in cases for stream in (False, True)]
    with ThreadPoolExecutor(len(jobs)) as ex:
        got = dict(zip(jobs, ex.map(lambda job: _answers(default, demo_png, job[1], **cases[job[0]]), jobs)))
    assert want["stop"] == (long[:long.find(stop)], "stop") and want["schema"][1] == "stop"
    for (name, stream), answers in got.items():
        assert len(answers) == cases[name].get("n", 1), (name, stream)
        if name == "n sampled":
            assert answers[0] == want[name], (name, stream)
            assert answers[1] != answers[0]  # its own stream
        else:
            assert all(a == want[name] for a in answers), (name, stream, answers, want[name])


def test_a_conversation_beside_one_with_the_same_prefix_finds_its_blocks(default_url, demo_png):
    """Two conversations with the same system prompt and image: the second, asked while the first still streams its
    answer, reports cached_tokens > 0 on its first turn (the first one's prompt blocks, stored once, shared)."""
    client = _client(default_url)

    def messages(question):  # "uniform" keeps the same image rows whatever the question
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(demo_png)}},
                                             {"type": "text", "text": question}]}]

    extra = {"budget": 8, "method": "uniform", "ignore_eos": True}
    first = client.chat.completions.create(model="tiny", messages=messages("Name every object you see."),
                                           max_tokens=64, stream=True, extra_body=extra)
    chunks = iter(first)
    next(chunks)
    next(chunks)  # the first is decoding
    second = client.chat.completions.create(model="tiny", messages=messages("What is the main colour?"),
                                            max_tokens=4, extra_body=extra)
    rest = list(chunks)
    assert rest and rest[-1].choices[0].finish_reason == "length"  # the first was still decoding meanwhile
    assert second.usage.prompt_tokens_details.cached_tokens > 0
