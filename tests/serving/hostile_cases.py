"""The hostile-client catalogue of issue 40 (and what hardening 1 and 2 already held), as data: each case one request
a hostile client sends and what a server that handles it answers. benchmarks/bench_hostile.py runs every case
against a server process (the issue's measurement: 4xx with OpenAI's body in under 1 s or a correct answer, /health
under 100 ms throughout, RSS back within 200 MB, the next normal request answered, a neighbour in the same batch
unaffected); tests/serving/test_hostile_clients.py runs the issue's findings in CI.

Reconstructed from the issue's findings and the existing hostile tests (the probe's own 169 + 47 case list was not
kept): ``cases("llava")`` and ``cases("qwen3_vl")`` give each family's list. Bodies are built on demand (several are
40 MB).
"""

from __future__ import annotations

import base64
import dataclasses
import json
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Callable

CHAT = "/v1/chat/completions"
PROMPT = "Tell me about the sea."


@dataclass(frozen=True)
class Case:
    """One hostile request. expect: "4xx" (an OpenAI error body, status 400-499), "ok" (200), "any" (either is a
    handled answer: what hardening 2 already held, where the refusal or the answer both are correct); param: the
    error's param when it must name one; greedy: a 200 whose answer must equal the same body at temperature 0;
    neighbour: run beside a long greedy request in the same batch, whose answer must not change. tags: "finding"
    (one of the issue's findings: in CI, tests/serving/test_hostile_clients.py, with a streamed twin), "ci" (in CI
    too: a case the benchmark once missed), "big" (a body of tens of MB: no streamed twin)."""

    name: str
    make: Callable[[], bytes]
    path: str = CHAT
    expect: str = "4xx"
    param: str | None = None
    greedy: bool = False
    neighbour: bool = False
    families: tuple = ("llava", "qwen3_vl")
    tags: tuple = field(default_factory=tuple)

    def body(self) -> bytes:
        return self.make()


def chat(**fields) -> dict:
    return {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": PROMPT}], **fields}


def _json(obj) -> Callable[[], bytes]:
    return lambda: json.dumps(obj() if callable(obj) else obj).encode()


def _raw(**raw) -> Callable[[], bytes]:
    """A chat body with extra fields written as raw JSON text (NaN, Infinity, 1e24, quoted strings)."""
    def make() -> bytes:
        base = json.dumps(chat())[:-1]
        return (base + "".join(f', "{k}": {v}' for k, v in raw.items()) + "}").encode()
    return make


def demo_png() -> bytes:
    return (files("coverpruner") / "assets" / "demo.png").read_bytes()


def image_chat(text: str = "What is shown?", **fields) -> dict:
    url = "data:image/png;base64," + base64.b64encode(demo_png()).decode()
    return chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                       {"type": "text", "text": text}]}], **fields)


def schema_format(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}


def tool(name: str, parameters) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def wide_schema(properties: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 5} for i in range(properties)}}


#: ~36 MB of JSON schema (the issue's size): 900,000 optional string properties
BIG_PROPERTIES = 900_000
#: a regex of ~100 KB of nested quantifiers (llguidance: "too many expressions constructed" mid-generation)
NESTED_PATTERN = "(a|b|ab){0,9}" * 7700


def _temperatures() -> list[Case]:
    out = [Case(f"temperature {t!r}", _json(chat(temperature=t, max_tokens=12)), expect="ok", greedy=True,
                neighbour=t == 1e-310, tags=("finding",))
           for t in (1e-310, 5e-324, 1e-300, 1e-30, 9.99e-6)]
    out += [Case(f"temperature {t!r} seed 1", _json(chat(temperature=t, seed=1)), expect="ok")
            for t in (1e-5, 1e-3, 0.5, 2.0)]
    out += [Case("temperature 1e-310 n 2", _json(chat(temperature=1e-310, n=2, max_tokens=12)), expect="ok",
                 greedy=True, tags=("finding",)),
            Case("top_p 1e-300 temperature 1", _json(chat(temperature=1.0, top_p=1e-300, seed=3)), expect="ok"),
            Case("temperature -1", _json(chat(temperature=-1)), param="temperature"),
            Case("temperature 2.5", _json(chat(temperature=2.5)), param="temperature"),
            Case("temperature string", _raw(temperature='"0.5"'), param="temperature"),
            Case("temperature NaN", _raw(temperature="NaN"), param="temperature"),
            Case("temperature Infinity", _raw(temperature="Infinity"), param="temperature")]
    # the issue's "NaN/Infinity everywhere else" (held): each numeric field
    out += [Case(f"{k} {v}", _raw(**{k: v}), param=k.split(" ")[0]) for k, v in (
        ("top_p", "NaN"), ("frequency_penalty", "Infinity"), ("presence_penalty", "-Infinity"), ("tau", "NaN"),
        ("budget", "Infinity"), ("max_tokens", "NaN"), ("seed", "Infinity"))]
    return out


def _integers() -> list[Case]:
    keys = ["²", "①", "١٢", "１２", "1_0", "-1", "1e3", "7.0", "", " ", "1" * 30, "9" * 5000, "99999999"]
    out = [Case(f"logit_bias key {k[:12]!r}", _json(chat(logit_bias={k: 1})), param="logit_bias",
                tags=("finding",) if k in ("²", "①") else ()) for k in keys]
    budgets = ["²", "①", "١٢", "1" * 5000, "0", "-5", "1e3", "16.0"]
    out += [Case(f"budget {b[:12]!r}", _json(image_chat(budget=b)), param="budget",
                 tags=("finding",) if b == "²" else ()) for b in budgets]
    out += [Case("budget ' 16 '", _json(image_chat(budget=" 16 ")), expect="ok"),
            Case("budget 'full'", _json(image_chat(budget="full")), expect="ok"),
            Case("seed string", _raw(seed='"1"'), param="seed"),
            Case("max_tokens string", _raw(max_tokens='"16"'), param="max_tokens")]
    return out


def _schemas() -> list[Case]:
    cycles = {
        "$ref a->b->a": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        "$ref #": {"$ref": "#"},
        "anyOf [self]": {"anyOf": [{"$ref": "#"}]},
        "allOf [self]": {"allOf": [{"$ref": "#"}]},
        "oneOf [self]": {"oneOf": [{"$ref": "#"}]},
        "$defs x -> x": {"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"},
        "required self": {"type": "object", "required": ["a"], "properties": {"a": {"$ref": "#"}}},
        "minItems self": {"type": "array", "minItems": 1, "items": {"$ref": "#"}},
    }
    out = [Case(f"schema {k}", _json(chat(response_format=schema_format(v))), param="response_format",
                tags=("finding",) if k in ("$ref a->b->a", "$ref #") else ()) for k, v in cycles.items()]
    deep = '{"type": "array", "items": ' * 10_000 + '{"type": "string"}' + "}" * 10_000  # as text: too deep for json
    out += [
        Case("schema depth 10,000", lambda: (json.dumps(chat())[:-1] + ', "response_format": {"type": "json_schema", '
                                             '"json_schema": {"name": "x", "schema": ' + deep + "}}}").encode()),
        Case("schema enum 200,000", _json(lambda: chat(response_format=schema_format(
            {"enum": [f"v{i}" for i in range(200_000)]})))),
        Case("schema 36 MB (900,000 properties)", _json(lambda: chat(response_format=schema_format(
            wide_schema(BIG_PROPERTIES)))), param="response_format", tags=("finding", "big")),
        Case("schema const 36 MB string", _json(lambda: chat(response_format=schema_format(
            {"const": "x" * 36_000_000}))), param="response_format", tags=("big",)),
        Case("schema 4,097 values", _json(chat(response_format=schema_format(
            {"enum": [f"v{i}" for i in range(4097)]}))), param="response_format"),
        Case("schema 2,000 optional properties", _json(chat(response_format=schema_format(wide_schema(2000)))),
             param="response_format"),
        Case("schema const 10 KB", _json(chat(max_tokens=64, response_format=schema_format(
            {"const": "ab c" * 2500}))), expect="any", neighbour=True, tags=("finding",)),
        Case("schema const 100 KB", _json(chat(max_tokens=64, response_format=schema_format(
            {"const": "ab c" * 25_000}))), param="response_format", neighbour=True, tags=("finding",)),
        Case("schema const 10 KB streamed", _json(chat(max_tokens=64, stream=True, response_format=schema_format(
            {"const": "ab c" * 2500}))), expect="any"),
        Case("schema pattern 100 KB nested quantifiers", _json(chat(max_tokens=64, response_format=schema_format(
            {"type": "string", "pattern": NESTED_PATTERN}))), expect="any", neighbour=True, tags=("finding",)),
        Case("schema pattern 13 KB nested quantifiers", _json(chat(max_tokens=64, response_format=schema_format(
            {"type": "string", "pattern": "(a|b|ab){0,9}" * 1000}))), expect="any", neighbour=True),
        Case("schema pattern (a+)+$", _json(chat(max_tokens=16, response_format=schema_format(
            {"type": "string", "pattern": "^(a+)+$"}))), expect="any"),
        Case("schema pattern (a|aa)*b", _json(chat(max_tokens=16, response_format=schema_format(
            {"type": "string", "pattern": "^(a|aa)*b$"}))), expect="any"),
        Case("schema unknown keywords", _json(chat(max_tokens=16, response_format=schema_format(
            {"type": "object", "frobnicate": True, "x-vendor": {"a": 1}, "properties": {}})))
             , expect="any"),
        Case("schema NaN", lambda: (json.dumps(chat())[:-1] + ', "response_format": {"type": "json_schema", '
                                    '"json_schema": {"name": "x", "schema": {"minimum": NaN}}}}').encode()),
        Case("response_format json_object", _json(chat(max_tokens=24, response_format={"type": "json_object"})),
             expect="ok"),
        Case("response_format type bogus", _json(chat(response_format={"type": "xml"})), param="response_format"),
    ]
    return out


def _tools() -> list[Case]:
    small = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
             "required": ["x"], "additionalProperties": False}
    named = {"type": "function", "function": {"name": "t0"}}
    return [
        Case("50,000 tools", _json(lambda: chat(tools=[tool(f"t{i}", {"type": "object"}) for i in range(50_000)],
                                                tool_choice="required")), param="tools", tags=("finding",)),
        Case("129 tools", _json(chat(tools=[tool(f"t{i}", small) for i in range(129)], tool_choice=named)),
             param="tools"),
        Case("128 tools, one named", _json(chat(max_tokens=24, tools=[tool(f"t{i}", small) for i in range(128)],
                                                tool_choice=named)), expect="ok"),
        Case("one tool with a 30 MB parameters schema", _json(lambda: chat(
            tools=[tool("t0", wide_schema(750_000))], tool_choice="required")), param="tools",
            tags=("finding", "big")),
        Case("tool parameters a $ref cycle", _json(chat(tools=[tool("t0", {"$ref": "#"})], tool_choice=named)),
             param="tools[0].function.parameters"),
        Case("unreachable tool over the size limit, another named", _json(chat(
            max_tokens=24, tools=[tool("t0", small), tool("big", wide_schema(2000))], tool_choice=named)),
            expect="ok"),
        Case("tool_choice auto", _json(chat(tools=[tool("t0", small)], tool_choice="auto")), param="tool_choice"),
        Case("tool_choice names an unknown tool", _json(chat(tools=[tool("t0", small)], tool_choice={
            "type": "function", "function": {"name": "nope"}})), param="tool_choice.function.name"),
        Case("tool_choice required over 3 tools", _json(chat(max_tokens=48, tools=[
            tool(f"t{i}", small) for i in range(3)], tool_choice="required")), expect="ok"),
        Case("tool const 100 KB", _json(chat(tools=[tool("t0", {"const": "ab c" * 25_000})], tool_choice=named)),
             param="tools[0].function.parameters"),
    ]


def _logit_bias() -> list[Case]:
    return [
        Case("logit_bias 1,000,000 entries", _json(lambda: chat(logit_bias={str(i): 1 for i in range(10 ** 6)})),
             param="logit_bias", tags=("finding",)),
        Case("logit_bias 1,025 entries", _json(chat(logit_bias={str(i): 1 for i in range(1025)})),
             param="logit_bias"),
        Case("logit_bias 1,024 entries", _json(chat(logit_bias={str(i): -1 for i in range(1024)})), expect="ok"),
        Case("logit_bias value 101", _json(chat(logit_bias={"7": 101})), param="logit_bias"),
        Case("logit_bias value NaN", _raw(logit_bias='{"7": NaN}'), param="logit_bias.7"),
        Case("logit_bias id past the vocabulary", _json(chat(logit_bias={"1000000": 5})), param="logit_bias"),
    ]


def _logprobs() -> list[Case]:
    big = dict(max_tokens=2000, ignore_eos=True, logprobs=True, top_logprobs=20)
    return [
        Case("n 9 (over --max-batch)", _json(chat(n=9)), param="n"),
        Case("n 0", _json(chat(n=0)), param="n"),
        Case("top_logprobs 21", _json(chat(logprobs=True, top_logprobs=21)), param="top_logprobs"),
        Case("top_logprobs without logprobs", _json(chat(top_logprobs=2)), param="top_logprobs"),
        Case("top_logprobs 20, n 8, 2,000 tokens", _json(chat(n=8, **big)), expect="ok", neighbour=True,
             families=("llava",), tags=("finding",)),
        Case("logprobs n 2", _json(chat(n=2, logprobs=True, top_logprobs=3)), expect="ok"),
    ]


def _completions() -> list[Case]:
    base = {"model": "tiny", "max_tokens": 2}
    return [
        Case("completions 100,000 prompts", _json(lambda: {**base, "prompt": ["hi"] * 100_000}), "/v1/completions",
             param="prompt", tags=("finding",)),
        Case("completions 257 prompts", _json({**base, "prompt": ["hi"] * 257}), "/v1/completions", param="prompt"),
        Case("completions a list over the server's capacity", _json({**base, "prompt": ["hi"] * 200}),
             "/v1/completions", param="prompt", tags=("finding",)),
        # the default server admits 1 worker x 8 + a queue of 16 = 24 requests at once: 25 could only ever get 503
        Case("completions 25 prompts (capacity + 1)", _json({**base, "prompt": ["hi"] * 25}), "/v1/completions",
             param="prompt", tags=("finding",)),
        Case("completions 24 prompts (the capacity)", _json({**base, "prompt": ["hi"] * 24}), "/v1/completions",
             expect="ok"),
        Case("completions 4 prompts", _json({**base, "prompt": ["hi", "sea", "sky", "sun"]}), "/v1/completions",
             expect="ok"),
        Case("completions stream 2 prompts", _json({**base, "stream": True, "prompt": ["a", "b"]}),
             "/v1/completions", param="prompt"),
        Case("completions echo", _json({**base, "prompt": "hi", "echo": True}), "/v1/completions", param="echo"),
        Case("completions suffix", _json({**base, "prompt": "hi", "suffix": "x"}), "/v1/completions", param="suffix"),
        Case("completions best_of 3", _json({**base, "prompt": "hi", "best_of": 3}), "/v1/completions",
             param="best_of"),
        Case("completions logprobs 6", _json({**base, "prompt": "hi", "logprobs": 6}), "/v1/completions",
             param="logprobs"),
        Case("completions token ids", _json({**base, "prompt": [1, 2, 3]}), "/v1/completions", param="prompt"),
        Case("completions empty list", _json({**base, "prompt": []}), "/v1/completions", param="prompt"),
    ]


def _responses() -> list[Case]:
    base = {"model": "tiny", "max_output_tokens": 4}
    return [
        # held in the issue's run; /health 0.15 s in this catalogue's first quiet run (parsed in one C call, then
        # translated on the event loop): in CI since ("ci")
        Case("responses 100,000 input items", _json(lambda: {**base, "input": [
            {"role": "user", "content": "hi"}] * 100_000}), "/v1/responses", param="input", tags=("ci",)),
        Case("responses 40 MB instructions", _json(lambda: {**base, "input": "hi", "instructions": "x" * 40_000_000}),
             "/v1/responses"),
        Case("responses tools", _json({**base, "input": "hi", "tools": [{"type": "function", "name": "f"}]}),
             "/v1/responses", param="tool_choice"),  # "auto" on LLaVA, whose template renders no tools
        Case("responses function_call item", _json({**base, "input": [{"type": "function_call", "name": "f"}]}),
             "/v1/responses", param="input[0].call_id"),
        Case("responses json text format", _json({**base, "input": "hi", "text": {"format": {"type": "json_object"}}}),
             "/v1/responses", param="text"),
    ]


def _pruning() -> list[Case]:
    bad = {"budget 0": {"budget": 0}, "budget -1": {"budget": -1}, "budget 2**31": {"budget": 2 ** 31},
           "budget 1.5": {"budget": 1.5}, "budget true": {"budget": True}, "method nope": {"method": "nope"},
           "tau 65": {"tau": 65}, "tau -1": {"tau": -1}, "tau string": {"tau": "x"}, "demand nope": {"demand": "x"},
           "pivots for coverpruner": {"pivots": 4}, "relevance_weight for dart": {"method": "dart",
                                                                                  "relevance_weight": 0.5}}
    out = [Case(name, _json(image_chat(**f)), param=next(iter(f)) if name != "relevance_weight for dart"
                else "relevance_weight") for name, f in bad.items()]
    out += [Case("penalty 2.1", _json(chat(frequency_penalty=2.1)), param="frequency_penalty"),
            Case("penalty -2.1", _json(chat(presence_penalty=-2.1)), param="presence_penalty"),
            Case("max_tokens 0", _json(chat(max_tokens=0)), param="max_tokens"),
            Case("max_tokens 2**31", _json(chat(max_tokens=2 ** 31)), param="max_tokens"),
            Case("seed -1", _json(chat(seed=-1)), param="seed")]
    return out


def _misc() -> list[Case]:
    from tests.hardening.pngs import png

    def png_chat(data: bytes) -> dict:
        url = "data:image/png;base64," + base64.b64encode(data).decode()
        return chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                           {"type": "text", "text": "hi"}]}])

    refused = {"functions": [{"name": "f"}], "audio": {"voice": "x"}, "modalities": ["audio"],
               "prediction": {"type": "content", "content": "x"}, "web_search_options": {}}
    out = [Case(f"refused field {k}", _json(chat(**{k: v})), param=k) for k, v in refused.items()]
    out += [
        Case("unknown model", _json(chat(model="nope")), param="model"),
        Case("unknown field", _json(chat(frobnicate=1)), param="frobnicate"),
        Case("17 stop strings", _json(chat(stop=[f"s{i}" for i in range(17)])), param="stop"),
        Case("stop string of 1,025 characters", _json(chat(stop=["x" * 1025])), param="stop"),
        Case("10,000 stop strings", _json(chat(stop=[f"s{i}" for i in range(10_000)])), param="stop"),
        Case("10,000 stop ids", _json(chat(stop_token_ids=list(range(10_000)))), param="stop_token_ids"),
        Case("empty stop string", _json(chat(stop=[""])), param="stop"),
        Case("100,000 text parts", _json(lambda: chat(messages=[{"role": "user", "content": [
            {"type": "text", "text": "a"}] * 100_000}])), param="messages"),
        Case("lone surrogate", lambda: json.dumps(chat())[:-1].replace(PROMPT, "\\ud800" + PROMPT).encode() + b"}"),
        Case("not JSON", lambda: b"not json at all"),
        Case("JSON array body", lambda: b"[1, 2]"),
        Case("JSON nested 10,000 deep", lambda: b'{"model": "tiny", "messages": ' + b"[" * 10_000 + b"]" * 10_000
             + b"}"),
        Case("bytes that are not UTF-8", lambda: b"\xff\xfe\x00garbage"),
        Case("PNG bomb 30,000^2", _json(lambda: png_chat(png(30_000, 30_000, bit_depth=1)))),
        Case("PNG 20,000 x 1", _json(lambda: png_chat(png(20_000, 1)))),
        Case("remote image without --allow-remote-images", _json(chat(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}, {"type": "text", "text": "hi"}]}]))),
        Case("local file without --allow-local-files", _json(chat(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}, {"type": "text", "text": "hi"}]}]))),
        Case("a tool role message", _json(chat(messages=[{"role": "user", "content": "hi"},
                                                         {"role": "tool", "content": "x"}]))),
    ]
    return out


def _qwen() -> list[Case]:
    qwen = ("qwen3_vl",)
    return [
        Case(f"qwen {k} {v!r}", _json(image_chat(**{k: v})), param=k, families=qwen, tags=("finding",))
        for k, v in (("image_size", "²x²"), ("min_pixels", "①"), ("max_pixels", "١٢"), ("max_pixels", 10 ** 12),
                     ("min_pixels", 1), ("max_video_frames", "²"), ("image_size", "100x100"))
    ] + [
        Case("qwen image_size 64x64", _json(image_chat(image_size="64x64")), expect="ok", families=qwen),
        Case("qwen max_pixels 4 tokens", _json(image_chat(max_pixels=4 * 32 * 32)), expect="ok", families=qwen),
        Case("qwen min_pixels > max_pixels", _json(image_chat(min_pixels=32 * 32 * 50, max_pixels=32 * 32 * 40)),
             param="max_pixels", families=qwen),
    ]


def _streamed(case: Case) -> Case:
    """The same request with "stream": true (an error found before the first token is still a plain 4xx)."""
    return dataclasses.replace(case, name=case.name + ", streamed", neighbour=False,
                               make=lambda: json.dumps({**json.loads(case.make()), "stream": True}).encode())


def cases(family: str) -> list[Case]:
    """The catalogue for ``family``: "llava" (every case, and a streamed twin of each finding sent to chat
    completions) or "qwen3_vl" (the findings, their streamed twins and the Qwen image options)."""
    everything = (_temperatures() + _integers() + _schemas() + _tools() + _logit_bias() + _logprobs() +
                  _completions() + _responses() + _pruning() + _misc() + _qwen())
    twins = [_streamed(c) for c in everything if "finding" in c.tags and c.path == CHAT and c.expect != "any"
             and "big" not in c.tags and c.families != ("qwen3_vl",)]
    chosen = everything + twins
    if family == "qwen3_vl":
        chosen = [c for c in chosen if "finding" in c.tags or ", streamed" in c.name or c.families == ("qwen3_vl",)]
    return [c for c in chosen if family in c.families]


# -- judging an answer (shared by the benchmark and the CI test) -------------------------------------------------

#: the issue's bounds: a refusal within ERROR_S, /health within HEALTH_S, RSS back within RSS_MB of its level before
ERROR_S, HEALTH_S, RSS_MB = 1.0, 0.100, 200


def parse(raw: bytes):
    """The answer's body: JSON, else its text (a server-sent event stream)."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def stream_error(data) -> dict | None:
    """The OpenAI error of a stream's error event (an answer cut after it started), or None."""
    if isinstance(data, str):
        for line in data.splitlines():
            if line.startswith("data: {") and '"error"' in line:
                return json.loads(line[6:]).get("error")
    return None


def answer_texts(data) -> list[str] | None:
    """The choices' texts of a 200 (JSON or a server-sent event stream); None when it is not an answer."""
    if isinstance(data, dict):
        return [c.get("message", {}).get("content") or c.get("text") or "" for c in data.get("choices", [])]
    if isinstance(data, str) and data.startswith("data: ") and stream_error(data) is None:
        texts: dict[int, str] = {}
        for line in data.splitlines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:]).get("choices", []):
                    piece = (c.get("delta") or {}).get("content") or c.get("text") or ""
                    texts[c["index"]] = texts.get(c["index"], "") + piece
        return [texts[i] for i in sorted(texts)]
    return None


def outcome(case: Case, status: int, data, seconds: float, time_scale: float = 1.0) -> dict:
    """{check: passed} of one answer against the case's expectation (the refusal's time bound times
    ``time_scale``, the machine's load)."""
    checks = {}
    error = data.get("error") if isinstance(data, dict) and set(data) == {"error"} else stream_error(data)
    if case.expect in ("4xx", "any") and 400 <= status < 500:
        checks["openai_error_body"] = bool(error and isinstance(error.get("message"), str)
                                           and error["message"] and "\n" not in error["message"])
        checks["param"] = case.param is None or (error or {}).get("param") == case.param
        checks["under_1s"] = seconds < ERROR_S * time_scale
    elif case.expect == "any" and status == 200 and stream_error(data) is not None:  # cut mid-stream: its event
        checks["openai_error_event"] = isinstance(error.get("message"), str) and "\n" not in error["message"]
    elif case.expect in ("ok", "any") and status == 200:
        checks["answer"] = answer_texts(data) is not None
    else:
        checks["expected_status"] = False
    return checks
