"""Each task's scorer and aggregation against hand-computed cases (lmms-eval's definitions)."""

import pytest

from coverpruner.evaluation import metrics as m
from coverpruner.evaluation.mcq import infer_option, mcq_letter


def test_pope_metrics():
    gts = ["yes", "yes", "no", "yes", "no"]
    preds = ["Yes", "yes.", "No", "no", "maybe"]  # already stripped, as the harness passes them
    recs = [m.score_pope({"answer": g}, p) for g, p in zip(gts, preds)]
    out = m.aggregate_pope(recs)
    # right: "Yes"/yes and "No"/no -> 2 of 5. "yes." is neither yes nor no, so no TP/FP/FN.
    # TP=1 ("Yes"), FP=0, FN=1 ("no" for yes)
    assert out["pope_accuracy"] == pytest.approx(0.4)
    assert out["pope_precision"] == pytest.approx(1.0)
    assert out["pope_recall"] == pytest.approx(0.5)
    assert out["pope_f1_score"] == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert out["pope_yes_ratio"] == pytest.approx(3 / 5)  # share of "yes" in the ground truth


def test_pope_empty_prediction_and_no_positive_prediction():
    out = m.aggregate_pope([m.score_pope({"answer": "yes"}, ""), m.score_pope({"answer": "no"}, "no")])
    assert out["pope_accuracy"] == 0.5
    assert out["pope_precision"] == 0.0 and out["pope_recall"] == 0.0 and out["pope_f1_score"] == 0.0


@pytest.mark.parametrize("pred, label", [("Yes", "yes"), ("No.", "no"), ("y", "yes"), ("n", "no"), ("x", "other"),
                                         ("Yes, there is", "yes"), ("Nope", "no"), ("Not sure", "no"),
                                         ("I think yes", "other"), ("", "other")])
def test_mme_answer_labels(pred, label):
    assert m.mme_label(pred) == label


def test_mme_scores_acc_plus_acc_plus_per_image():
    def doc(img, cat, ans):
        return {"question_id": img, "category": cat, "answer": ans}

    rows = [
        (doc("e/1.png", "existence", "Yes"), "yes"), (doc("e/1.png", "existence", "No"), "no"),      # 100 + 100
        (doc("e/2.png", "existence", "Yes"), "yes"), (doc("e/2.png", "existence", "No"), "yes"),     # 50 + 0
        (doc("c/1.png", "count", "Yes"), "no"), (doc("c/1.png", "count", "No"), "yes"),              # 0
        (doc("k/1.png", "code_reasoning", "Yes"), "Yes."), (doc("k/1.png", "code_reasoning", "No"), "No"),  # 200
    ]
    out = m.aggregate_mme([m.score_mme(d, p) for d, p in rows])
    assert out["mme_perception_score"] == pytest.approx((200 + 50) / 2 + 0)  # existence 125, count 0
    assert out["mme_cognition_score"] == pytest.approx(200)
    assert out["details"]["unpaired_images"] == 0


def test_mme_unpaired_image_gets_no_acc_plus():
    out = m.aggregate_mme([m.score_mme({"question_id": "a", "category": "OCR", "answer": "Yes"}, "yes")])
    assert out["mme_perception_score"] == 100.0 and out["details"]["unpaired_images"] == 1


def _ten(right: str, k: int) -> list[str]:
    return [right] * k + [f"other{i}" for i in range(10 - k)]


@pytest.mark.parametrize("matches, expected", [(0, 0.0), (1, 0.3), (2, 0.6), (3, 0.9), (4, 1.0), (10, 1.0)])
def test_textvqa_ten_human_answers(matches, expected):
    # leave each of the 10 answers out: min(1, matches among the other 9 / 3), averaged.
    # 3 matches: 3 subsets see 2 (2/3), 7 see 3 (1) -> (2 + 7) / 10 = 0.9; 2 matches: (2*1/3 + 8*2/3)/10 = 0.6
    rec = m.score_textvqa({"answers": _ten("two", matches)}, "2")  # "two" and "2" agree after normalization
    assert rec["exact_match"] == pytest.approx(expected)


def test_vqav2_answer_dicts_and_normalization():
    answers = [{"answer": "The dog", "answer_confidence": "yes", "answer_id": i + 1} for i in range(2)]
    answers += [{"answer": f"cat{i}", "answer_confidence": "yes", "answer_id": i + 3} for i in range(8)]
    assert m.score_vqav2({"answers": answers}, "dog.")["exact_match"] == pytest.approx(0.6)
    # the human answers are plain strings in a JSONL: they get distinct ids, the same result
    plain = [a["answer"] for a in answers]
    assert m.score_vqav2({"answers": plain}, "Dog")["exact_match"] == pytest.approx(0.6)
    # VQAv2's scorer keeps "'s" attached (no tokenize step), TextVQA's splits it off: both sides alike
    assert m.score_vqav2({"answers": ["man's"] * 10}, "man's")["exact_match"] == 1.0
    assert m.score_vqav2({"answers": ["yes"] * 10}, "")["exact_match"] == 0.0


def test_vqav2_identical_answer_dicts_leave_out_together():
    # without distinct ids, lmms-eval leaves out every dict equal to the held-out one: 3 equal dicts
    # leave 0 matches among the rest for each of them (acc 0), the 7 others see 3 (acc 1) -> 0.7
    answers = [{"answer": "red"}] * 3 + [{"answer": f"x{i}"} for i in range(7)]
    assert m.score_vqav2({"answers": answers}, "red")["exact_match"] == pytest.approx(0.7)


@pytest.mark.parametrize("pred, gold, score", [("Yes.", "yes", 1.0), ("left", "left", 1.0), ("the dog", "dog", 0.0),
                                               ("Two", "2", 0.0), ("", "no", 0.0), ("black and white", "black and white", 1.0)])
def test_gqa_exact_match(pred, gold, score):
    assert m.score_gqa({"answer": gold}, pred)["exact_match"] == score


@pytest.mark.parametrize("pred, score", [("B", 1.0), ("b", 1.0), ("B. dog", 1.0), ("(B)", 0.0),
                                         ("The answer is B", 0.0), ("C.", 0.0), ("A. cat", 0.0), ("", 0.0)])
def test_scienceqa(pred, score):
    assert m.score_scienceqa({"choices": ["cat", "dog", "cow"], "answer": 1}, pred)["exact_match"] == score


def test_mmbench_option_inference():
    choices = {"A": "cat", "B": "Dog", "C": "red", "D": "blue car"}
    assert infer_option("B", choices) == "B"
    assert infer_option("The correct answer is D because", choices) == "D"
    assert infer_option("It is a dog", choices) == "B"       # unique option text
    assert infer_option("a red cat", choices) == ""          # two option texts: undecided
    assert infer_option("A dog is on the left", choices) == "B"  # "A" is an article here; the text decides
    assert mcq_letter("(C)") == "C"
    assert mcq_letter("I think (B) is right, not A") == "A"  # a letter at the end outranks "(B)"
    assert mcq_letter("nothing here") == ""


def test_mmbench_circular_evaluation():
    def doc(index, answer):
        return {"index": index, "answer": answer, "A": "cat", "B": "dog", "C": "cow", "D": None,
                "category": "animals"}

    recs = [m.score_mmbench(doc(5, "B"), "B"), m.score_mmbench(doc(1_000_005, "C"), "C."),
            m.score_mmbench(doc(2_000_005, "A"), "(A)"),                         # question 5: all 3 copies right
            m.score_mmbench(doc(6, "A"), "A"), m.score_mmbench(doc(1_000_006, "B"), "A")]  # question 6: a copy wrong
    out = m.aggregate_mmbench(recs)
    assert out["gpt_eval_score"] == pytest.approx(50.0)
    assert out["details"]["questions"] == 2
