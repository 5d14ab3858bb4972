"""The session interfaces the runtime drives, declared once; every engine backend implements them.

* ``GraphSession``: one graph (vision, embed, probe, selector). onnxruntime.InferenceSession satisfies it
  as is; engines/trt_session.TrtSession implements it for native TensorRT engines.
* ``DecoderLoop``: the decoder graph plus its KV cache for one request at a time. runtime/kv_cache.py's
  DecoderSession (ORT IO binding) and engines/trt_session.TrtDecoderSession (cache on the GPU) implement it.
  A GraphSession that brings its own loop offers ``decoder_loop(num_layers, num_kv_heads, head_dim,
  vocab_size, dtype) -> DecoderLoop``; the runtime uses it instead of the ORT loop.
* ``SessionFactory``: ``factory(graph_name, onnx_path) -> GraphSession`` (engines/ort.OrtSessionFactory,
  engines/trt_session.TrtSessionFactory), the ``session_factory`` hook of ``Pipeline.load``.

Tensor names are the engine dir's (coverpruner.engine_dir).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class GraphSession(Protocol):
    def run(self, output_names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run once: numpy inputs by name -> the named outputs (all outputs for None), as numpy arrays."""

    def get_inputs(self) -> list:
        """Input descriptors, each with ``.name`` (and ``.shape`` / ``.type`` where the backend has them)."""


@runtime_checkable
class DecoderLoop(Protocol):
    #: tokens already in the cache (P)
    length: int

    def reset(self, capacity: int) -> None:
        """Empty the cache and make room for ``capacity`` tokens (prompt + generated) of one request."""

    def forward(self, inputs_embeds: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """Append S tokens: inputs_embeds float [1, S, d] (graph float dtype), position_ids int64 [1, S] (rank 1)
        or [R, 1, S] (rank R, M-RoPE). Returns the last position's logits float [V] (valid until the next call)."""


class SessionFactory(Protocol):
    def __call__(self, graph: str, onnx_path: Path) -> GraphSession:
        """The session for graph ``graph`` of an engine dir (``onnx_path``: its ONNX file)."""
