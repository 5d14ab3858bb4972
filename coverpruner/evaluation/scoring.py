"""Predictions -> lmms-eval metrics for one task, without running a model."""

from __future__ import annotations

from coverpruner.evaluation.data import DataError, Sample
from coverpruner.evaluation.metrics import option_letters
from coverpruner.evaluation.tasks import TaskSpec


def reference(task: TaskSpec, doc: dict):
    """The ground truth as the predictions file shows it: the answer, the option letter (ScienceQA), or
    the list of human answers (VQAv2, TextVQA)."""
    if task.name == "scienceqa_img":
        return option_letters(len(doc["choices"]))[int(doc["answer"])]
    if "answers" in task.columns:
        return [a["answer"] if isinstance(a, dict) else a for a in doc["answers"]]
    return doc["answer"]


def score_samples(task: TaskSpec, samples: list[Sample], predictions: dict) -> dict:
    """predictions: sample key -> answer text. Returns {"metrics", "details", "n", "missing"}.

    Answers are stripped first, as lmms-eval does for every generated answer. Samples without a
    prediction are left out (counted in ``missing``); DataError when none has one.
    """
    records = [task.score(s.doc, str(predictions[s.key]).strip()) for s in samples if s.key in predictions]
    if not records:
        raise DataError(f"no prediction matches a {task.name} sample (keys look like {samples[0].key!r})")
    metrics = task.aggregate(records)
    details = metrics.pop("details", None)
    out = {"metrics": {k: float(v) for k, v in metrics.items()}, "n": len(records),
           "missing": len(samples) - len(records)}
    if details is not None:
        out["details"] = details
    return out
