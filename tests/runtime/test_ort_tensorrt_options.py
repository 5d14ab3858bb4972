"""ORT's TensorRT EP gets engine/timing caches, the manifest's precision and explicit optimization profiles
for every dynamic input, built from the same axis ranges as coverpruner-build."""

import json

import onnxruntime as ort
import pytest

from coverpruner.engines import ort as ort_factory
from coverpruner.engines.ort import tensorrt_ep_options
from coverpruner.runtime import Pipeline

pytestmark = pytest.mark.slow


def _profiles(options):
    return {key: dict(item.split(":") for item in options[f"trt_profile_{key}_shapes"].split(","))
            for key in ("min", "opt", "max")}


def test_decoder_profiles_cover_every_dynamic_input(tiny_export, tmp_path):
    manifest = json.loads((tiny_export / "manifest.json").read_text())
    opts = tensorrt_ep_options(manifest, "decoder", tmp_path)
    assert opts["trt_engine_cache_enable"] == "True" and opts["trt_engine_cache_path"] == str(tmp_path)
    assert opts["trt_fp16_enable"] == "False"  # the tiny export is fp32
    prof = _profiles(opts)
    names = [i["name"] for i in manifest["graphs"]["decoder"]["inputs"]]
    assert all(set(p) == set(names) for p in prof.values())
    dims, ctx = manifest["dims"], manifest["dims"]["max_position_embeddings"]
    kv = f"1x{dims['num_kv_heads']}x%dx{dims['head_dim']}"
    assert prof["min"]["past_key_values.0.key"] == kv % 0  # prefill: empty past
    assert prof["max"]["past_key_values.0.key"] == kv % (ctx - 1)
    assert prof["max"]["attention_mask"] == f"1x{ctx}"
    assert prof["min"]["inputs_embeds"] == f"1x1x{dims['hidden_size']}"


def test_fp16_precision_and_static_inputs(tiny_export, tmp_path):
    manifest = json.loads((tiny_export / "manifest.json").read_text())
    manifest["precision"] = "fp16"
    opts = tensorrt_ep_options(manifest, "selector", tmp_path)
    assert opts["trt_fp16_enable"] == "True"
    prof = _profiles(opts)
    assert set(prof["min"]) == {"image_features", "relevance"}  # the scalar budget/tau get no profile


def test_pipeline_hands_the_options_to_the_tensorrt_ep(tiny_export, monkeypatch):
    """With provider 'tensorrt', every session is created with the TensorRT EP options (ORT faked: no GPU)."""
    created = {}
    real = ort.InferenceSession

    class Running:  # a CPU session that reports the providers it was asked for, as a GPU machine's would
        def __init__(self, session, providers):
            self._session, self._providers = session, [p[0] if isinstance(p, tuple) else p for p in providers]

        def get_providers(self):
            return self._providers

        def __getattr__(self, name):
            return getattr(self._session, name)

    def fake_session(path, sess_options=None, providers=None):
        created[path.rsplit("/", 1)[-1]] = providers
        return Running(real(path, sess_options=sess_options, providers=["CPUExecutionProvider"]), providers)

    monkeypatch.setattr(ort_factory.ort, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort_factory.ort, "InferenceSession", fake_session)
    Pipeline.load(tiny_export, provider="tensorrt")
    assert set(created) >= {"vision.onnx", "embed.onnx", "probe.onnx", "decoder.onnx"}
    trt_name, trt_opts = created["decoder.onnx"][0]
    assert trt_name == "TensorrtExecutionProvider" and created["decoder.onnx"][1:] == ["CUDAExecutionProvider",
                                                                                         "CPUExecutionProvider"]
    assert trt_opts["trt_engine_cache_path"] == str(tiny_export / "ort_trt_cache")
    assert "past_key_values.0.value:" in trt_opts["trt_profile_max_shapes"]
