"""Continuous batching for Pipeline: the engine loop (runtime/engine.py) over a BatchDecoder of N slots.

    batch = BatchGenerator(pipe, max_batch=8, capacity=2048)
    ids = [batch.submit(pipe.request(image, prompt, max_new_tokens=128)) for image, prompt in jobs]
    while batch.pending:
        for event in batch.step():      # BatchEvent: request id, new text piece, GenerationResult when done
            ...
    # or: results = pipe.batch_generate([dict(image=..., prompt=...), ...], max_batch=8)

A BatchGenerator is ``pipe.engine(max_batch, capacity)``: the same admission, scheduler (prefill chunks beside the
decodes under the step's token budget), decode step and stop rules as Pipeline.generate, which runs that loop with
one slot. Greedy tokens equal Pipeline.generate's (tests/runtime/test_batching.py). Needs the ORT-form decoder
(graphs.decoder.form "ort"); other dirs are refused in one line.
"""

from __future__ import annotations

from coverpruner.runtime.engine import Engine, EngineEvent

#: one step's event for one request (runtime.engine.EngineEvent)
BatchEvent = EngineEvent


def BatchGenerator(pipeline, max_batch: int = 8, capacity: int | None = None,  # noqa: N802 (the public name)
                   max_step_tokens: int | None = None) -> Engine:
    """An engine loop of up to ``max_batch`` requests of one Pipeline over a shared BatchDecoder.

    capacity: tokens one request may hold (pruned prompt + generated; default the model's max positions). The
    KV cache is allocated once: num_layers x 2 x [max_batch, H_kv, capacity, head_dim] float32. Not thread-safe:
    one thread calls submit / step / cancel (the server's worker does)."""
    return pipeline.engine(max_batch, capacity or pipeline.max_positions, max_step_tokens)
