"""provider "tensorrt": native engines recorded by coverpruner-build are used (and refused when they were built
elsewhere); a decoder session that brings its own KV-cache loop gets it used by Pipeline."""

import json

import numpy as np
import pytest

from coverpruner.engines.ort import OrtSessionFactory
from coverpruner.runtime import Pipeline
from coverpruner.runtime.cli import main
from coverpruner.runtime.errors import OptionError
from coverpruner.engines.ort_decoder import OrtDecoderSession

pytestmark = pytest.mark.slow


def _record_foreign_engines(engine_dir):
    """Pretend coverpruner-build ran with a TensorRT-RTX version this machine does not have."""
    path = engine_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["tensorrt"] = {"flavour": "tensorrt_rtx", "version": "0.0.0-other", "compute_capability": None,
                            "engines": {g: {"file": f"{g}.engine"} for g in ("vision", "embed", "probe", "decoder")}}
    path.write_text(json.dumps(manifest))


@pytest.mark.tensorrt
def test_engines_built_by_another_tensorrt_version_are_refused(engine_copy, demo_image, capsys):
    trt = pytest.importorskip("tensorrt_rtx", reason="needs the TensorRT-RTX python bindings")
    _record_foreign_engines(engine_copy)
    with pytest.raises(OptionError, match=f"built with tensorrt_rtx 0.0.0-other but {trt.__version__} is installed"):
        Pipeline.load(engine_copy, provider="tensorrt")
    code = main([str(engine_copy), "--image", str(demo_image), "--prompt", "hi", "--provider", "tensorrt"])
    err = capsys.readouterr().err
    assert code == 2 and "0.0.0-other" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cpu_provider_ignores_recorded_engines(engine_copy):
    _record_foreign_engines(engine_copy)
    assert Pipeline.load(engine_copy, provider="cpu").decoder.__class__ is OrtDecoderSession


class _OwnLoopSession:
    """An ORT decoder session that, like TrtSession, offers its own KV-cache loop."""

    def __init__(self, session):
        self.session, self.calls = session, []

    def __getattr__(self, name):
        return getattr(self.session, name)

    def decoder_loop(self, *dims_and_dtype):
        self.calls.append(dims_and_dtype)
        return OrtDecoderSession(self.session, *dims_and_dtype)


def test_pipeline_uses_a_sessions_own_decoder_loop(tiny_export, demo_image, pipe):
    ort_factory = OrtSessionFactory("cpu", 1)
    wrapped = {}

    def factory(name, path):
        session = ort_factory(name, path)
        if name == "decoder":
            session = wrapped.setdefault(name, _OwnLoopSession(session))
        return session

    own = Pipeline.load(tiny_export, session_factory=factory)
    calls = wrapped["decoder"].calls
    assert len(calls) == 1 and calls[0][4] == np.float32  # (layers, kv heads, head dim, vocab, dtype)
    got = own.generate(demo_image, "What is shown?", budget=16, max_new_tokens=6)
    want = pipe.generate(demo_image, "What is shown?", budget=16, max_new_tokens=6)
    assert got.token_ids == want.token_ids
