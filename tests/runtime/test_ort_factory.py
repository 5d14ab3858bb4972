"""Session factory: provider mapping, availability errors, thread options."""

import numpy as np
import onnxruntime as ort
import pytest

from coverpruner.engines.ort import OrtSessionFactory, ProviderError, make_session, ort_providers
from tests.runtime import fake_decoder


def test_cpu_provider_runs_a_graph(tmp_path):
    fake_decoder.build(tmp_path / "d.onnx", layers=1)
    sess = make_session(tmp_path / "d.onnx", "cpu", threads=1)
    assert sess.get_providers() == ["CPUExecutionProvider"]
    feeds = {"inputs_embeds": np.ones((1, 2, 8), np.float32), "attention_mask": np.ones((1, 2), np.int64),
             "position_ids": np.zeros((1, 2), np.int64),
             "past_key_values.0.key": np.zeros((1, 2, 0, 4), np.float32),
             "past_key_values.0.value": np.zeros((1, 2, 0, 4), np.float32)}
    assert sess.run(["logits"], feeds)[0].shape == (1, 1, 11)


def test_unknown_provider():
    with pytest.raises(ProviderError, match=r"unknown provider 'tpu'; expected one of \['cpu', 'cuda', 'tensorrt'\]"):
        ort_providers("tpu")


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="CUDA EP is installed here")
def test_missing_gpu_provider_names_package_and_available():
    with pytest.raises(ProviderError, match=r"provider 'cuda' needs onnxruntime-gpu .*available: \["):
        OrtSessionFactory("cuda")


@pytest.mark.gpu
def test_cuda_provider_when_present(tmp_path):
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("no CUDAExecutionProvider (needs onnxruntime-gpu and a CUDA GPU)")
    fake_decoder.build(tmp_path / "d.onnx", layers=1)
    assert make_session(tmp_path / "d.onnx", "cuda").get_providers()[0] == "CUDAExecutionProvider"


def test_bad_threads_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="threads must be a positive int"):
        make_session(tmp_path / "x.onnx", "cpu", threads=0)
    with pytest.raises(FileNotFoundError, match="graph file not found"):
        make_session(tmp_path / "x.onnx", "cpu")
    (tmp_path / "bad.onnx").write_bytes(b"garbage")
    with pytest.raises(RuntimeError, match=r"cannot load graph bad\.onnx on provider 'cpu'"):
        make_session(tmp_path / "bad.onnx", "cpu")
