"""Issue 17 items 1 and 6: numeric options are checked once, at the boundary (CLI, Python API): finite, in range,
of the right type. A bad value is one stderr line naming the option and exit code 2, never a wrong answer
with exit 0 (tau NaN made the selector keep token 0 m times) and never a traceback."""

from __future__ import annotations

import math

import pytest

from coverpruner.runtime.cli import main

from .conftest import one_line, run_main

pytestmark = pytest.mark.slow

BAD_TAU = ["nan", "inf", "-inf", "89", "1e9"]


@pytest.mark.parametrize("tau", BAD_TAU)
@pytest.mark.parametrize("selector", ["onnx", "numpy"])
def test_run_refuses_non_finite_or_overflowing_tau(tiny_export, demo_image, capsys, tau, selector):
    """Item 1: the weights exp(tau * minmax(r)) overflow float32 for tau >= 88.7; NaN/Inf make every gain NaN."""
    code, out, err = run_main(main, capsys, tiny_export, "--image", demo_image, "--prompt", "hi", "--budget", "8",
                              f"--tau={tau}", "--selector", selector, "--max-new-tokens", "1", "--json")
    assert code == 2 and out == ""
    assert "tau" in one_line(err)


@pytest.mark.parametrize("tau", [math.nan, math.inf, -math.inf, 89.0, 64.5, -0.5, "0.3", True])
def test_python_api_refuses_bad_tau(tiny_export, demo_image, tau):
    from coverpruner.runtime import OptionError, Pipeline

    pipe = Pipeline.load(tiny_export, provider="cpu", threads=1)
    with pytest.raises(OptionError, match="tau"):
        pipe.stream(str(demo_image), "hi", budget=8, tau=tau, max_new_tokens=1)


@pytest.mark.parametrize("tau", ["0", "64"])
def test_valid_tau_still_selects_distinct_tokens(tiny_export, demo_image, capsys, tau):
    """The bound leaves the useful range alone: tau 0 (uniform weights) and the documented maximum 64 keep 8
    distinct tokens."""
    import json

    code, out, err = run_main(main, capsys, tiny_export, "--image", demo_image, "--prompt", "hi", "--budget", "8",
                              "--tau", tau, "--max-new-tokens", "1", "--json")
    assert code == 0, err
    kept = json.loads(out)["kept_indices"]
    assert len(set(kept)) == 8 == len(kept)


@pytest.mark.parametrize("args, name", [
    (["--seed", "-1", "--temperature", "1"], "seed"),
    (["--seed", "-1", "--method", "random"], "seed"),
    (["--seed", str(2 ** 64)], "seed"),
    (["--budget", "99999999999999999999999"], "budget"),
    (["--budget", "1e3"], "budget"),
    (["--temperature", "nan"], "temperature"),
    (["--temperature", "inf"], "temperature"),
    (["--top-p", "nan"], "top_p"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--max-new-tokens", "99999999999999999999"], "max_new_tokens"),
])
def test_run_refuses_out_of_range_numbers(tiny_export, demo_image, capsys, args, name):
    """Item 6: ValueError / OverflowError tracebacks became one line naming the option and exit 2."""
    code, out, err = run_main(main, capsys, tiny_export, "--image", demo_image, "--prompt", "hi",
                              "--max-new-tokens", "1", *args)
    assert code == 2 and out == ""
    line = one_line(err)
    assert name in line or name.replace("_", "-") in line


def test_eval_refuses_nan_tau_before_writing(tiny_export, tmp_path, capsys):
    """Item 1 (eval): run.json got "tau": NaN; now refused before anything is written."""
    from coverpruner.evaluation.cli import main as eval_main
    from tests.evaluation.datasets import write_jsonl

    data = write_jsonl(tmp_path / "gqa.jsonl", [{"id": "a", "question": "q?", "answer": "x"}], [1])
    out = tmp_path / "out"
    code, _, err = run_main(eval_main, capsys, "run", tiny_export, "--task", "gqa", "--data", data, "--out", out,
                            "--tau", "nan", "--budgets", "8", "--no-progress")
    assert code == 2 and "tau" in one_line(err)
    assert not out.exists() or not any(out.rglob("*.json"))


def test_run_refuses_an_extreme_aspect_ratio_before_decoding(tiny_export, tmp_path, capsys):
    """Item 11 (coverpruner-run): a 140-byte 20,000 x 1 PNG took 8-14 s and 5.5 GB; now one line at once."""
    import time

    from .pngs import png

    path = tmp_path / "thin.png"
    path.write_bytes(png(20_000, 1))
    t0 = time.monotonic()
    code, out, err = run_main(main, capsys, tiny_export, "--image", path, "--prompt", "hi", "--max-new-tokens", "1")
    assert code == 2 and out == "" and time.monotonic() - t0 < 5
    assert "aspect ratio" in one_line(err)
