"""Run one benchmark on an engine dir for several budgets and methods; resumable.

Layout of the output folder (one folder can collect several tasks):

    OUT/<task>/predictions.jsonl          one line per (sample, budget, method); appended as answers come
    OUT/<task>/run.json                   engine, data and generation settings (a resume must match them)
    OUT/<task>/metrics/<budget>_<method>.json   lmms-eval's metrics for that configuration ("full.json")
    OUT/results.md, OUT/results.json, OUT/accuracy_vs_budget.png   all tasks (coverpruner.evaluation.report)
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from coverpruner.evaluation.data import DataError, ImageTable, Sample, find_gqa_images, load_samples, open_image
from coverpruner.evaluation.files import JsonlAppender, read_jsonl, write_json
from coverpruner.evaluation.scoring import reference, score_samples
from coverpruner.evaluation.tasks import TaskSpec
from coverpruner.runtime import METHODS, GenerationResult, OptionError, PromptError
from coverpruner.runtime.options import MAX_BUDGET, GenerationOptions

FULL = "full"


def parse_budgets(text: str) -> list:
    """"full,128,64" -> ["full", 128, 64] (order kept, duplicates dropped); OptionError on anything else."""
    out = []
    for item in (p.strip().lower() for p in text.split(",")):
        if item == FULL:
            value = FULL
        else:
            try:
                value = int(item)
            except ValueError:
                value = 0
            if not 1 <= value <= MAX_BUDGET:
                raise OptionError(f"--budgets: expected 'full' or integers in 1..{MAX_BUDGET}, got {item!r}")
        if value not in out:
            out.append(value)
    return out


def parse_methods(text: str) -> list[str]:
    out = [m.strip() for m in text.split(",") if m.strip()]
    for method in out:
        if method not in METHODS:
            raise OptionError(f"--methods: unknown method {method!r}; expected some of {list(METHODS)}")
    return list(dict.fromkeys(out))


def configurations(budgets: list, methods: list[str]) -> list[tuple]:
    """(budget, method) pairs to run; budget "full" runs once, as method "full" (nothing is pruned)."""
    return [(FULL, FULL)] * (FULL in budgets) + [(b, m) for b in budgets if b != FULL for m in methods]


def metrics_name(budget, method) -> str:
    return "full.json" if budget == FULL else f"{budget}_{method}.json"


@dataclass
class RunSettings:
    engine: Path
    data: Path
    out: Path
    budgets: list
    methods: list
    limit: int | None = None
    max_new_tokens: int | None = None  # None: the task's default
    images: Path | None = None  # GQA images table
    tau: float | None = None
    progress: bool = True
    max_images: int | None = None  # images per sample (None: the engine's defaults.max_images)
    stop: tuple | None = None  # stop strings (GenerationOptions.stop); None: none


class Runner:
    """Generates the missing answers of one task and writes its predictions and metrics.

    pipeline: a loaded ``coverpruner.runtime.Pipeline``: ``generate`` answers a one-image task, ``chat`` a
    multi-image one (all the sample's images in one user message, in the order lmms-eval gives them).
    """

    def __init__(self, pipeline, task: TaskSpec, settings: RunSettings, warn=None):
        self.pipe, self.task, self.s = pipeline, task, settings
        self.dir = Path(settings.out) / task.name
        self.warn = warn or (lambda line: print(line, file=sys.stderr))
        self.problems: list[str] = []

    # -- resume bookkeeping ------------------------------------------------------------------------
    def _check_run_file(self, max_new_tokens: int) -> None:
        """run.json pins what the predictions came from; a resume with other settings would mix them."""
        settings = {"task": self.task.name, "engine": str(Path(self.s.engine).resolve()),
                    "max_new_tokens": max_new_tokens, "tau": self.s.tau, "greedy": True}
        if self.s.stop:  # recorded only when given: run files written before stop strings existed stay valid
            settings["stop"] = list(self.s.stop)
        path = self.dir / "run.json"
        if path.exists():
            try:
                old = json.loads(path.read_text())
            except ValueError:
                raise DataError(f"{path}: not valid JSON; remove it or use another --out") from None
            for key in [*settings, *(["stop"] if "stop" in old and "stop" not in settings else [])]:
                value = settings.get(key)
                if old.get(key) != value:
                    raise OptionError(f"{path}: these predictions were made with {key}={old.get(key)!r}, "
                                      f"not {value!r}; use another --out")
        else:
            write_json(path, settings)

    def _image(self, sample: Sample, gqa_images):
        if gqa_images is not None:
            cell = gqa_images.cells.get(str(sample.image))
            if cell is None:
                raise ValueError(f"{sample.where}: column 'imageId': {sample.image!r} is not in {gqa_images.path}")
            return open_image(cell[0], cell[1], sample.where)
        return open_image(sample.image, sample.base, sample.where)

    def _ask(self, sample: Sample, gqa_images):
        """The sample's images read (ValueError naming file, row and column when one is missing or unreadable)
        -> a function of the GenerationOptions that answers it."""
        if self.task.content is None:
            image, prompt = self._image(sample, gqa_images), self.task.prompt(sample.doc)
            return lambda options: self.pipe.generate(image, prompt, options=options)
        parts = []
        for part in self.task.content(sample.doc):
            if part["type"] != "image":
                parts.append(part)
                continue
            column = part["column"]
            cell = sample.images.get(column)
            if cell is None:
                raise ValueError(f"{sample.where}: column {column!r}: the question shows <{column.replace('_', ' ')}> "
                                 "but the row has no image there")
            parts.append({"type": "image", "image": open_image(cell, sample.base, sample.where, column)})
        messages = [{"role": "user", "content": parts}]
        return lambda options: self.pipe.chat(messages, options=options)

    def _gqa_images(self, samples):
        if not samples[0].by_id:
            return None
        path = self.s.images or find_gqa_images(self.s.data)
        if path is None:
            raise OptionError("gqa: the instructions name images by imageId; give the testdev_balanced_images "
                              "parquet with --images")
        return ImageTable(path)

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> list[dict]:
        """Generate what is missing, then score every configuration; returns the metrics records."""
        max_new = self.s.max_new_tokens or self.task.max_new_tokens
        samples, problems = load_samples(self.task, self.s.data, need_image=True, limit=self.s.limit)
        for line in problems:
            self._report(line)
        self._check_run_file(max_new)
        configs = configurations(self.s.budgets, self.s.methods)
        pred_path = self.dir / "predictions.jsonl"
        done = {(r["question_id"], str(r["budget"]), r["method"]) for r in self._predictions(repair=True)}
        todo = [(s, [c for c in configs if (s.key, str(c[0]), c[1]) not in done]) for s in samples]
        todo = [(s, cs) for s, cs in todo if cs]
        total = sum(len(cs) for _, cs in todo)
        gqa_images = self._gqa_images(samples) if todo else None
        bar = _progress(total, f"{self.task.name}", self.s.progress)
        try:
            with JsonlAppender(pred_path) as out:
                for sample, cs in todo:
                    try:
                        ask = self._ask(sample, gqa_images)
                    except ValueError as exc:
                        self._report(str(exc))
                        bar.update(len(cs))
                        continue
                    for i, (budget, method) in enumerate(cs):
                        try:
                            res = ask(GenerationOptions(budget=budget, method="coverpruner" if method == FULL
                                                        else method, tau=self.s.tau, max_new_tokens=max_new,
                                                        temperature=0.0, max_images=self.s.max_images,
                                                        stop=self.s.stop))
                        except PromptError as exc:  # the prompt does not fit the context, or too many images
                            self._report(f"{sample.where}: {exc}")
                            bar.update(len(cs) - i)
                            break
                        out.append(self._record(sample, budget, method, res))
                        bar.update(1)
        finally:
            bar.close()
        return self.write_metrics(samples, configs)

    def _predictions(self, repair: bool = False) -> list[dict]:
        try:
            return read_jsonl(self.dir / "predictions.jsonl", repair=repair)
        except ValueError as exc:  # a broken line before the last one: not a killed run, a damaged file
            raise DataError(str(exc)) from None

    def _report(self, line: str) -> None:
        self.problems.append(line)
        self.warn(f"coverpruner-eval: skipped: {line}")

    def _record(self, sample: Sample, budget, method: str, res: GenerationResult) -> dict:
        """One predictions line. kept_tokens / num_visual_tokens: over all the sample's images; a multi-image
        task adds ``images``: per image in order, its num_visual_tokens and kept_indices."""
        multi = self.task.content is not None
        record = {"question_id": sample.key, "prediction": res.text, "answer": reference(self.task, sample.doc),
                  "budget": budget, "method": method,
                  "kept_tokens": sum(len(im.kept_indices) for im in res.images) if multi else len(res.kept_indices),
                  "num_visual_tokens": sum(im.num_visual_tokens for im in res.images) if multi
                  else res.num_visual_tokens,
                  "prompt_tokens": res.prompt_tokens, "prefill_tokens": res.prefill_tokens,
                  "finish_reason": res.finish_reason, "completion_tokens": len(res.token_ids),
                  "timings": {k: round(float(v), 6) for k, v in res.timings.items()}}
        if multi:
            record["images"] = [{"num_visual_tokens": int(im.num_visual_tokens),
                                 "kept_indices": [int(i) for i in im.kept_indices]} for im in res.images]
        return record

    def write_metrics(self, samples: list[Sample], configs: list[tuple]) -> list[dict]:
        """Score every configuration from predictions.jsonl; one metrics JSON each (atomic)."""
        records = self._predictions()
        out = []
        for budget, method in configs:
            rows = [r for r in records if str(r["budget"]) == str(budget) and r["method"] == method]
            preds = {r["question_id"]: r["prediction"] for r in rows}
            if not any(s.key in preds for s in samples):
                continue
            scored = score_samples(self.task, samples, preds)
            mine = [r for r in rows if r["question_id"] in {s.key for s in samples}]
            result = {"task": self.task.name, "budget": budget, "method": method, **scored,
                      "skipped": list(self.problems),
                      **_token_counts(mine), "mean_timings_s": _mean_timings(mine)}
            write_json(self.dir / "metrics" / metrics_name(budget, method), result)
            out.append(result)
        return out


def _token_counts(rows: list[dict]) -> dict:
    """num_visual_tokens (the first answer's) and mean_kept_tokens, per image like the budget: a multi-image task's
    lines count per image (``images``); its metrics also give the mean number of images per sample."""
    if "images" not in rows[0]:
        return {"num_visual_tokens": rows[0]["num_visual_tokens"],
                "mean_kept_tokens": sum(r["kept_tokens"] for r in rows) / len(rows)}
    images = [im for r in rows for im in r["images"]]
    return {"num_visual_tokens": images[0]["num_visual_tokens"] if images else 0,
            "mean_kept_tokens": sum(len(im["kept_indices"]) for im in images) / len(images) if images else 0.0,
            "mean_images": len(images) / len(rows)}


def _mean_timings(rows: list[dict]) -> dict:
    keys = rows[0]["timings"].keys()
    return {k: sum(r["timings"][k] for r in rows) / len(rows) for k in keys}


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="answer", disable=not enabled, dynamic_ncols=True)
