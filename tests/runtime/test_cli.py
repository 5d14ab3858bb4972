"""coverpruner-run: output modes, and each bad input -> one line on stderr and exit code 2."""

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from coverpruner.runtime.cli import main

from .bad_images import bad_images

pytestmark = pytest.mark.slow


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_has_result_and_timings(tiny_export, demo_image, capsys):
    code, out, err = _run(capsys, tiny_export, "--image", demo_image, "--prompt", "What is shown?", "--budget", "16",
                          "--method", "divprune", "--max-new-tokens", "5", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert set(res["timings"]) >= {"vision", "embed", "probe", "select", "prefill", "decode", "total"}
    assert all(v >= 0 for v in res["timings"].values())
    assert res["timings"]["total"] >= res["timings"]["prefill"] + res["timings"]["vision"]
    assert res["kept_tokens"] == 16 and len(res["token_ids"]) == 5 and res["method"] == "divprune"
    assert res["kept_indices"] == sorted(res["kept_indices"]) and "decode_tokens_per_s" in res


@pytest.mark.parametrize("method, flags, options", [("cdpruner", ["--relevance-weight", "0.5"],
                                                    {"relevance_weight": 0.5}),
                                                   ("dart", ["--pivots", "3"], {"pivots": 3})])
def test_method_options_reach_the_selector(tiny_export, demo_image, pipe, capsys, method, flags, options):
    """--relevance-weight / --pivots: the run keeps what Pipeline.generate keeps with the same option, and reports
    the option in the result's options."""
    code, out, err = _run(capsys, tiny_export, "--image", demo_image, "--prompt", "What is shown?", "--budget", "16",
                          "--method", method, *flags, "--max-new-tokens", "1", "--json")
    assert code == 0, err
    res = json.loads(out)
    want = pipe.generate(demo_image, "What is shown?", budget=16, method=method, max_new_tokens=1, **options)
    assert res["kept_indices"] == want.kept_indices.tolist()
    assert {k: res["options"][k] for k in options} == options


def test_plain_and_stream_output_match_and_full_budget(tiny_export, demo_image, capsys):
    args = [tiny_export, "--image", demo_image, "--prompt", "What is shown?", "--max-new-tokens", "6",
            "--budget", "full"]
    code, plain, err = _run(capsys, *args)
    assert code == 0 and "timings ms:" in err and "kept 144/144" in err
    code, streamed, _ = _run(capsys, *args, "--stream")
    assert code == 0 and streamed == plain


def test_save_selection_draws_kept_patches(tiny_export, demo_image, tmp_path, capsys):
    png = tmp_path / "sel.png"
    code, out, err = _run(capsys, tiny_export, "--image", demo_image, "--prompt", "Where is the tree?", "--budget",
                          "12", "--max-new-tokens", "2", "--json", "--save-selection", png)
    assert code == 0, err
    kept = json.loads(out)["kept_indices"]
    pic = np.asarray(Image.open(png).convert("RGB")).astype(float)
    orig = np.asarray(Image.open(demo_image).convert("RGB")).astype(float)
    # Drawn over the original 480x360 image (>= 448 px wide: no rescale). The tiny checkpoint's CLIP steps:
    # shortest edge 360 -> 168 (x 168/360), width 480 -> 224, center crop 168: 28 resized px = 60 original px
    # cut on each side. So the 12 x 12 patch grid covers x 60..420, y 0..360 in 30-px cells.
    assert pic.shape[1:] == orig.shape[1:] and pic.shape[0] > orig.shape[0]  # a caption strip below
    pic = pic[:orig.shape[0]]
    ratio = np.array([[pic[r * 30 + 3:(r + 1) * 30 - 3, 60 + c * 30 + 3:60 + (c + 1) * 30 - 3].sum()
                       / orig[r * 30 + 3:(r + 1) * 30 - 3, 60 + c * 30 + 3:60 + (c + 1) * 30 - 3].sum()
                       for c in range(12)] for r in range(12)]).reshape(-1)
    pruned = np.setdiff1d(np.arange(144), kept)
    np.testing.assert_allclose(ratio[kept], 1.0, atol=0.02)  # kept patches as they are
    np.testing.assert_allclose(ratio[pruned], 0.25, atol=0.02)  # pruned patches dimmed
    outside = pic[:, :57].sum() / orig[:, :57].sum()  # left of the crop: the model never saw it
    assert abs(outside - 0.25) < 0.02


@pytest.mark.parametrize("case", ["missing_dir", "missing_manifest", "unknown_version", "sha_mismatch",
                                  "missing_image", "corrupt_image", "prompt_too_long", "unknown_method",
                                  "unknown_provider", "bad_budget", "bad_relevance_weight", "other_methods_option"])
def test_errors_are_one_line_exit_2(case, engine_copy, demo_image, tmp_path, capsys):
    engine, image, prompt, extra = engine_copy, demo_image, "What is shown?", []
    expect = {
        "missing_dir": "engine directory not found", "missing_manifest": "manifest.json not found",
        "unknown_version": "unknown format_version 99", "sha_mismatch": "decoder.onnx: sha256 mismatch",
        "missing_image": "image not found", "corrupt_image": "cannot read image",
        "prompt_too_long": "the context allows", "unknown_method": "unknown method 'fastv'",
        "unknown_provider": "unknown provider 'npu'", "bad_budget": "budget must be a positive integer or 'full'",
        "bad_relevance_weight": "relevance_weight must be a finite number in [0, 1], got nan",
        "other_methods_option": "option relevance_weight is not taken by method 'dart'",
    }[case]
    if case == "missing_dir":
        engine = tmp_path / "nowhere"
    elif case == "missing_manifest":
        (engine / "manifest.json").unlink()
    elif case == "unknown_version":
        m = json.loads((engine / "manifest.json").read_text())
        m["format_version"] = 99
        (engine / "manifest.json").write_text(json.dumps(m))
    elif case == "sha_mismatch":
        data = bytearray((engine / "decoder.onnx").read_bytes())
        data[-100] ^= 0xFF
        (engine / "decoder.onnx").write_bytes(bytes(data))
    elif case == "missing_image":
        image = tmp_path / "none.jpg"
    elif case == "corrupt_image":
        image = tmp_path / "bad.jpg"
        image.write_bytes(b"\xff\xd8\xff garbage")
    elif case == "prompt_too_long":
        prompt = "red tree " * 600
    elif case == "unknown_method":
        extra = ["--method", "fastv"]
    elif case == "unknown_provider":
        extra = ["--provider", "npu"]
    elif case == "bad_budget":
        extra = ["--budget", "-3"]
    elif case == "bad_relevance_weight":
        extra = ["--method", "cdpruner", "--relevance-weight", "nan"]
    elif case == "other_methods_option":
        extra = ["--method", "dart", "--relevance-weight", "0.5"]
    code, out, err = _run(capsys, engine, "--image", image, "--prompt", prompt, "--max-new-tokens", "2", *extra)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("coverpruner-run: error: ") and expect in lines[0], err
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize("name", sorted(bad_images()))
def test_oversized_and_malformed_images_are_one_line_exit_2(name, tiny_export, tmp_path, capsys):
    """e.g. a PNG claiming 30,000 x 30,000 pixels: one line naming the file and PIL's limit, exit 2."""
    data, expect = bad_images()[name]
    image = tmp_path / f"{name}.png"
    image.write_bytes(data)
    code, out, err = _run(capsys, tiny_export, "--image", image, "--prompt", "What is shown?", "--max-new-tokens", "2")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("coverpruner-run: error: ") and expect in lines[0], err
    assert str(image) in lines[0], err


def test_missing_gpu_provider_is_a_clear_error(tiny_export, demo_image, capsys):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA EP installed; the error path needs a machine without it")
    code, _, err = _run(capsys, tiny_export, "--image", demo_image, "--prompt", "x", "--provider", "cuda")
    assert code == 2 and "provider 'cuda' needs onnxruntime-gpu" in err and "available:" in err


def test_console_entry_point_exit_code(tmp_path):
    out = subprocess.run([sys.executable, "-m", "coverpruner.runtime.cli", str(tmp_path / "x"), "--image", "a.png",
                          "--prompt", "q"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "engine directory not found" in out.stderr
