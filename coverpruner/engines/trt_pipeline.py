"""The runtime's Pipeline on native TensorRT engines (the "tensorrt" engines of `coverpruner-build`).

    pipe = load_tensorrt_pipeline("llava7b", selector="onnx")     # same API as Pipeline.load
    print(pipe.generate("cat.jpg", "What is in the picture?", budget=64).text)

Every graph runs as a TrtSession through Pipeline.load's `session_factory` hook; the decoder's KV-cache loop is
TrtDecoderSession (the same reset/forward API as the runtime's ORT DecoderSession, with the cache in GPU buffers),
which Pipeline gets from TrtSession.decoder_loop. `Pipeline.load(DIR, provider="tensorrt")` and
`coverpruner-run DIR --provider tensorrt` do the same when the manifest records engines. Engines built for another TensorRT version or GPU are
refused before anything is loaded. coverpruner.runtime is imported lazily: it is a separate package layer.
"""

from __future__ import annotations

from pathlib import Path

from .trt_session import TrtSessionFactory


def load_tensorrt_pipeline(path: str | Path, verbose: bool = False, **load_kwargs):
    """Pipeline.load(path, session_factory=TrtSessionFactory(path), ...) with the TensorRT decoder loop.

    load_kwargs go to Pipeline.load (verify, selector, threads). Raises EngineMismatchError when the engines
    do not fit this machine and ManifestError/OptionError as Pipeline.load does.
    """
    from coverpruner.runtime.pipeline import Pipeline

    # the decoder engine's TrtSession brings its own GPU KV-cache loop (TrtSession.decoder_loop)
    return Pipeline.load(path, provider="tensorrt", session_factory=TrtSessionFactory(path, verbose=verbose),
                         **load_kwargs)
