"""The runtime's Pipeline on native TensorRT engines (the "tensorrt" engines of `coverpruner-build`).

    pipe = load_tensorrt_pipeline("llava7b", selector="onnx")     # same API as Pipeline.load
    print(pipe.generate("cat.jpg", "What is in the picture?", budget=64).text)

Vision, embed, probe (and selector) run as TrtSession through Pipeline.load's `session_factory` hook; the
decoder's KV-cache loop is replaced by TrtDecoderSession (the same reset/forward API as the runtime's ORT
DecoderSession, with the cache in GPU buffers). Engines built for another TensorRT version or GPU are
refused before anything is loaded. coverpruner.runtime is imported lazily: it is a separate package layer.
"""

from __future__ import annotations

from pathlib import Path

from .trt_session import TrtDecoderSession, TrtSessionFactory


def load_tensorrt_pipeline(path: str | Path, verbose: bool = False, **load_kwargs):
    """Pipeline.load(path, session_factory=TrtSessionFactory(path), ...) with the TensorRT decoder loop.

    load_kwargs go to Pipeline.load (verify, selector, threads). Raises EngineMismatchError when the engines
    do not fit this machine and ManifestError/OptionError as Pipeline.load does.
    """
    from coverpruner.runtime.pipeline import Pipeline

    factory = TrtSessionFactory(path, verbose=verbose)
    # provider "cpu": the ORT-side choice only matters for the ORT decoder loop, which is replaced below
    pipe = Pipeline.load(path, provider="cpu", session_factory=factory, **load_kwargs)
    d = pipe.manifest.dims
    pipe.decoder = TrtDecoderSession(pipe.sessions["decoder"], int(d["num_layers"]), int(d["num_kv_heads"]),
                                     int(d["head_dim"]), int(d["vocab_size"]), pipe.float_dtype)
    pipe.provider = "tensorrt-engines"
    return pipe
