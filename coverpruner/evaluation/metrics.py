"""Per-sample scoring and aggregation, as lmms-eval's task definitions do it for the same predictions.

Every ``score_*`` takes one document (the dataset row, image left out) and the model's answer **already
stripped** (lmms-eval strips every ``generate_until`` answer before scoring) and returns a per-sample record;
every ``aggregate_*`` turns the records of one (task, budget, method) into lmms-eval's metric dict, same names,
same scale (fractions in [0, 1], MME scores in points, MMBench in percent).
"""

from __future__ import annotations

import string
from collections import defaultdict
from statistics import mean

from coverpruner.evaluation.answer_processing import digits_and_articles, eval_ai_normalize, strip_punctuation
from coverpruner.evaluation.mcq import infer_option, mcq_letter

# -- POPE ------------------------------------------------------------------------------------------------


def score_pope(doc: dict, pred: str) -> dict:
    """Exact match of the lower-cased answer with "yes"/"no": "Yes." is wrong, "Yes" right."""
    pred_l, gt = pred.lower().strip(), str(doc["answer"]).lower().strip()
    return {"score": float(pred_l == gt), "prediction": pred_l, "ground_truth": gt}


def aggregate_pope(records: list[dict]) -> dict:
    """pope_accuracy, pope_precision, pope_recall, pope_f1_score, pope_yes_ratio (fractions).

    As in lmms-eval: only predictions exactly "yes" / "no" count as positives / negatives in precision and
    recall; pope_yes_ratio is the share of "yes" in the **ground truth** (not in the predictions).
    """
    tp = sum(r["ground_truth"] == "yes" and r["prediction"] == "yes" for r in records)
    fp = sum(r["ground_truth"] == "no" and r["prediction"] == "yes" for r in records)
    fn = sum(r["ground_truth"] == "yes" and r["prediction"] == "no" for r in records)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    yes = sum(r["ground_truth"] == "yes" for r in records)
    no = sum(r["ground_truth"] == "no" for r in records)
    return {
        "pope_accuracy": mean(r["score"] for r in records),
        "pope_precision": precision,
        "pope_recall": recall,
        "pope_f1_score": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "pope_yes_ratio": yes / (yes + no) if yes + no else 0.0,
    }


# -- MME -------------------------------------------------------------------------------------------------

MME_PERCEPTION = ("existence", "count", "position", "color", "posters", "celebrity", "scene", "landmark",
                  "artwork", "OCR")
MME_COGNITION = ("commonsense_reasoning", "numerical_calculation", "text_translation", "code_reasoning")


def mme_label(pred: str) -> str:
    """Answer -> "yes" / "no" / "other" (lmms-eval's parse, from Otter): periods dropped; "y"/"n" accepted;
    longer answers are judged by whether "yes" (else "no") occurs in their first four characters."""
    text = pred.lower().strip().replace(".", "")
    if text in ("yes", "no"):
        return text
    if len(text) == 1:
        return {"y": "yes", "n": "no"}.get(text, "other")
    head = text[:4]
    return "yes" if "yes" in head else "no" if "no" in head else "other"


def score_mme(doc: dict, pred: str) -> dict:
    gt = str(doc["answer"]).lower().strip().replace(".", "")
    return {"score": float(mme_label(pred) == gt), "image": str(doc["question_id"]), "category": doc["category"]}


def _mme_category_scores(records: list[dict]) -> tuple[dict, int]:
    """category -> mean over its images of acc + acc+ (0..200 points); and how many images lacked a pair."""
    by_cat: dict = defaultdict(lambda: defaultdict(list))
    for r in records:
        by_cat[r["category"]][r["image"]].append(r["score"])
    scores, unpaired = {}, 0
    for cat, images in by_cat.items():
        total = 0.0
        for s in images.values():
            unpaired += len(s) != 2  # lmms-eval asserts pairs; a --limit run may cut one
            total += 100.0 * sum(s) / len(s) + 100.0 * (len(s) == 2 and sum(s) == 2)
        scores[cat] = total / len(images)
    return scores, unpaired


def aggregate_mme(records: list[dict]) -> dict:
    """mme_perception_score (max 2000) and mme_cognition_score (max 800): per category, each image's two
    questions give acc (% right) + acc+ (100 if both right); the category score is their mean over images,
    the metric the sum over the categories present. Categories not in the perception list count as cognition."""
    scores, unpaired = _mme_category_scores(records)
    out = {"mme_perception_score": sum(v for k, v in scores.items() if k in MME_PERCEPTION),
           "mme_cognition_score": sum(v for k, v in scores.items() if k not in MME_PERCEPTION)}
    out["details"] = {"category_scores": dict(sorted(scores.items())), "unpaired_images": unpaired}
    return out


# -- VQA-style (VQAv2, TextVQA) --------------------------------------------------------------------------


def score_textvqa(doc: dict, pred: str) -> dict:
    """TextVQA: the full EvalAI processor on the answer and on each of the 10 human answers; leave-one-out
    by position."""
    answers = doc.get("answers")
    if answers is None:
        return {"exact_match": 0.0}
    pred_n = eval_ai_normalize(pred)
    gts = [eval_ai_normalize(str(a)) for a in answers]
    return {"exact_match": _agreement(pred_n, [[g for j, g in enumerate(gts) if j != i] for i in range(len(gts))]),
            "normalized": pred_n}


def _agreement(pred: str, others_per_answer: list[list[str]]) -> float:
    """VQA accuracy: for each human answer left out, min(1, matches among the others / 3); their mean.
    With 10 answers: 3 matches -> 0.9, 4+ -> 1.0, 2 -> 0.6, 1 -> 0.3, 0 -> 0."""
    accs = [min(1.0, sum(g == pred for g in others) / 3) for others in others_per_answer]
    return mean(accs) if accs else 0.0


def _vqav2_clean(text: str) -> str:
    text = text.replace("\n", " ").replace("\t", " ").strip()
    return digits_and_articles(strip_punctuation(text))


def score_vqav2(doc: dict, pred: str) -> dict:
    """VQAv2: whitespace cleanup, punctuation, digits/articles on the answer and the human answers (not the
    EvalAI tokenize step: no "'s" split, ',' and '?' go through the punctuation rule); answers given as plain
    strings get distinct ids 1..10."""
    answers = doc.get("answers")
    if answers is None:
        return {"exact_match": 0.0}
    gts = []
    for i, a in enumerate(answers):
        item = dict(a) if isinstance(a, dict) else {"answer": str(a), "answer_id": i + 1}
        item["answer"] = _vqav2_clean(str(item["answer"]))
        gts.append(item)
    pred_n = _vqav2_clean(pred)
    # lmms-eval leaves out every answer dict equal to the held-out one; VQAv2's answer ids make them distinct
    others = [[a["answer"] for a in gts if a != held] for held in gts]
    return {"exact_match": _agreement(pred_n, others), "normalized": pred_n}


def aggregate_exact_match(records: list[dict]) -> dict:
    """exact_match: the mean of the per-sample scores."""
    return {"exact_match": mean(r["exact_match"] for r in records)}


# -- GQA (lmms-eval's generic exact_match with ignore_case / ignore_punctuation) ------------------------

_NO_PUNCT = str.maketrans("", "", string.punctuation)


def score_gqa(doc: dict, pred: str) -> dict:
    """1.0 when answer and reference agree after lower-casing and deleting ASCII punctuation (no other
    normalization: "a dog" != "dog", " dog" != "dog" beyond the initial strip)."""
    return {"exact_match": float(pred.lower().translate(_NO_PUNCT) == str(doc["answer"]).lower().translate(_NO_PUNCT))}


# -- ScienceQA-IMG ---------------------------------------------------------------------------------------


def option_letters(n: int) -> list[str]:
    return [chr(ord("A") + i) for i in range(n)]


def score_scienceqa(doc: dict, pred: str) -> dict:
    """Right when the answer is the letter itself (any case) or starts "X." with X the right upper-case
    letter; "(B)", "B)" or "The answer is B" score 0 (LLaVA's parser, kept by lmms-eval)."""
    target = option_letters(len(doc["choices"]))[int(doc["answer"])].lower()
    if pred.lower() == target:
        return {"exact_match": 1.0}
    if len(pred) >= 2 and pred[0].isupper() and pred[1] == ".":
        return {"exact_match": float(pred[0].lower() == target)}
    return {"exact_match": 0.0}


# -- MMBench (lmms-eval's mmbench_en_dev_static: rule-based, no GPT judge) -------------------------------

MMBENCH_OPTIONS = ("A", "B", "C", "D", "E")


def present(value) -> bool:
    """Neither missing (None / NaN) nor the string "nan" (how MMBench's TSVs spell a missing option)."""
    return value is not None and value == value and value != "nan"


def score_mmbench(doc: dict, pred: str) -> dict:
    # lmms-eval fills a missing option column with "nan" and keeps it; a null (None / NaN) option is dropped
    choices = {c: v for c in "ABCD" if (v := doc.get(c, "nan")) is not None and v == v}
    letter = infer_option(pred, choices)
    return {"index": int(doc["index"]), "answer": str(doc["answer"]), "inferred": letter or "",
            "fallback": "" if letter else mcq_letter(pred, sorted(choices)), "category": doc.get("category")}


def aggregate_mmbench(records: list[dict]) -> dict:
    """gpt_eval_score (percent): circular evaluation. A question (index < 1e6) counts as right only when it
    and all its option-shifted copies (index % 1e6 == question index) are answered right. Each answer's letter
    comes from lmms-eval's exact-letter / unique-option-text rules, else from its MCQ extractor."""
    by_index = {r["index"]: r for r in records}
    groups: dict = defaultdict(list)
    for idx in sorted(by_index):
        groups[idx % 1_000_000].append(by_index[idx])
    hits, cat_hits = [], defaultdict(list)
    for idx in sorted(by_index):
        if idx >= 1_000_000:
            continue
        group = groups[idx]
        hit = int(all((r["inferred"] or r["fallback"]) == r["answer"] for r in group))
        hits.append(hit)
        cat_hits[by_index[idx]["category"]].append(hit)
    return {"gpt_eval_score": 100.0 * mean(hits) if hits else 0.0,
            "details": {"questions": len(hits), "category_acc": {str(k): 100.0 * mean(v)
                                                                 for k, v in sorted(cat_hits.items(), key=str)}}}
