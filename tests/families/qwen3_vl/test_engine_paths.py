"""Qwen3-VL on the engine paths the family matrix does not cover (issue 27, scope 5): int4 / int8 decoders keep their
DeepStack inputs and the float graphs' kept rows, the selection picture of the 32-px merged grid, and a video_url
through the server answering as Pipeline.chat does (timestamps and all).
"""

from __future__ import annotations

import importlib.util
import shutil

import numpy as np
import onnx
import pytest

pytestmark = pytest.mark.slow
PROMPT = "What is written on the sign next to the red car?"
NEW = 4


@pytest.fixture(scope="module")
def pipe(qwen3_export):
    from coverpruner.runtime.pipeline import Pipeline

    return Pipeline.load(qwen3_export)


@pytest.mark.parametrize("dtype", ["int4", "int8"])
def test_quantized_decoder_keeps_deepstack_inputs_and_kept_rows(qwen3_export, pipe, tmp_path, dtype):
    """The quantized decoder (MatMulNBits, ORT form) still takes one visual_extra.k input per DeepStack level, and
    the pipeline on it keeps the rows the float engine keeps (vision and probe stay float) and answers."""
    from coverpruner.export.quant import QuantOptions, quantize_engine_dir
    from coverpruner.runtime.pipeline import Pipeline
    from tests.families.qwen3_vl.fixtures import sample_image

    d = shutil.copytree(qwen3_export, tmp_path / "engine")
    quantize_engine_dir(d, QuantOptions(dtype=dtype, form="ort", block_size=32))
    model = onnx.load(str(d / "decoder.onnx"), load_external_data=False)
    inputs = {i.name for i in model.graph.input}
    float_inputs = {i.name for i in onnx.load(str(qwen3_export / "decoder.onnx"), load_external_data=False).graph.input}
    extras = sorted(n for n in float_inputs if n.startswith("visual_extra."))
    assert extras == ["visual_extra.0", "visual_extra.1"] and set(extras) <= inputs
    assert sum(n.op_type == "MatMulNBits" for n in model.graph.node) >= 7 * 2  # q k v o gate up down per layer

    image = sample_image(5, (300, 250))
    want = pipe.generate(image, PROMPT, budget=8, max_new_tokens=NEW)
    got = Pipeline.load(d).generate(image, PROMPT, budget=8, max_new_tokens=NEW, ignore_eos=True)
    assert got.kept_indices.tolist() == want.kept_indices.tolist() and len(got.kept_indices) == 8
    assert len(got.token_ids) == NEW


def test_selection_picture_on_the_32px_grid(pipe, tmp_path):
    """300x250 -> smart resize to 288x256 at 32 px per visual token: one 9x8 panel over the whole image."""
    from coverpruner.runtime.visualize import save_selection
    from tests.families.qwen3_vl.fixtures import sample_image

    image = sample_image(5, (300, 250))
    res = pipe.generate(image, PROMPT, budget=16, max_new_tokens=2)
    (panel,) = res.panels
    assert panel.shape == (9, 8) and panel.box == (0.0, 0.0, 250.0, 300.0)
    np.testing.assert_array_equal(panel.cells, np.arange(72))
    out = save_selection(tmp_path / "sel.png", image, res.kept_indices, res.panels)
    from PIL import Image

    with Image.open(out) as drawn:
        assert drawn.size[0] >= 250 and drawn.size[1] >= 300


@pytest.mark.skipif(importlib.util.find_spec("av") is None, reason="the video_url test encodes its clip with PyAV")
@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="serving needs the serve extra (fastapi)")
@pytest.mark.parametrize("budget", ["full", 16])
def test_video_url_answers_as_pipeline_chat(qwen3_export, pipe, budget):
    from tests.serving.test_video import PROMPT as VIDEO_PROMPT
    from tests.serving.test_video import _client, body, encode_video, video_url

    clip = encode_video(frames=8, size=(128, 192))  # 4 fps: fps 2 samples 4 frames = 2 temporal patches of 4 x 6
    app, client = _client(qwen3_export)
    try:
        with client:
            resp = client.post("/v1/chat/completions", json=body(video_url(clip), part_extra={"fps": 2.0},
                                                                   budget=budget, max_tokens=NEW))
    finally:
        app.state.server.pool.shutdown()
    assert resp.status_code == 200, resp.text
    got = resp.json()
    want = pipe.chat([{"role": "user", "content": [{"type": "video", "video": clip, "fps": 2.0},
                                                   {"type": "text", "text": VIDEO_PROMPT}]}],
                     budget=budget, max_new_tokens=NEW)
    assert want.images[0].kind == "video" and want.images[0].num_frames == 4 and want.images[0].num_visual_tokens == 48
    assert got["choices"][0]["message"]["content"] == want.text
    assert got["coverpruner"]["kept_indices"] == [int(i) for i in want.kept_indices]
    assert len(want.kept_indices) == (48 if budget == "full" else 16)


def test_eval_run_scores_the_engines_own_answers(qwen3_export, pipe, tmp_path):
    """coverpruner-eval run on the Qwen3-VL engine (its chat template wraps lmms-eval's GQA prompt): with the answers
    made from the pipeline's own full-budget answers to the prompt written out here, the full row scores 1.0 and
    the budget-8 rows keep 8 tokens."""
    import io
    import json

    from PIL import Image

    from coverpruner.evaluation.cli import main
    from tests.evaluation.datasets import png_bytes, write_jsonl

    questions, seeds, side = ["What color is the car?", "Where is the cup?"], [21, 22], 160
    answers = [pipe.generate(Image.open(io.BytesIO(png_bytes(seed, side))).convert("RGB"),
                             question + "\nAnswer the question using a single word or phrase.", budget="full",
                             max_new_tokens=3).text.strip() for question, seed in zip(questions, seeds)]
    data = write_jsonl(tmp_path / "gqa" / "testdev.jsonl",
                       [{"id": f"g{i}", "question": q, "answer": a} for i, (q, a) in enumerate(zip(questions, answers))],
                       seeds, size=side)
    out = tmp_path / "out"
    assert main(["run", str(qwen3_export), "--task", "gqa", "--data", str(data), "--out", str(out),
                 "--budgets", "full,8", "--methods", "coverpruner", "--max-new-tokens", "3", "--threads", "1",
                 "--no-progress"]) == 0
    preds = [json.loads(line) for line in (out / "gqa" / "predictions.jsonl").read_text().splitlines()]
    full = sorted((r for r in preds if r["budget"] == "full"), key=lambda r: r["question_id"])
    assert [r["prediction"].strip() for r in full] == answers
    assert [r["kept_tokens"] for r in full] == [25, 25]  # 160x160 -> 5 x 5 merged tokens
    assert sorted(r["kept_tokens"] for r in preds if r["budget"] == 8) == [8, 8]
    metrics = json.loads((out / "gqa" / "metrics" / "full.json").read_text())["metrics"]
    assert metrics["exact_match"] == 1.0
