"""Issue 17 items 5 and 8 (eval): duplicate question ids are an error naming file and row (both rows were
scored; in ``score`` a duplicate prediction silently won), and --out is checked before the run (a file as
--out was a NotADirectoryError traceback)."""

from __future__ import annotations

import json
import os

import pytest

from coverpruner.evaluation.cli import main
from tests.evaluation.datasets import write_jsonl

from .conftest import one_line, run_main

ROWS = [{"id": "a", "question": "What color?", "answer": "red"}, {"id": "b", "question": "How many?", "answer": "2"},
        {"id": "a", "question": "Where?", "answer": "left"}]


@pytest.fixture
def dup_data(tmp_path):
    return write_jsonl(tmp_path / "gqa" / "testdev.jsonl", ROWS, [1, 2, 3])


@pytest.mark.slow
def test_run_refuses_duplicate_ids(tiny_export, dup_data, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_main(main, capsys, "run", tiny_export, "--task", "gqa", "--data", dup_data, "--out", out,
                            "--budgets", "8", "--max-new-tokens", "1", "--no-progress")
    assert code == 2
    line = one_line(err)
    # the third row ("row 2": the loader numbers rows from 0 in all its messages)
    assert "duplicate" in line and str(dup_data) in line and "row 2" in line and "'a'" in line
    assert not out.exists() or not any(out.rglob("*.jsonl"))


def test_score_refuses_duplicate_ids_in_data(dup_data, tmp_path, capsys):
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"question_id": k, "prediction": "red"}) + "\n" for k in "ab"))
    code, out, err = run_main(main, capsys, "score", "--task", "gqa", "--data", dup_data, "--predictions", preds)
    assert code == 2 and out == ""
    assert "duplicate" in one_line(err) and "row 2" in err  # the third row: rows count from 0


def test_score_refuses_duplicate_predictions(tmp_path, capsys):
    data = write_jsonl(tmp_path / "gqa" / "testdev.jsonl", ROWS[:2], [1, 2])
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"question_id": k, "prediction": p}) + "\n"
                             for k, p in (("a", "red"), ("b", "2"), ("a", "blue"))))
    code, out, err = run_main(main, capsys, "score", "--task", "gqa", "--data", data, "--predictions", preds)
    assert code == 2 and out == ""
    line = one_line(err)
    assert "duplicate" in line and str(preds) in line and "record 3" in line


def test_run_refuses_a_file_as_out_before_loading(tiny_export, tmp_path, capsys):
    data = write_jsonl(tmp_path / "gqa" / "testdev.jsonl", ROWS[:2], [1, 2])
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    for out in (afile, afile / "sub"):
        code, _, err = run_main(main, capsys, "run", tiny_export, "--task", "gqa", "--data", data, "--out", out,
                                "--budgets", "8", "--no-progress")
        assert code == 2
        assert "--out" in one_line(err) and "afile" in err
    assert afile.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only dirs; needs an unprivileged user")
def test_run_refuses_unwritable_out(tiny_export, tmp_path, capsys):
    data = write_jsonl(tmp_path / "gqa" / "testdev.jsonl", ROWS[:2], [1, 2])
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    code, _, err = run_main(main, capsys, "run", tiny_export, "--task", "gqa", "--data", data, "--out", ro / "out",
                            "--budgets", "8", "--no-progress")
    assert code == 2 and "--out" in one_line(err)
