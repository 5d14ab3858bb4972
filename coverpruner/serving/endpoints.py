"""/v1/completions and /v1/responses: each body is translated into a chat request (serving.schema's
ChatCompletionRequest) and answered by the same path and the same engine loop as /v1/chat/completions (options,
pruning fields, stop strings, n, logprobs, limits and errors alike); only the shapes differ.

- /v1/completions (OpenAI's legacy API): ``prompt`` a string or a list of strings, text only; each prompt is the
  user turn of the model's chat template (these are chat VLMs: a raw continuation without the template is not
  offered, so ``echo: true`` and ``suffix`` are refused). ``logprobs`` is an int 0..5 (the legacy API's bound: that
  many alternatives per token) in the legacy shape; ``max_tokens`` defaults to 16 as OpenAI's. A list of k prompts
  with n answers gives k * n choices, prompt i's answer j at index i * n + j (not streamed: a streamed request
  takes one prompt).
- /v1/responses: serving/responses.py.

Fields either API defines that this server cannot honour get a 400 naming the field and why (REFUSED below);
book-keeping fields are taken and change nothing.
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from coverpruner.serving import json_body
from coverpruner.serving.choices import Delta, legacy_logprobs
from coverpruner.serving.errors import APIError, bad_request

#: the legacy completions API's bound on ``logprobs``
MAX_LEGACY_LOGPROBS = 5
#: the legacy completions API's default max_tokens
LEGACY_MAX_TOKENS = 16
#: most prompts in one /v1/completions request (each one request of the server's; more is a 400 naming prompt, as is
#: a list longer than the server admits at once: serving.app's capacity, --workers x --max-batch + --max-queue)
MAX_PROMPTS = 256

#: /v1/completions fields refused -> why (the value that asks for nothing is taken: COMPLETION_OFF)
COMPLETION_REFUSED = {
    "echo": "each prompt is the user turn of the model's chat template, so the prompt is not part of the answer "
            "(use /v1/chat/completions for conversations)",
    "suffix": "insertion (a suffix after the answer) is not supported",
    "best_of": "best_of above n is not supported (ask for n answers and rank them)",
}
COMPLETION_OFF = {"echo": False}
def _refuse(body: dict, refused: dict, off: dict) -> None:
    for name in sorted(set(body) & set(refused)):
        value = body.pop(name)
        if value is not None and value != off.get(name, None):
            raise bad_request(f"{name} is not supported: {refused[name]}", name)


# -- /v1/completions ----------------------------------------------------------------------------------

def completion_bodies(body: dict) -> list[dict]:
    """A /v1/completions body -> one chat body per prompt (400 naming the field for what cannot be taken)."""
    body = dict(body)
    n = body.get("n")
    if body.get("best_of") is not None and body.get("best_of") in (1, n):
        body.pop("best_of")  # as many candidates as answers: nothing to choose among
    _refuse(body, COMPLETION_REFUSED, COMPLETION_OFF)
    prompt = body.pop("prompt", None)
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise bad_request("prompt must be a string or a non-empty list of strings (text only: token-id prompts are "
                          f"not supported), got {type(prompt).__name__}", "prompt")
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"prompt holds {len(prompts):,} prompts; at most {MAX_PROMPTS} per request", "prompt")
    if len(prompts) > 1 and body.get("stream"):
        raise bad_request(f"a streamed completion takes one prompt, got {len(prompts)}", "prompt")
    logprobs = body.pop("logprobs", None)
    if logprobs is not None:
        if not isinstance(logprobs, int) or isinstance(logprobs, bool) or not 0 <= logprobs <= MAX_LEGACY_LOGPROBS:
            raise bad_request(f"logprobs must be an integer in 0..{MAX_LEGACY_LOGPROBS}, got {logprobs!r}",
                              "logprobs")
        body.update(logprobs=True, top_logprobs=logprobs)
    body.setdefault("max_tokens", LEGACY_MAX_TOKENS)
    return [{**body, "messages": [{"role": "user", "content": p}]} for p in prompts]


def _legacy_usage(usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens, "prompt_tokens_details": usage.prompt_tokens_details}


def completion_render(chat, offset: int = 0):
    """(complete, stream) of /v1/completions over the chat path's collect / answers (serving.app)."""

    async def complete(state, job, gen, event, meta):
        got = await chat.collect(state, job, gen, event)
        if got is None:
            return Response(status_code=499)

        def build() -> dict:
            lp = gen.top_logprobs is not None
            usage = chat.usage([c.end.result for c in got])
            return {
                "id": meta.id.replace("chatcmpl-", "cmpl-"), "object": "text_completion", "created": meta.created,
                "model": meta.model,
                "choices": [{"index": offset + c.index, "text": c.text, "finish_reason": chat.finish_reason(c.end),
                             "logprobs": legacy_logprobs(c.logprobs, state.token_text) if lp else None}
                            for c in got],
                "usage": _legacy_usage(usage), "coverpruner": chat.coverpruner(got[0].end.result)}

        return await chat.json_answer(got, gen, build)

    async def stream(state, job, gen, event, meta, timer=None):
        cid = meta.id.replace("chatcmpl-", "cmpl-")
        offsets, results = [0] * gen.n, []

        def chunk(index, text, finish=None, logprobs=None, **extra):
            return "data: " + json.dumps({"id": cid, "object": "text_completion", "created": meta.created,
                                          "model": meta.model, "choices": [{"index": index, "text": text,
                                                                            "finish_reason": finish,
                                                                            "logprobs": logprobs}], **extra}) + "\n\n"

        try:
            async for item in chat.answers(state, job, gen, event):
                if item is None:
                    break
                if isinstance(item, APIError):
                    state.count_error(item)
                    yield f"data: {json.dumps(item.body())}\n\n"
                    break
                if isinstance(item, Delta):
                    lp = (legacy_logprobs(item.logprobs, state.token_text, offsets[item.index])
                          if gen.top_logprobs is not None else None)
                    offsets[item.index] += len(item.text)
                    yield chunk(item.index, item.text, logprobs=lp)
                else:
                    results.append(item.result)
                    yield chunk(item.index, "", chat.finish_reason(item),
                                coverpruner=chat.coverpruner(item.result))
            if len(results) == gen.n and gen.include_usage:
                usage = _legacy_usage(chat.usage(results))
                yield "data: " + json.dumps({"id": cid, "object": "text_completion", "created": meta.created,
                                             "model": meta.model, "choices": [], "usage": usage}) + "\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if timer is not None:
                timer.cancel()
            job.cancel()

    return complete, stream


async def completions(request: Request, body: dict, serve, chat):
    """POST /v1/completions: one serve() per prompt (concurrently), merged into one answer. A list is admitted
    whole or not at all: longer than the server's capacity (chat.capacity(): requests admitted at once) it is a
    400 naming prompt, longer than the room left right now a 503 before any of it is queued; and when one
    prompt's request fails (a 400, or a 503 lost to a request that came in between), the others are cancelled at
    once, so the list never holds slots after its answer."""
    bodies = completion_bodies(body)
    arrived = time.monotonic()
    reqs = [chat.validate_chat(b) for b in bodies]
    n = reqs[0].n or 1
    if len(reqs) == 1:
        return await serve(request, reqs[0], arrived, completion_render(chat))
    capacity, free = chat.capacity()
    if len(reqs) > capacity:
        raise bad_request(f"prompt holds {len(reqs)} prompts; this server admits at most {capacity} requests at once "
                          "(--workers x --max-batch + --max-queue), so the list could never be answered: send at "
                          f"most {capacity} prompts per request", "prompt")
    if len(reqs) > free:
        raise APIError(503, f"server busy: {len(reqs)} prompts need {len(reqs)} free places, {free} are free; retry "
                            "later", None, "queue_full")
    tasks = [asyncio.ensure_future(serve(request, r, arrived, completion_render(chat, i * n)))
             for i, r in enumerate(reqs)]
    try:
        answers = await asyncio.gather(*tasks)
    finally:
        for t in tasks:  # after a failure: stop the other prompts' requests now, not at their end
            t.cancel()
    if any(a.status_code != 200 for a in answers):  # a client that went away
        return next(a for a in answers if a.status_code != 200)

    def merge() -> bytes:  # in a worker thread: the parts may hold many logprob entries each
        parts = [json.loads(a.body) for a in answers]
        merged = parts[0]
        merged["choices"] = [c for p in parts for c in p["choices"]]
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            merged["usage"][key] = sum(p["usage"][key] for p in parts)
        return json_body.dumps(merged)

    return Response(await run_in_threadpool(merge), media_type="application/json")


def add_endpoints(app, state, serve, read_json, chat) -> None:
    """Register /v1/completions and /v1/responses on ``app``; serve: the chat path (serving.app.create_app's),
    read_json: the body reader with the server's limits; chat: the chat path's helpers (collect, answers,
    usage, finish_reason, coverpruner, validate_chat), handed in by serving.app (no import back into it)."""

    @app.post("/v1/completions")
    async def _completions(request: Request):
        return await completions(request, await read_json(request), serve, chat)

    @app.post("/v1/responses")
    async def _responses(request: Request):
        from coverpruner.serving.responses import responses

        return await responses(request, await read_json(request), serve, chat)
