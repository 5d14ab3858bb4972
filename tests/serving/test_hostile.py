"""Issue 17 acceptance: the server under 8 concurrent good clients while hostile requests arrive answers every
good request exactly as Pipeline.generate does, every bad one with a 4xx OpenAI error JSON, never a 5xx, and
its resident memory stays under a bound.

The bound: RSS may grow at most 1 GiB over its value after warm-up. The tiny model's two pipelines take
~0.1 GiB; the biggest legitimate transient is one accepted image (<= the server's pixel limit) decoded and
converted (a few hundred MiB); the refused bombs of test_limits would each have taken 2-5.5 GiB.
Every loop is bounded (8 x 3 good requests, one pass over the bad list, 120 s per request).
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.hardening.pngs import png
from tests.serving.conftest import PROMPT, data_url, user_message
from tests.serving.http_raw import assert_openai_error, post, rss_bytes

pytestmark = pytest.mark.slow

CLIENTS, PER_CLIENT = 8, 3
RSS_BOUND = 2 ** 30


def _good(demo_png, i: int) -> tuple[dict, dict]:
    """(request body, the Pipeline.generate kwargs it means)."""
    budget = (8, 16, 32, "full")[i % 4]
    req = {"model": "tiny", "messages": user_message(data_url(demo_png), f"{PROMPT} #{i}"), "max_tokens": 4,
           "budget": budget}
    return req, dict(budget=budget, max_new_tokens=4)


def _bad(demo_png) -> list[str | bytes]:
    ok = json.dumps({"model": "tiny", "messages": user_message(data_url(demo_png)), "max_tokens": 2})[:-1]
    return [ok + f', "{k}": {v}' + "}" for k, v in (
        ("budget", "1e24"), ("budget", str(2 ** 63)), ("seed", "-1"), ("budget", "Infinity"), ("tau", '"abc"'),
        ("tau", "[1]"), ("tau", "{}"), ("tau", "NaN"), ("max_tokens", '"16"'), ("budget", "true"),
        ("ignore_eos", '"yes"'))] + [
        '{"model": "tiny", "messages": ' + "[" * 10_000 + "]" * 10_000 + "}",
        ok.replace(PROMPT, "\\ud800" + PROMPT) + "}",
        json.dumps({"model": "tiny", "messages": user_message(data_url(png(30_000, 30_000, bit_depth=1)))}),
        json.dumps({"model": "tiny", "messages": user_message(data_url(png(20_000, 1)))}),
        json.dumps({"model": "tiny", "messages": user_message(data_url(png(12_000, 12_000)))}),
        json.dumps({"model": "tiny", "messages": user_message(data_url(demo_png), "word " * 600_000)}),
        "not json at all", "[1, 2]", b"\xff\xfe\x00garbage",
    ]


def test_good_clients_unharmed_by_hostile_ones(server, reference, demo_png):
    from PIL import Image
    import io

    image = Image.open(io.BytesIO(demo_png)).convert("RGB")
    expected = {}
    for i in range(CLIENTS * PER_CLIENT):
        req, kwargs = _good(demo_png, i)
        res = reference.generate(image, f"{PROMPT} #{i}", **kwargs)
        expected[i] = (res.text, [int(k) for k in res.kept_indices])
    assert post(server, _good(demo_png, 0)[0])[0] == 200  # warm-up
    rss0, peak = rss_bytes(), [0]
    stop = threading.Event()

    def sample_rss():
        while not stop.wait(0.05):
            peak[0] = max(peak[0], rss_bytes())

    def client(c):
        out = []
        for k in range(PER_CLIENT):
            i = c * PER_CLIENT + k
            out.append((i, post(server, _good(demo_png, i)[0], timeout=120)))
        return out

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    bad = _bad(demo_png)
    with ThreadPoolExecutor(CLIENTS + 1) as ex:
        goods = [ex.submit(client, c) for c in range(CLIENTS)]
        hostile = ex.submit(lambda: [post(server, b, timeout=120) for b in bad])
        good_results = [r for f in goods for r in f.result(timeout=600)]
        bad_results = hostile.result(timeout=600)
    stop.set()
    sampler.join(timeout=5)
    for i, (status, data, _) in good_results:
        assert status == 200, (i, data)
        got = (data["choices"][0]["message"]["content"], data["coverpruner"]["kept_indices"])
        assert got == expected[i], i
    for b, (status, data, _) in zip(bad, bad_results):
        assert_openai_error(status, data, 400, 499)
    assert peak[0] - rss0 < RSS_BOUND, f"RSS grew {(peak[0] - rss0) / 2**20:.0f} MiB"
