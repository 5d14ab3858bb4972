"""Concurrent clients get the sequential answers; a full queue answers 503 at once; a client that goes
away stops its generation and frees the worker."""

from __future__ import annotations

import http.client
import io
import json
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from PIL import Image

from tests.serving.conftest import PROMPT, data_url, start_server, user_message

# requests differ in budget, method and length so that mixed-up answers between workers would show
OPTIONS = [dict(budget=b, method=m, max_tokens=t) for b, m, t in
           [(8, "coverpruner", 6), (16, "divprune", 9), (32, "coverpruner", 12), ("full", "coverpruner", 7),
            (12, "uniform", 10)]]


def _ask(client, url, opts):
    extra = {k: v for k, v in opts.items() if k != "max_tokens"}
    return client.chat.completions.create(model="tiny", messages=user_message(url), max_tokens=opts["max_tokens"],
                                          extra_body=extra).choices[0].message.content


@pytest.mark.slow
def test_eight_clients_ten_requests_each_match_sequential(client, reference, demo_png):
    image = Image.open(io.BytesIO(demo_png))
    want = [reference.generate(image, PROMPT, max_new_tokens=o["max_tokens"],
                               **{k: v for k, v in o.items() if k != "max_tokens"}).text for o in OPTIONS]
    url = data_url(demo_png)

    def one_client(c):
        return [(i, _ask(client, url, OPTIONS[i])) for i in ((c + j) % len(OPTIONS) for j in range(10))]

    with ThreadPoolExecutor(8) as ex:
        answers = [a for batch in ex.map(one_client, range(8)) for a in batch]
    assert len(answers) == 80
    assert all(text == want[i] for i, text in answers)


def _metric(url, name):
    for line in urllib.request.urlopen(f"{url}/metrics").read().decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.slow
def test_full_queue_503_and_disconnect_stops_generation(tiny_export, demo_png):
    from coverpruner.serving import ServerConfig

    with start_server(ServerConfig(str(tiny_export), workers=1, threads=1, max_queue=0, model_name="tiny")) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        msgs = user_message(data_url(demo_png))
        # a long generation (ignore_eos: up to the end of the 1024-position context) occupies the one worker
        long = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=100000, stream=True,
                                         extra_body={"budget": 8, "ignore_eos": True})
        next(iter(long))
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as info:
            c.chat.completions.create(model="tiny", messages=msgs, max_tokens=4)
        assert info.value.status_code == 503 and info.value.body["code"] == "queue_full"
        assert time.monotonic() - t0 < 2.0  # refused at once, not after the long request
        health = json.loads(urllib.request.urlopen(f"{url}/health").read())
        assert health["running"] == 1
        long.close()  # the client goes away mid-stream
        deadline = time.monotonic() + 20
        while json.loads(urllib.request.urlopen(f"{url}/health").read())["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        # the worker stopped early: counted as cancelled, not as a finished (ok) generation
        assert _metric(url, 'coverpruner_requests_total{outcome="cancelled"}') == 1
        assert _metric(url, 'coverpruner_requests_total{outcome="ok"}') == 0
        assert _metric(url, 'coverpruner_requests_total{outcome="rejected"}') == 1
        assert c.chat.completions.create(model="tiny", messages=msgs, max_tokens=4).choices[0].message.content

        # a non-streaming client that gives up: the server notices the closed connection and stops too
        body = json.dumps({"model": "tiny", "messages": msgs, "max_tokens": 100000, "budget": 8,
                           "ignore_eos": True}).encode()
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=30)
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        deadline = time.monotonic() + 20
        while not json.loads(urllib.request.urlopen(f"{url}/health").read())["running"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        while json.loads(urllib.request.urlopen(f"{url}/health").read())["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _metric(url, 'coverpruner_requests_total{outcome="cancelled"}') == 2
        assert _metric(url, 'coverpruner_requests_total{outcome="ok"}') == 1
