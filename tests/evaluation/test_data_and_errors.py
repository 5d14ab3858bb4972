"""Loading benchmark files (hub parquet layout, JSONL) and the one-line errors for bad data."""

import json

import pytest

from coverpruner.evaluation.cli import main
from coverpruner.evaluation.data import DataError, load_samples
from coverpruner.evaluation.tasks import get_task
from tests.evaluation.datasets import pope_rows, write_jsonl, write_parquet


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("coverpruner-eval: error: ")
    return err[0]


def _preds(path, items):
    path.write_text("".join(json.dumps({"question_id": k, "prediction": v}) + "\n" for k, v in items))
    return path


def test_hub_layout_folder_picks_the_split(tmp_path):
    rows = pope_rows(3)
    write_parquet(tmp_path / "Full" / "adversarial-00000-of-00001.parquet", rows, [1, 2, 3])
    write_parquet(tmp_path / "Full" / "popular-00000-of-00001.parquet", pope_rows(5), [1, 2, 3, 4, 5])
    samples, problems = load_samples(get_task("pope_adv"), tmp_path)
    assert [s.key for s in samples] == ["1000", "1001", "1002"] and problems == []
    assert samples[0].image["bytes"][:4] == b"\x89PNG"
    assert samples[0].doc["question"] == rows[0]["question"]
    with pytest.raises(DataError, match="no file of split 'random'"):
        load_samples(get_task("pope_random"), tmp_path)


def test_datasets_cache_arrow_files(tmp_path):
    import pyarrow as pa

    table = pa.Table.from_pylist(pope_rows(3))
    for split in ("test", "train"):
        with pa.ipc.new_stream(str(tmp_path / f"pope-{split}.arrow"), table.schema) as writer:
            writer.write_table(table if split == "test" else table.slice(0, 1))
    samples, _ = load_samples(get_task("pope"), tmp_path, need_image=False)
    assert [s.key for s in samples] == ["1000", "1001", "1002"]


def test_mme_rows_sharing_an_image_get_distinct_keys(tmp_path):
    rows = [{"question_id": "count/1.png", "question": q, "answer": a, "category": "count"}
            for q, a in [("Two? Please answer yes or no.", "Yes"), ("Three? Please answer yes or no.", "No")]]
    path = write_parquet(tmp_path / "test-00000-of-00001.parquet", rows, [1, 1])
    samples, _ = load_samples(get_task("mme"), path)
    assert [s.key for s in samples] == ["count/1.png#0", "count/1.png#1"]
    assert get_task("mme").prompt(samples[0].doc) == "Two?\nAnswer the question using a single word or phrase."


def test_missing_data_file(tmp_path, capsys):
    assert main(["score", "--task", "pope", "--data", str(tmp_path / "nope.jsonl"),
                 "--predictions", str(tmp_path / "p.jsonl")]) == 2
    assert str(tmp_path / "nope.jsonl") in _one_error_line(capsys)


def test_not_a_parquet_file(tmp_path, capsys):
    bad = tmp_path / "test-00000-of-00001.parquet"
    bad.write_bytes(b"this is not parquet")
    assert main(["score", "--task", "pope", "--data", str(bad), "--predictions", str(tmp_path / "p.jsonl")]) == 2
    line = _one_error_line(capsys)
    assert str(bad) in line and "not a readable parquet file" in line


def test_missing_column(tmp_path, capsys):
    rows = [{k: v for k, v in r.items() if k != "question"} for r in pope_rows(2)]
    path = write_parquet(tmp_path / "test-00000-of-00001.parquet", rows, [1, 2])
    assert main(["score", "--task", "pope", "--data", str(path), "--predictions", str(tmp_path / "p.jsonl")]) == 2
    line = _one_error_line(capsys)
    assert str(path) in line and "missing column 'question'" in line


def test_jsonl_missing_field_in_first_row(tmp_path, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question_id": 1, "question": "q"}], [1])
    assert main(["score", "--task", "pope", "--data", str(path), "--predictions", str(tmp_path / "p.jsonl")]) == 2
    line = _one_error_line(capsys)
    assert f"{path} row 0" in line and "missing column 'answer'" in line


def test_bad_rows_in_the_middle_are_reported_and_skipped(tmp_path, capsys):
    rows = pope_rows(4)
    rows[1]["answer"] = None
    path = write_jsonl(tmp_path / "d.jsonl", rows, [1, 2, 3, 4])
    lines = path.read_text().splitlines()
    lines.insert(3, "{not json")
    path.write_text("\n".join(lines) + "\n")
    preds = _preds(tmp_path / "p.jsonl", [("1000", "yes"), ("1002", "no"), ("1003", "no")])
    assert main(["score", "--task", "pope", "--data", str(path), "--predictions", str(preds), "--json"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert any(f"{path} row 1: column 'answer' is null" in e for e in err)
    assert any(f"{path} row 3: not a JSON object" in e for e in err)
    result = json.loads(cap.out)
    # the three good rows are scored: yes/yes right, no/yes(1002 is "yes") wrong, no/no right
    assert result["n"] == 3 and result["metrics"]["pope_accuracy"] == pytest.approx(2 / 3)


def test_predictions_without_question_id(tmp_path, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", pope_rows(2), [1, 2])
    preds = tmp_path / "p.jsonl"
    preds.write_text(json.dumps({"prediction": "yes"}) + "\n")
    assert main(["score", "--task", "pope", "--data", str(path), "--predictions", str(preds)]) == 2
    assert "needs fields 'question_id' and 'prediction'" in _one_error_line(capsys)


def test_scienceqa_rows_are_named_by_position_and_prompted_like_lmms_eval(tmp_path):
    rows = [{"question": "Which is a mammal?", "choices": ["frog", "dog"], "answer": 1, "hint": ""},
            {"question": "Which is hot?", "choices": ["ice", "fire", "snow"], "answer": 1, "hint": "Look."}]
    path = write_parquet(tmp_path / "ScienceQA-IMG" / "test-00000-of-00001.parquet", rows, [1, 2])
    samples, _ = load_samples(get_task("scienceqa_img"), tmp_path)
    assert [s.key for s in samples] == ["0", "1"]
    task = get_task("scienceqa_img")
    assert task.prompt(samples[0].doc) == ("Which is a mammal?\nA. frog\nB. dog\n"
                                           "Answer with the option's letter from the given choices directly.")
    assert task.prompt(samples[1].doc).startswith("Context: Look.\nWhich is hot?\nA. ice\nB. fire\nC. snow\n")


def test_mmbench_and_textvqa_prompts():
    mmb = get_task("mmbench_en")
    doc = {"question": "What is it?", "hint": None, "A": "cat", "B": "dog", "C": None, "D": "nan"}
    assert mmb.prompt(doc) == ("What is it? There are several options:\nA. cat\nB. dog\n\n"
                               "Answer with the option's letter from the given choices directly.")
    assert mmb.prompt({**doc, "hint": "A pet."}).startswith("A pet. What is it? There are")
    # the CN template keeps a "nan" hint (it only tests for a missing one) and asks in Chinese
    assert get_task("mmbench_cn").prompt({**doc, "hint": "nan"}) == (
        "nan What is it? There are several options:\nA. cat\nB. dog\n\n请直接使用所提供的选项字母作为答案回答。")
    # str.capitalize: first letter up, the rest down (as lmms-eval's textvqa_doc_to_text)
    assert get_task("textvqa").prompt({"question": "what does the SIGN say?"}).startswith("What does the sign say?\n")
    assert get_task("textvqa_val_ocr").prompt({"question": "what?", "ocr_tokens": ["STOP", "5"]}) == (
        "What?\nReference OCR token: STOP, 5\nAnswer the question using a single word or phrase.")


@pytest.mark.slow
def test_unreadable_image_is_reported_and_skipped(tiny_export, tmp_path, capsys):
    rows = [{"id": f"g{i}", "question": "What?", "answer": "x"} for i in range(3)]
    path = write_jsonl(tmp_path / "d.jsonl", rows, [1, 2, 3])
    (tmp_path / "images" / "2.png").write_bytes(b"broken")
    out = tmp_path / "out"
    code = main(["run", str(tiny_export), "--task", "gqa", "--data", str(path), "--budgets", "full",
                 "--max-new-tokens", "2", "--out", str(out), "--no-progress", "--threads", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{path} row 1: column 'image': cannot read image" in err
    assert "1 rows skipped" in err
    rec = json.loads((out / "gqa" / "metrics" / "full.json").read_text())
    assert rec["n"] == 2 and rec["missing"] == 1 and len(rec["skipped"]) == 1


@pytest.mark.slow
def test_gqa_parquet_with_images_table(tiny_export, tmp_path):
    inst = [{"id": f"q{i}", "imageId": f"n{i % 2}", "question": "What is it?", "answer": "thing",
             "fullAnswer": "It is a thing."} for i in range(3)]
    write_parquet(tmp_path / "testdev_balanced_instructions" / "testdev-00000-of-00001.parquet", inst)
    write_parquet(tmp_path / "testdev_balanced_images" / "testdev-00000-of-00001.parquet",
                  [{"id": "n0"}, {"id": "n1"}], [5, 6])
    out = tmp_path / "out"
    assert main(["run", str(tiny_export), "--task", "gqa", "--data", str(tmp_path), "--budgets", "full",
                 "--max-new-tokens", "2", "--out", str(out), "--no-progress", "--threads", "1"]) == 0
    preds = [json.loads(x) for x in (out / "gqa" / "predictions.jsonl").read_text().splitlines()]
    assert [p["question_id"] for p in preds] == ["q0", "q1", "q2"]
    # q0 and q2 show the same image with the same question: the same answer
    assert preds[0]["prediction"] == preds[2]["prediction"]
