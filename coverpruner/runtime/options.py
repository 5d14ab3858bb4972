"""Generation options as one typed object (GenerationOptions, in the spirit of vLLM's SamplingParams), validated
once when it is built, and the one check of every numeric request option it runs, shared by coverpruner-run,
the server's schema and every ``Pipeline`` call: right type (an int is not a bool or a float; a number is not a string),
finite, in range. Each failure is an OptionError whose one-line message names the option and says what was
expected and what came.

Bounds, and why:
- tau (demand temperature): weights are exp(tau * minmax(r)) with r scaled to [0, 1]; float32 overflows at
  tau > 88.7 and the greedy sums up to n weights, so tau <= TAU_MAX = 64 keeps e^64 * 10^6 candidates
  (~6e33) below float32's 3.4e38. Negative tau would favour the tokens the prompt ignores: refused.
- budget: 1 .. MAX_BUDGET (a budget >= the image's candidates keeps them all, so larger values mean nothing
  and an unbounded int overflowed the int64 feed of selector.onnx).
- seed: 0 .. 2**63 - 1 (numpy's generator refuses negatives; int64 bound for any backend).
- max_new_tokens: 1 .. MAX_NEW_TOKENS (the context ends decoding long before).
- temperature: finite, >= 0 (below runtime.sampling.GREEDY_BELOW, 1e-5, the choice is greedy); top_p: finite, in (0, 1].
- method options (coverpruner.selection's declarations: dart's pivots, cdpruner's relevance_weight): each
  method's own check; an option of another method is refused by name (check_method_options).
- stop strings: at most MAX_STOP_STRINGS of 1..MAX_STOP_CHARS characters, valid Unicode (OpenAI takes 4; the
  bound leaves room for clients that send more and bounds the loop's matcher: runtime/stop.py works per token in
  strings x characters); stop_token_ids: at most MAX_STOP_TOKEN_IDS ids >= 0 (past the vocabulary: refused by
  Pipeline.request, which knows its size).
- n: 1..MAX_N answers (the engine loop refuses more than its batch holds: they decode side by side).
- top_logprobs: 0..MAX_TOP_LOGPROBS, and only with logprobs (OpenAI's rule).

Each refusal is raised with ``param=`` the option's name (the server reports it as the OpenAI error's param).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Mapping

from coverpruner.integers import ascii_int, brief
from coverpruner.runtime.errors import OptionError
from coverpruner.selection import METHOD_OPTIONS, SELECTORS, method_options

TAU_MAX = 64.0
MAX_BUDGET = 2 ** 31 - 1
MAX_SEED = 2 ** 63 - 1
MAX_NEW_TOKENS = 2 ** 31 - 1
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 64
MAX_N = 128
#: OpenAI's bound on top_logprobs (chat completions); the legacy completions API bounds logprobs at 5
MAX_TOP_LOGPROBS = 20


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value, lo: int, hi: int) -> int:
    """An integer in [lo, hi] (not a bool, not a float, not a string) -> int."""
    if not _is_int(value) or not lo <= value <= hi:
        raise OptionError(f"{name} must be an integer in {lo}..{hi}, got {value!r}", param=name)
    return int(value)


def check_float(name: str, value, lo: float, hi: float, lo_open: bool = False) -> float:
    """A finite real number in [lo, hi] ((lo, hi] with lo_open) -> float."""
    ok = _is_number(value) and math.isfinite(value) and (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        rng = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise OptionError(f"{name} must be a finite number in {rng}, got {value!r}", param=name)
    return float(value)


def check_tau(tau) -> float:
    return check_float("tau", tau, 0.0, TAU_MAX)


def check_seed(seed) -> int | None:
    return None if seed is None else check_int("seed", seed, 0, MAX_SEED)


def check_max_new_tokens(value) -> int:
    return check_int("max_new_tokens", value, 1, MAX_NEW_TOKENS)


def check_temperature(value) -> float:
    return check_float("temperature", value, 0.0, 1e6)  # any finite temperature >= 0; 1e6 is already uniform


def check_top_p(value) -> float:
    return check_float("top_p", value, 0.0, 1.0, lo_open=True)


def check_penalty(name: str, value) -> float:
    return check_float(name, value, -2.0, 2.0)  # OpenAI's range for frequency_penalty / presence_penalty


#: OpenAI's bound on a logit_bias value
MAX_LOGIT_BIAS = 100.0
#: most logit_bias entries: a word list to ban or favour is tens to hundreds of ids; a larger set is a grammar's job
#: (response_format). Counted before any entry is read: 10^6 entries took 5.3 s to refuse
MAX_LOGIT_BIAS_ENTRIES = 1024


def check_logit_bias(value) -> dict:
    """{token id (int, or its decimal string in ASCII digits: JSON object keys are strings): bias in [-100, 100]},
    at most MAX_LOGIT_BIAS_ENTRIES entries -> {int: float}. Ids past the vocabulary are refused by
    Pipeline.request, which knows its size."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise OptionError(f"logit_bias must map token ids to numbers, got {brief(value)}", param="logit_bias")
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise OptionError(f"logit_bias has {len(value):,} entries; at most {MAX_LOGIT_BIAS_ENTRIES}",
                          param="logit_bias")
    out = {}
    for key, bias in value.items():
        tid = ascii_int(key) if isinstance(key, str) else key
        if not _is_int(tid) or tid < 0:
            raise OptionError(f"logit_bias key {brief(key)} is not a token id (an integer >= 0 in ASCII digits)",
                              param="logit_bias")
        out[int(tid)] = check_float("logit_bias", bias, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
    return out


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise OptionError(f"{name} must be true or false, got {value!r}", param=name)
    return value


def check_stop(value) -> tuple[str, ...]:
    """None / a string / a sequence of strings -> tuple of stop strings; OptionError (param stop) for an empty
    string, more than MAX_STOP_STRINGS, one longer than MAX_STOP_CHARS or one that is not valid Unicode (JSON lets a
    lone surrogate through; the tokenizer does not)."""
    if value is None:
        return ()
    stops = (value,) if isinstance(value, str) else value
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
        raise OptionError(f"stop must be a string or a list of strings, got {value!r:.80}", param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise OptionError(f"stop holds {len(stops)} strings; at most {MAX_STOP_STRINGS}", param="stop")
    for i, s in enumerate(stops):
        if not s:
            raise OptionError("stop strings must not be empty", param="stop")
        if len(s) > MAX_STOP_CHARS:
            raise OptionError(f"stop string {i} is {len(s)} characters; at most {MAX_STOP_CHARS}", param="stop")
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise OptionError(f"stop string {i} holds a lone UTF-16 surrogate at character {exc.start}; send valid "
                              "Unicode", param="stop") from None
    return tuple(stops)


def check_stop_token_ids(value) -> tuple[int, ...]:
    """None / a sequence of token ids (integers >= 0) -> tuple; OptionError (param stop_token_ids) otherwise."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or len(value) > MAX_STOP_TOKEN_IDS \
            or not all(_is_int(t) and t >= 0 for t in value):
        raise OptionError(f"stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} token ids (integers >= 0), "
                          f"got {value!r:.80}", param="stop_token_ids")
    return tuple(int(t) for t in value)


def check_top_logprobs(value, name: str = "top_logprobs") -> int | None:
    """None (no logprobs) or an integer in 0..MAX_TOP_LOGPROBS -> int | None; OptionError naming ``name``."""
    return None if value is None else check_int(name, value, 0, MAX_TOP_LOGPROBS)


def parse_budget(budget) -> int | None:
    """None / "full" -> None (no pruning); an integer in 1..MAX_BUDGET (or its decimal string in ASCII digits) ->
    int; anything else (bools, floats, "1e3", "²", out of range) -> OptionError."""
    if budget is None or (isinstance(budget, str) and budget.strip().lower() == "full"):
        return None
    value = ascii_int(budget) if isinstance(budget, str) else budget
    if not _is_int(value) or not 1 <= value <= MAX_BUDGET:
        raise OptionError(f"budget must be a positive integer or 'full', got {brief(budget)} (integers "
                          f"1..{MAX_BUDGET})", param="budget")
    return int(value)


#: Selection methods: the names coverpruner.selection registers.
METHODS = tuple(SELECTORS)
#: Where an image's demand comes from: its own user message ("turn") or the last user message ("latest").
DEMANDS = ("turn", "latest")


def check_method(method) -> str:
    if method not in METHODS:
        raise OptionError(f"unknown method {method!r}; expected one of {list(METHODS)}", param="method")
    return method


@dataclass(frozen=True)
class GenerationOptions:
    """Everything a request may set besides its image(s) and text, validated when built (OptionError naming the
    option otherwise). What depends on the engine dir is resolved by Pipeline.request: tau None and max_images
    None take the manifest's defaults, ``family`` is checked against the family's request options.

    budget: kept visual tokens per image; int 1..MAX_BUDGET, or None / "full" (stored as None: no pruning).
    method: a coverpruner.selection name. tau: coverage threshold in [0, TAU_MAX] or None. demand: "turn" (an
    image's demand comes from its own message) or "latest" (the last user message). max_new_tokens,
    temperature, top_p, seed: generation limits and sampling (seed also seeds the random selector).
    frequency_penalty, presence_penalty (each in [-2, 2]) and logit_bias ({token id: bias in [-100, 100]}):
    OpenAI's adjustments of the logits before sampling (runtime.sampling.adjust_logits).
    response_format: OpenAI's response_format ({"type": "json_object"} / {"type": "json_schema", "json_schema":
    {"name", "schema"}}) or None: the answer is constrained to it (runtime.grammar; checked by Pipeline.request).
    ignore_eos: decode past EOS up to max_new_tokens. max_images: most images + videos of a request (>= 0) or
    None. family: the family's request options as given ({name: value}, e.g. {"newline_policy": "keep"}).
    stop: strings that end an answer where they first appear (a string or a sequence; stored as a tuple): the engine
    loop matches them as it decodes (runtime/stop.py), the answer's text stops before the match and
    finish_reason is "stop". stop_token_ids: token ids that end the answer as EOS does (also with ignore_eos).
    n: answers of the request (OpenAI's n; forked after one prefill). logprobs: report each answer token's
    log-probability; top_logprobs: and that many alternatives (0..20; needs logprobs).
    tools, tool_choice, parallel_tool_calls: OpenAI's function tools (rendered by the chat template when it renders
    tools), the choice ("auto" when tools are given and no choice, "none", "required" or {"type": "function",
    "function": {"name"}}) and whether one answer may make several calls (runtime/tool_calls.py; checked by
    Pipeline.request). chat_template_kwargs: further variables of the chat template (e.g. {"enable_thinking":
    false}), each one the template reads.
    """

    budget: int | None = 64
    method: str = "coverpruner"
    tau: float | None = None
    demand: str = "turn"
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Mapping = field(default_factory=dict)
    response_format: Mapping | None = None
    ignore_eos: bool = False
    max_images: int | None = None
    family: Mapping = field(default_factory=dict)
    stop: tuple = ()
    stop_token_ids: tuple = ()
    n: int = 1
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: tuple = ()
    tool_choice: object = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: Mapping = field(default_factory=dict)

    def __post_init__(self):
        put = object.__setattr__  # frozen: the checked (normalised) values replace the given ones once
        put(self, "budget", parse_budget(self.budget))
        check_method(self.method)
        put(self, "tau", None if self.tau is None else check_tau(self.tau))
        if self.demand not in DEMANDS:
            raise OptionError(f"demand must be one of {list(DEMANDS)}, got {self.demand!r}", param="demand")
        put(self, "max_new_tokens", check_max_new_tokens(self.max_new_tokens))
        put(self, "temperature", check_temperature(self.temperature))
        put(self, "top_p", check_top_p(self.top_p))
        put(self, "seed", check_seed(self.seed))
        put(self, "frequency_penalty", check_penalty("frequency_penalty", self.frequency_penalty))
        put(self, "presence_penalty", check_penalty("presence_penalty", self.presence_penalty))
        put(self, "logit_bias", check_logit_bias(self.logit_bias))
        if self.response_format is not None and not isinstance(self.response_format, Mapping):
            raise OptionError(f"response_format must be an object with a 'type', got {self.response_format!r}",
                              param="response_format")
        check_bool("ignore_eos", self.ignore_eos)
        if self.max_images is not None and (not _is_int(self.max_images) or self.max_images < 0):
            raise OptionError(f"max_images must be an integer >= 0, got {self.max_images!r}", param="max_images")
        if not isinstance(self.family, Mapping) or not all(isinstance(k, str) for k in self.family):
            raise OptionError(f"family options must be a mapping of names to values, got {self.family!r}",
                              param="family")
        put(self, "family", dict(self.family))  # a copy: the caller's mapping may change afterwards
        put(self, "stop", check_stop(self.stop))
        put(self, "stop_token_ids", check_stop_token_ids(self.stop_token_ids))
        put(self, "n", check_int("n", self.n, 1, MAX_N))
        check_bool("logprobs", self.logprobs)
        put(self, "top_logprobs", check_top_logprobs(self.top_logprobs))
        if self.top_logprobs is not None and not self.logprobs:
            raise OptionError("top_logprobs needs logprobs: true", param="top_logprobs")
        if self.tools is None or not isinstance(self.tools, (list, tuple)):
            raise OptionError(f"tools must be a list of function tools, got {brief(self.tools)}", param="tools")
        put(self, "tools", tuple(self.tools))
        check_bool("parallel_tool_calls", self.parallel_tool_calls)
        kwargs = self.chat_template_kwargs
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise OptionError(f"chat_template_kwargs must map names to values, got {brief(kwargs)}",
                              param="chat_template_kwargs")
        put(self, "chat_template_kwargs", dict(kwargs))

    @property
    def logprob_count(self) -> int | None:
        """Alternatives reported with each token's log-probability: None (no logprobs), else 0..20."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @classmethod
    def of(cls, options: "GenerationOptions | None" = None, **kwargs) -> "GenerationOptions":
        """``options`` (default: the defaults above) with ``kwargs`` replacing fields by name; a keyword that is no
        field is a family request option (checked against the family by Pipeline.request). The Pipeline methods
        take their keyword arguments through here, so ``pipe.generate(img, q, budget=16)`` and
        ``pipe.generate(img, q, options=GenerationOptions(budget=16))`` are the same request."""
        if options is not None and not isinstance(options, cls):
            raise OptionError(f"options must be a GenerationOptions, got {type(options).__name__}", param="options")
        names = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in kwargs.items() if k in names}
        extra = {k: v for k, v in kwargs.items() if k not in names}
        base = options or cls()
        if not given and not extra:
            return base
        if extra:  # family options by their own names, over the family mapping given or held
            family = given.get("family", base.family)
            given["family"] = {**family, **extra} if isinstance(family, Mapping) else family
        return dataclasses.replace(base, **given)


def split_method_options(options: Mapping) -> tuple[dict, dict]:
    """Request keywords -> (family options, method options): the names some selection method declares
    (coverpruner.selection.METHOD_OPTIONS) go to the second dict."""
    return ({k: v for k, v in options.items() if k not in METHOD_OPTIONS},
            {k: v for k, v in options.items() if k in METHOD_OPTIONS})


def check_method_options(method: str, given: dict) -> dict:
    """The method options of ``method``: given values (checked) over its declared defaults -> {name: value}.
    OptionError (one line, ``param`` the option) for an option the method does not take or a bad value; {} for an
    unknown method (refused where it prunes)."""
    if method not in METHODS:
        return {}
    for key, value in given.items():  # one at a time, so the refusal names the option it is about
        try:
            method_options(method, {key: value})
        except ValueError as exc:
            raise OptionError(str(exc), param=key) from None
    return method_options(method, given)
