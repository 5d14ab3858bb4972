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


def _thread_policies() -> dict[int, int]:
    """{thread id: scheduling policy} of this process's threads."""
    import os

    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            out[int(tid)] = os.sched_getscheduler(int(tid))
        except OSError:  # the thread ended meanwhile
            pass
    return out


@pytest.mark.skipif(not hasattr(__import__("os"), "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_a_low_priority_session_runs_its_threads_at_sched_idle_and_leaves_the_caller(tmp_path):
    """make_session(low_priority=True): the session's intra-op threads (started with it) run under SCHED_IDLE, the
    caller's thread keeps its policy; the session still answers."""
    import os

    fake_decoder.build(tmp_path / "d.onnx", layers=1)
    mine = os.sched_getscheduler(0)
    if mine == os.SCHED_IDLE:
        pytest.skip("this process runs under SCHED_IDLE already: the session's threads could not differ")
    before = set(_thread_policies())
    sess = make_session(tmp_path / "d.onnx", "cpu", threads=3, low_priority=True)
    new = {t: p for t, p in _thread_policies().items() if t not in before}
    assert len(new) >= 2 and set(new.values()) == {os.SCHED_IDLE}  # its pool's two workers (the caller is the third)
    assert os.sched_getscheduler(0) == mine
    feeds = {"inputs_embeds": np.ones((1, 2, 8), np.float32), "attention_mask": np.ones((1, 2), np.int64),
             "position_ids": np.zeros((1, 2), np.int64),
             "past_key_values.0.key": np.zeros((1, 2, 0, 4), np.float32),
             "past_key_values.0.value": np.zeros((1, 2, 0, 4), np.float32)}
    assert sess.run(["logits"], feeds)[0].shape == (1, 1, 11)
