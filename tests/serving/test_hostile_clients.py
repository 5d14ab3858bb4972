"""Issue 40: no client can fail its neighbours or stall the server. The issue's findings (tests/serving/
hostile_cases.py, tag "finding"; the whole catalogue runs in benchmarks/bench_hostile.py) against one batched server
on loopback, each: its 4xx with OpenAI's error body in under 1 s (or a correct answer: a temperature below the greedy
floor answers as greedy), /health under 100 ms while it runs, RSS back within 200 MB of its level before, and the
next normal request answered. Then requests that fail inside a batched step (a grammar cut by its mask budget, a
planted sampling failure) beside a long greedy neighbour: the neighbour's answer is unchanged and its time within
2x of its time alone. Then /v1/completions lists: admitted whole or not at all.

Time bounds on a shared machine: as tests/serving/test_event_loop.py, the machine's load is read before each case
(``stretch``: wall / CPU time of a 50 ms spin) and each bound is that many times the issue's; a case over its bound
is measured once more before it fails (the other xdist worker may take the core during one attempt).

KEEP when the engine loop is rewritten (issue 35): test_failures_in_a_batch_fail_only_their_request pins the
per-request isolation of the step on today's loop; the new loop must pass it unchanged.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.serving.conftest import serve_app
from tests.serving.hostile_cases import (ERROR_S, HEALTH_S, RSS_MB, Case, answer_texts, cases, chat, outcome,
                                         parse)
from tests.serving.http_raw import get, post, rss_bytes
from tests.serving.test_event_loop import stretch

pytest.importorskip("llguidance", reason="the grammar findings need llguidance (serve extra)")
pytestmark = pytest.mark.slow

MAX_BATCH, MAX_QUEUE = 4, 2
CAPACITY = MAX_BATCH + MAX_QUEUE  # one worker
NEIGHBOUR = {"model": "tiny", "max_tokens": 800, "ignore_eos": True, "temperature": 0,
             "messages": [{"role": "user", "content": "Tell me a long story about the sea."}]}
NORMAL = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]}
#: the findings' cases, the large-answer one scaled to this server's batch (n <= --max-batch)
FINDINGS = [c for c in cases("llava") if ("finding" in c.tags or "ci" in c.tags) and ", streamed" not in c.name
            and not c.name.startswith("top_logprobs")] + [
    Case("top_logprobs 20, n 4, 1,000 tokens", lambda: json.dumps(chat(
        n=MAX_BATCH, max_tokens=1000, ignore_eos=True, logprobs=True, top_logprobs=20)).encode(), expect="ok")]


@pytest.fixture(scope="module")
def ort_export(builds):
    return builds.export("tiny", "ort")


@pytest.fixture(scope="module")
def url(ort_export):
    from coverpruner.serving import ServerConfig, create_app

    app = create_app(ServerConfig(str(ort_export), workers=1, threads=1, model_name="tiny", max_batch=MAX_BATCH,
                                  max_queue=MAX_QUEUE, batch_context=2048))
    with serve_app(app) as base:
        assert post(base, NORMAL)[0] == 200  # warm-up
        yield base


def _measured(url: str, case: Case, body: bytes) -> tuple[int, object, float, float]:
    """Send the case while polling /health every 20 ms -> (status, answer, seconds, slowest /health)."""
    out = {}
    # parsed after the polling: a 10 MB answer parsed in this process would hold the GIL the server's loop needs
    worker = threading.Thread(target=lambda: out.update(r=post(url, body, timeout=120, path=case.path, parse=False)))
    worker.start()
    slowest, polls = 0.0, 0
    while worker.is_alive() or polls < 3:
        t = time.monotonic()
        assert get(url, "/health", timeout=30)[0] == 200
        slowest, polls = max(slowest, time.monotonic() - t), polls + 1
        time.sleep(0.02)
    worker.join()
    status, raw, seconds = out["r"]
    return status, parse(raw), seconds, slowest


@pytest.mark.parametrize("case", FINDINGS, ids=[c.name for c in FINDINGS])
def test_each_finding_is_refused_fast_or_answered(url, case):
    body = case.body()  # built before RSS is read: its own bytes are not the server's
    greedy = None
    if case.greedy:
        status, data, _ = post(url, {**json.loads(body), "temperature": 0}, path=case.path)
        greedy = answer_texts(data)
    for attempt in range(2):
        load = stretch()
        rss0 = rss_bytes()
        status, data, seconds, slowest = _measured(url, case, body)
        checks = outcome(case, status, data, seconds, time_scale=load)
        checks["health_under_100ms"] = slowest < HEALTH_S * load
        if all(checks.values()) or attempt:
            break
    assert all(checks.values()), (case.name, status, checks, seconds, slowest, load, str(data)[:300])
    if case.greedy:
        assert answer_texts(data) == greedy, (case.name, data)
    time.sleep(0.5)
    assert rss_bytes() - rss0 < RSS_MB * 2 ** 20, f"{case.name}: RSS +{(rss_bytes() - rss0) / 2 ** 20:.0f} MiB"
    assert post(url, NORMAL)[0] == 200  # the next normal request


def _neighbour_running(url: str) -> tuple[threading.Thread, dict]:
    """Send the long neighbour from a thread and return once the server runs it -> (thread, {"n": its answer})."""
    got = {}
    t = threading.Thread(target=lambda: got.update(n=post(url, NEIGHBOUR, timeout=120)))
    t.start()
    deadline = time.monotonic() + 10
    while json.loads(get(url, "/health")[1])["running"] < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    return t, got


def _beside(url: str, body: dict) -> tuple[tuple, tuple]:
    """The neighbour, then ``body`` in the same batch while it decodes -> (neighbour's answer, body's answer)."""
    t, got = _neighbour_running(url)
    hostile = post(url, body, timeout=120)
    t.join()
    return got["n"], hostile


def test_failures_in_a_batch_fail_only_their_request(url, monkeypatch):
    """Requests that fail inside the batched step, each beside a long greedy neighbour: one whose grammar gives up
    mid-answer (planted: the error its mask budget raises, after 5 tokens; the budget itself is tested in
    tests/runtime/test_grammar_limits.py), one whose sampling fails (NaN planted in its logits: SamplingError,
    its own 500), and one with temperature 1e-310 (once a 500 for its whole batch, now greedy). The neighbour's
    answer is the one it gives alone, within 2x of its time alone; the failing one gets its own error."""
    from coverpruner.runtime import grammar, sampling
    from coverpruner.runtime.errors import OptionError

    alone = [post(url, NEIGHBOUR, timeout=120) for _ in range(2)]
    want, alone_s = answer_texts(alone[0][1]), min(a[2] for a in alone)
    real_sample, real_advance = sampling.Sampler.__call__, grammar.GrammarMatcher.advance

    def sample(self, logits, allowed=None):  # the request sampled at temperature 1.2345 gets NaN logits
        if self.config.temperature == 1.2345:
            logits = logits.copy()
            logits[3] = float("nan")
        return real_sample(self, logits, allowed)

    def advance(self, token):  # the grammar with the planted marker gives up at its 6th token
        real_advance(self, token)
        self.taken = getattr(self, "taken", 0) + 1
        if "planted-budget" in self.grammar.text and self.taken > 5:
            raise OptionError("response_format: planted budget", param="response_format",
                                      code=grammar.TOO_COMPLEX)

    monkeypatch.setattr(sampling.Sampler, "__call__", sample)
    monkeypatch.setattr(grammar.GrammarMatcher, "advance", advance)
    planted = {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {"planted-budget": {"type": "string"}}}}}
    hostile = {
        "grammar gives up mid-answer": (chat(max_tokens=60, response_format=planted), 400, "grammar_too_complex"),
        "NaN logits": (chat(max_tokens=50, temperature=1.2345), 500, "sampling_failed"),
        "temperature 1e-310": (chat(max_tokens=50, temperature=1e-310, n=2), 200, None),
    }
    for name, (body, status, code) in hostile.items():
        for attempt in range(2):
            load = stretch()
            (n_status, n_data, n_seconds), (h_status, h_data, _) = _beside(url, body)
            assert n_status == 200 and answer_texts(n_data) == want, (name, n_data)
            assert h_status == status, (name, h_data)
            if code is not None:
                assert h_data["error"]["code"] == code and "\n" not in h_data["error"]["message"], h_data
            if n_seconds <= 2 * alone_s * load or attempt:
                break
        assert n_seconds <= 2 * alone_s * load, (name, n_seconds, alone_s, load)
    greedy = answer_texts(post(url, chat(max_tokens=50, temperature=0))[1])
    assert answer_texts(h_data) == greedy * 2  # temperature 1e-310, n 2: both answers greedy


def test_a_costly_grammar_beside_a_neighbour_leaves_it_unchanged(url):
    """A json_schema const of 10 KB (each mask ~2-4 ms of CPU, several times a tiny model's step) beside the long
    greedy neighbour: answered or cut by its mask budget (400 grammar_too_complex), and the neighbour's answer is the
    one it gives alone, within 2x of its time alone (the budget grants a grammar MASK_STEP_FACTOR of each step's
    CPU time: a mask competing for a busy machine's cores no longer widens its own allowance)."""
    alone = [post(url, NEIGHBOUR, timeout=120) for _ in range(2)]
    want, alone_s = answer_texts(alone[0][1]), min(a[2] for a in alone)
    for attempt in range(2):
        const = "ab c" * 2500 + "x" * (attempt + 1)  # a schema not compiled before: its admission is measured too
        body = chat(max_tokens=64, response_format={"type": "json_schema", "json_schema": {
            "name": "c", "schema": {"const": const}}})
        load = stretch()
        (n_status, n_data, n_seconds), (h_status, h_data, _) = _beside(url, body)
        assert n_status == 200 and answer_texts(n_data) == want, n_data
        assert h_status == 200 or (h_status, h_data["error"]["code"]) == (400, "grammar_too_complex"), h_data
        if n_seconds <= 2 * alone_s * load:
            break
    assert n_seconds <= 2 * alone_s * load, (n_seconds, alone_s, load)


def test_prompt_lists_are_admitted_whole_or_not_at_all(url):
    """A list longer than the server admits at once: 400 naming prompt at once; one that fits only when nothing
    else runs: 503 with nothing of it admitted while a request runs, then answered whole; the server normal
    right after."""
    def prompts(k: int) -> dict:
        return {"model": "tiny", "max_tokens": 2, "prompt": [f"word {i}" for i in range(k)]}

    status, data, seconds = post(url, prompts(CAPACITY + 1), path="/v1/completions")
    assert status == 400 and data["error"]["param"] == "prompt" and f"at most {CAPACITY}" in data["error"]["message"]
    assert seconds < ERROR_S * stretch()
    t, _ = _neighbour_running(url)
    status, data, _ = post(url, prompts(CAPACITY), path="/v1/completions")
    health = json.loads(get(url, "/health")[1])
    assert status == 503 and data["error"]["code"] == "queue_full", data
    assert health["running"] + health["queued"] <= 1, health  # none of the list was admitted
    t.join()
    status, data, _ = post(url, prompts(CAPACITY), path="/v1/completions")
    assert status == 200 and [c["index"] for c in data["choices"]] == list(range(CAPACITY)), data
    assert post(url, NORMAL)[0] == 200


def test_structured_output_is_ready_before_the_first_request(ort_export):
    """llguidance's import, the tokenizer's bridge and the mask threads are built when the server starts: the first
    schema request of a quiet bench run held /health 0.26 s while they were built for it."""
    from coverpruner.runtime import grammar
    from coverpruner.serving import ServerConfig, create_app

    app = create_app(ServerConfig(str(ort_export), workers=1, threads=1, model_name="tiny"))
    try:
        assert app.state.server.pipelines[0].grammars._bridge is not None  # a new Pipeline's: built by the server
        assert grammar._pool is not None and grammar._executor is not None
    finally:
        app.state.server.pool.shutdown()


def test_responses_input_is_counted_then_translated_off_the_event_loop(url, monkeypatch):
    """/v1/responses input over MAX_PARTS items: refused by its count before any item is translated, and the
    translation runs in a worker thread (100,000 items were translated and validated on the event loop)."""
    import asyncio

    from coverpruner.runtime.messages import MAX_PARTS
    from coverpruner.serving import responses

    where, real = [], responses.response_body

    def spy(body):
        try:
            asyncio.get_running_loop()
            where.append("event loop")
        except RuntimeError:
            where.append("worker thread")
        return real(body)

    monkeypatch.setattr(responses, "response_body", spy)
    base = {"model": "tiny", "max_output_tokens": 2}
    status, data, _ = post(url, {**base, "input": [{"role": "user", "content": "hi"}] * (MAX_PARTS + 1)},
                           path="/v1/responses")
    assert status == 400 and (data["error"]["param"], data["error"]["code"]) == ("input", "too_many_parts"), data
    assert f"at most {MAX_PARTS:,}" in data["error"]["message"]
    status, data, _ = post(url, {**base, "input": [{"role": "user", "content": "hi"}] * 3}, path="/v1/responses")
    assert status == 200, data
    assert where == ["worker thread"] * 2
