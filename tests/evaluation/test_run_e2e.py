"""coverpruner-eval run on the tiny engine: JSONL (GQA schema) and parquet with embedded images (VQAv2 schema),
budgets full/32/16, methods coverpruner/uniform; outputs, Rel.%, table, plot and resume.

The tiny model's weights are random, so the datasets' answers are made from its own full-budget answers,
generated here directly with Pipeline.generate and the task's prompt written out literally: the all-tokens
row then scores 100 (GQA) and 90 (VQAv2: 3 of 10 human answers agree) and the pruned rows whatever they score.
"""

import json
import string

import pytest
from PIL import Image

from coverpruner.evaluation.cli import main
from tests.evaluation.datasets import png_bytes, write_jsonl, write_parquet

pytestmark = pytest.mark.slow

MAX_NEW = 3
QUESTIONS = ["What color is the car?", "How many dogs are there?", "Where is the cup?", "Is it sunny?"]
SEEDS = [11, 12, 13, 14]
ARGS = ["--budgets", "full,32,16", "--methods", "coverpruner,uniform", "--max-new-tokens", str(MAX_NEW),
        "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def full_answers(eval_pipe):
    import io

    out = []
    for q, seed in zip(QUESTIONS, SEEDS):
        image = Image.open(io.BytesIO(png_bytes(seed))).convert("RGB")
        prompt = q + "\nAnswer the question using a single word or phrase."
        out.append(eval_pipe.generate(image, prompt, budget="full", max_new_tokens=MAX_NEW).text.strip())
    return out


@pytest.fixture(scope="module")
def datasets(full_answers, tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_data")
    gqa = write_jsonl(root / "gqa" / "testdev.jsonl",
                      [{"id": f"g{i}", "question": q, "answer": a} for i, (q, a) in enumerate(zip(QUESTIONS, full_answers))],
                      SEEDS)
    vqa_rows = [{"question_id": 500 + i, "question": q,
                 "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": k + 1} for k in range(3)]
                 + [{"answer": f"zzz{k}", "answer_confidence": "no", "answer_id": k + 4} for k in range(7)]}
                for i, (q, a) in enumerate(zip(QUESTIONS, full_answers))]
    vqav2 = write_parquet(root / "VQAv2" / "data" / "validation-00000-of-00001.parquet", vqa_rows, SEEDS)
    return {"gqa": gqa, "vqav2": vqav2.parent.parent}


@pytest.fixture(scope="module")
def run_dir(tiny_export, datasets, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval_out")
    assert main(["run", str(tiny_export), "--task", "gqa", "--data", str(datasets["gqa"]), "--out", str(out)] + ARGS) == 0
    assert main(["run", str(tiny_export), "--task", "vqav2", "--data", str(datasets["vqav2"]), "--out", str(out)]
                + ARGS) == 0
    return out


def _metrics(out, task, name):
    return json.loads((out / task / "metrics" / name).read_text())


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_predictions_file(run_dir):
    rows = _lines(run_dir / "gqa" / "predictions.jsonl")
    assert len(rows) == 4 * 5  # 4 samples x (full + 2 budgets x 2 methods)
    keys = {(r["question_id"], str(r["budget"]), r["method"]) for r in rows}
    assert len(keys) == len(rows)
    for r in rows:
        assert set(r) >= {"question_id", "prediction", "answer", "budget", "method", "kept_tokens", "timings"}
        assert r["kept_tokens"] == (144 if r["budget"] == "full" else r["budget"])
        assert r["timings"]["total"] > 0


def test_metrics_per_configuration(run_dir):
    assert _metrics(run_dir, "gqa", "full.json")["metrics"]["exact_match"] == pytest.approx(1.0)
    assert _metrics(run_dir, "vqav2_val", "full.json")["metrics"]["exact_match"] == pytest.approx(0.9)
    # each pruned configuration: GQA exact match recomputed here from the predictions (lower-case, no ASCII
    # punctuation, answer stripped)
    rows = _lines(run_dir / "gqa" / "predictions.jsonl")
    drop = str.maketrans("", "", string.punctuation)
    for budget in (32, 16):
        for method in ("coverpruner", "uniform"):
            mine = [r for r in rows if r["budget"] == budget and r["method"] == method]
            expect = sum(r["prediction"].strip().lower().translate(drop) == r["answer"].lower().translate(drop)
                         for r in mine) / len(mine)
            rec = _metrics(run_dir, "gqa", f"{budget}_{method}.json")
            assert rec["metrics"]["exact_match"] == pytest.approx(expect)
            assert rec["n"] == 4 and rec["mean_kept_tokens"] == budget


def test_table_and_rel(run_dir):
    summary = json.loads((run_dir / "results.json").read_text())
    full = summary["rows"][0]
    assert (full["budget"], full["method"]) == ("full", "full")
    assert full["acc"] == pytest.approx((100.0 + 90.0) / 2)
    assert full["rel"] == pytest.approx(100.0)
    table = (run_dir / "results.md").read_text().splitlines()
    assert table[0].startswith("| Budget | Method | VQAv2 | GQA |")
    for budget, method in [("full", "full"), (32, "coverpruner"), (32, "uniform"), (16, "coverpruner"), (16, "uniform")]:
        name = "full.json" if budget == "full" else f"{budget}_{method}.json"
        vqa = 100 * _metrics(run_dir, "vqav2_val", name)["metrics"]["exact_match"]
        gqa = 100 * _metrics(run_dir, "gqa", name)["metrics"]["exact_match"]
        label = ("all 144", "(no pruning)") if budget == "full" else (str(budget), method)
        line = next(row for row in table if row.startswith(f"| {label[0]} | {label[1]} |"))
        acc = (vqa + gqa) / 2
        assert line == (f"| {label[0]} | {label[1]} | {vqa:.1f} | {gqa:.1f} | {acc:.1f} | "
                        f"{100 * acc / full['acc']:.1f}% |")


def test_plot_holds_the_numbers(run_dir):
    png = Image.open(run_dir / "accuracy_vs_budget.png")
    assert png.size[0] > 600
    data = json.loads(png.text["coverpruner-eval"])
    assert set(data) == {"vqav2_val", "gqa", "Acc."}
    assert data["gqa"]["full"] == pytest.approx(100.0) and data["gqa"]["n"] == 144
    for method in ("coverpruner", "uniform"):
        pts = dict((b, y) for b, y in data["vqav2_val"]["methods"][method])
        for budget in (16, 32):
            assert pts[budget] == pytest.approx(100 * _metrics(run_dir, "vqav2_val", f"{budget}_{method}.json")
                                                ["metrics"]["exact_match"])


def test_rerun_resumes(run_dir, tiny_export, datasets, capsys):
    pred = run_dir / "gqa" / "predictions.jsonl"
    before = pred.read_text()
    assert main(["run", str(tiny_export), "--task", "gqa", "--data", str(datasets["gqa"]), "--out", str(run_dir)]
                + ARGS) == 0
    assert pred.read_text() == before  # nothing regenerated
    # a run killed mid-write: the last two records gone and the one before cut in half
    lines = before.splitlines(keepends=True)
    pred.write_text("".join(lines[:-3]) + lines[-3][: len(lines[-3]) // 2])
    assert main(["run", str(tiny_export), "--task", "gqa", "--data", str(datasets["gqa"]), "--out", str(run_dir)]
                + ARGS) == 0
    after = _lines(pred)
    assert len(after) == 20
    assert {(r["question_id"], str(r["budget"]), r["method"]) for r in after} == \
        {(r["question_id"], str(r["budget"]), r["method"]) for r in _lines_text(before)}
    # greedy: the regenerated answers are the same
    old = {(r["question_id"], str(r["budget"]), r["method"]): r["prediction"] for r in _lines_text(before)}
    assert all(old[(r["question_id"], str(r["budget"]), r["method"])] == r["prediction"] for r in after)


def _lines_text(text):
    return [json.loads(line) for line in text.splitlines()]


def test_resume_with_other_settings_is_refused(run_dir, tiny_export, datasets, capsys):
    args = ["run", str(tiny_export), "--task", "gqa", "--data", str(datasets["gqa"]), "--out", str(run_dir),
            "--max-new-tokens", "5", "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_new_tokens=3" in err[0] and "use another --out" in err[0]


def test_score_command_matches_run_metrics(run_dir, datasets, capsys):
    rows = [r for r in _lines(run_dir / "vqav2_val" / "predictions.jsonl") if r["budget"] == 16
            and r["method"] == "uniform"]
    preds = run_dir / "preds.jsonl"
    preds.write_text("".join(json.dumps({"question_id": r["question_id"], "prediction": r["prediction"]}) + "\n"
                             for r in rows))
    capsys.readouterr()
    assert main(["score", "--task", "vqav2_val", "--data", str(datasets["vqav2"]), "--predictions", str(preds),
                 "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["task"] == "vqav2_val"
    assert printed["metrics"] == _metrics(run_dir, "vqav2_val", "16_uniform.json")["metrics"]


def test_peer_methods_side_by_side(tiny_export, datasets, tmp_path):
    """Issue 26: --methods coverpruner,divprune,dart,cdpruner writes one table and one plot with the four methods
    at two budgets (random weights: the machinery, not accuracy)."""
    methods = ["coverpruner", "divprune", "dart", "cdpruner"]
    assert main(["run", str(tiny_export), "--task", "gqa", "--data", str(datasets["gqa"]), "--out", str(tmp_path),
                 "--budgets", "full,32,16", "--methods", ",".join(methods), "--limit", "2",
                 "--max-new-tokens", str(MAX_NEW), "--threads", "1", "--no-progress"]) == 0
    table = (tmp_path / "results.md").read_text().splitlines()
    for budget in (32, 16):
        for method in methods:
            gqa = 100 * _metrics(tmp_path, "gqa", f"{budget}_{method}.json")["metrics"]["exact_match"]
            line = next(row for row in table if row.startswith(f"| {budget} | {method} |"))
            assert line.split(" | ")[2] == f"{gqa:.1f}"
    data = json.loads(Image.open(tmp_path / "accuracy_vs_budget.png").text["coverpruner-eval"])
    assert set(data["gqa"]["methods"]) == set(methods)
    assert all(sorted(b for b, _ in pts) == [16, 32] for pts in data["gqa"]["methods"].values())


def test_stop_string_ends_decoding(tiny_export, eval_pipe, datasets, tmp_path):
    """Issue 35: --stop ends an answer where the string appears, inside the engine loop: a stop string the first
    sample's answer completes at its 10th token, with --max-new-tokens 200, gives a prediction of 10 tokens that
    stops before the string."""
    import io

    from tests.stops import stop_at

    image = Image.open(io.BytesIO(png_bytes(SEEDS[0]))).convert("RGB")
    want = eval_pipe.generate(image, QUESTIONS[0] + "\nAnswer the question using a single word or phrase.",
                              budget="full", max_new_tokens=14)
    assert want.finish_reason == "length"  # the tiny model's answer runs past the stop
    stop, cut = stop_at(eval_pipe.encoder.decode, want.token_ids, 10)
    assert main(["run", str(tiny_export), "--task", "gqa", "--data", str(datasets["gqa"]), "--out", str(tmp_path),
                 "--limit", "1", "--budgets", "full", "--max-new-tokens", "200", "--stop", stop, "--threads", "1",
                 "--no-progress"]) == 0
    (row,) = _lines(tmp_path / "gqa" / "predictions.jsonl")
    assert (row["prediction"], row["finish_reason"], row["completion_tokens"]) == (cut, "stop", 10)
    assert json.loads((tmp_path / "gqa" / "run.json").read_text())["stop"] == [stop]
