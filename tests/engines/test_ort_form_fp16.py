"""The fp16 ORT-form decoder (--dtype fp16 --decoder-form ort), the form ONNX Runtime's CUDA provider batches with.

Here (CPU provider; ORT's CPU GroupQueryAttention has a float16 kernel too) it tracks the fp32 ORT-form decoder of
the same checkpoint within fp16 rounding and answers the same greedy tokens, alone and batched. The `gpu` tests run
the same dir on the CUDA provider with the KV cache in device memory (engines/kv_buffers.CudaKV): batched answers
equal batch-1 answers and the CPU provider's, and the device buffers hold what was written. The references are the
fp32 ORT-form dir (itself checked against transformers in tests/export/test_ortform_decoder.py) and the CPU
provider's answers, not the code under test."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

from coverpruner.doctor import NEAR_TIE_NATS, answer_steps, compare_answers
from coverpruner.engines.ort_form_decoder import OrtFormDecoderSession
from coverpruner.runtime import OptionError, Pipeline

from .conftest import requires_gpu

pytestmark = pytest.mark.slow
# fp16 keeps 11 significant bits (unit roundoff 4.9e-4); the decoder's few blocks of sequential rounding (weights,
# every activation and the KV cache in fp16, the reductions in fp32 inside the kernels) reach a few 1e-3 of the
# logit scale: the bound tests/families/qwen2_5_vl/test_fp16.py uses for the standard-form fp16 graphs.
FP16_REL = 5e-3
Q = "What is shown in this image?"
JOBS = [dict(prompt="Describe the image.", budget=16, max_new_tokens=8),
        dict(prompt="What color is the sky?", budget="full", max_new_tokens=5),
        dict(prompt="Is there text?", budget=4, max_new_tokens=3, method="divprune")]


def _decoder(engine_dir, provider="CPUExecutionProvider", device="cpu"):
    m = json.loads((engine_dir / "manifest.json").read_text())
    d, spec = m["dims"], m["graphs"]["decoder"]
    session = ort.InferenceSession(str(engine_dir / spec["file"]), providers=[provider])
    return OrtFormDecoderSession(session, d["num_layers"], d["num_kv_heads"], d["head_dim"], d["vocab_size"],
                                 spec["rotary"], device)


def _run(decoder, embeds: np.ndarray, steps: int) -> np.ndarray:
    """Prefill embeds [1, S, d], then `steps` one-token calls on the prefix's own rows -> logits [1 + steps, V]."""
    decoder.reset(64)
    s = embeds.shape[1]
    out = [decoder.forward(embeds, np.arange(s)[None])]
    out += [decoder.forward(embeds[:, t:t + 1], np.array([[s + t]])) for t in range(steps)]
    return np.stack(out).astype(np.float32)


def test_fp16_decoder_tracks_the_fp32_decoder_within_fp16_rounding(builds, ort_fp16_export):
    d16, d32 = _decoder(ort_fp16_export), _decoder(builds.export("tiny", "ort"))
    assert d16.dtype == np.float16 and d32.dtype == np.float32
    hidden = json.loads((ort_fp16_export / "manifest.json").read_text())["dims"]["hidden_size"]
    embeds = np.random.default_rng(0).standard_normal((1, 24, hidden)).astype(np.float32) * 0.5
    a, b = _run(d16, embeds.astype(np.float16), 6), _run(d32, embeds, 6)
    assert np.abs(a - b).max() <= FP16_REL * np.abs(b).max()
    np.testing.assert_array_equal(a.argmax(-1), b.argmax(-1))
    snap = d16.snapshot()  # the fp16 cache's prefix comes back in fp16 and restores into the same answer
    assert snap.length == 30 and snap.keys[0].dtype == np.float16
    d16.reset(64)
    d16.restore(snap)
    nxt = embeds[:, :1].astype(np.float16)
    again = d16.forward(nxt, np.array([[30]]))
    d16.reset(64)
    _run(d16, embeds.astype(np.float16), 6)
    np.testing.assert_array_equal(again, d16.forward(nxt, np.array([[30]])))


def test_fp16_pipeline_answers_the_fp32_tokens_alone_and_batched(builds, ort_fp16_export, demo_image):
    p16 = Pipeline.load(ort_fp16_export, threads=1)
    p32 = Pipeline.load(builds.export("tiny", "ort"), threads=1)
    assert p16.decoder_form == "ort" and p16.decoder.dtype == np.float16
    jobs = [dict(image=demo_image, **j) for j in JOBS]
    alone = [p16.generate(**j) for j in jobs]
    for got, job in zip(alone, jobs):
        want = p32.generate(**job)
        assert got.token_ids == want.token_ids
        assert got.kept_indices.tolist() == want.kept_indices.tolist()
    batched = p16.batch_generate(jobs, max_batch=2, capacity=256)  # 3 requests over 2 slots: one joins later
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]


def test_fp32_ort_form_is_refused_on_cuda_in_one_line(builds):
    with pytest.raises(OptionError, match="fp16 only.*--dtype fp16 --decoder-form ort") as err:
        Pipeline.load(builds.export("tiny", "ort"), provider="cuda")
    assert "\n" not in str(err.value)


def _cuda_provider_problem() -> str | None:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"CUDAExecutionProvider not available (needs onnxruntime-gpu; have {ort.get_available_providers()})"
    return None


requires_ort_cuda = pytest.mark.skipif(_cuda_provider_problem() is not None, reason=str(_cuda_provider_problem()))


@pytest.mark.gpu
@requires_gpu  # libcudart only: no onnxruntime-gpu needed
def test_cuda_kv_buffers_hold_what_was_written():
    from coverpruner.engines.kv_buffers import CudaKV, HostKV

    rng = np.random.default_rng(1)
    args = (3, 40, 2, 2, 16, np.dtype(np.float16))
    dev, host = CudaKV(*args), HostKV(*args)
    for slot, n in ((0, 7), (2, 40)):
        keys = tuple(rng.standard_normal((1, 2, n, 16)).astype(np.float16) for _ in range(2))
        values = tuple(rng.standard_normal((1, 2, n, 16)).astype(np.float16) for _ in range(2))
        for kv in (dev, host):
            kv.write(slot, keys, values)
        got = dev.read(slot, n)
        for a, b in zip((*got[0], *got[1]), (*keys, *values)):
            np.testing.assert_array_equal(a, b)
    for kv in (dev, host):
        kv.copy_slot(2, 1, 33)
    for a, b in zip(dev.read(1, 33), host.read(1, 33)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


@pytest.mark.gpu
@requires_gpu
@requires_ort_cuda
def test_cuda_provider_batched_answers_equal_batch_1_and_the_cpu_tokens(ort_fp16_export, demo_image):
    gpu = Pipeline.load(ort_fp16_export, provider="cuda")
    cpu = Pipeline.load(ort_fp16_export, threads=1)
    assert gpu.decoder.device == "cuda"
    jobs = [dict(image=demo_image, **j) for j in JOBS]
    # greedy tokens may flip only at a near-tie of the reference (fp16 on another device, or another batch shape):
    # doctor.compare_answers accepts those within NEAR_TIE_NATS["fp16"] and reports the margin
    alone = answer_steps(gpu, jobs)
    flips = [compare_answers(a, b, NEAR_TIE_NATS["fp16"], f"job {i}: batched vs alone")
             for i, (a, b) in enumerate(zip(alone, answer_steps(gpu, jobs, max_batch=2, capacity=256)))]
    flips += [compare_answers(c, g, NEAR_TIE_NATS["fp16"], f"job {i}: CUDA vs CPU provider")
              for i, (c, g) in enumerate(zip(answer_steps(cpu, jobs), alone))]
    print("near-ties:", [f for f in flips if f] or "none")
    again = gpu.generate(**jobs[0])  # the prefix cache restores the device KV from its host snapshot
    assert again.token_ids == [x.token for x in alone[0]]
