"""lmms-eval model ``coverpruner``: an engine dir with a visual-token budget, for any lmms-eval image task.

    pip install 'coverpruner[lmms-eval]'
    lmms-eval --model coverpruner --model_args engine=DIR,budget=64,method=coverpruner --tasks pope

Registered through lmms-eval's plugin entry-point group ``lmms_eval.models`` (pyproject.toml), whose payload
is ``manifest()``. The model class is built on first access (PEP 562 module ``__getattr__``) so that lmms-eval
can read the manifest while its model registry is still being set up.

model_args: engine (required), budget (int or "full", default 64), method (default coverpruner), provider
(cpu / cuda / tensorrt), threads, tau, max_images. Each request: every image of ``doc_to_visual`` in its order
and then the task's text (any "<image>" placeholder removed: the engine's chat template places the images),
as one user message through ``Pipeline.chat`` (one image: exactly ``Pipeline.generate``), each image pruned to
``budget`` of its own tokens; greedy unless the task asks for a temperature, ``max_new_tokens`` from the task
(1024 when it sets none, as lmms-eval's llava models), the task's ``until`` strings as the request's stop strings
(decoding ends where one appears; the answer stops before it). Images
first is where lmms-eval's simple ``llava_hf`` model puts them ("<image> <image>\n" before the text) and where
llava-hf's chat template renders a message's images anyway.
"""

from __future__ import annotations

CLASS_NAME = "CoverPrunerLMM"
MODEL_ID = "coverpruner"


def manifest():
    """The entry-point payload: lmms-eval's ModelManifest for ``--model coverpruner``."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id=MODEL_ID, simple_class_path=f"{__name__}.{CLASS_NAME}")


def request_options(gen_kwargs: dict) -> dict:
    """lmms-eval generation kwargs -> Pipeline.chat options (``until`` -> stop strings)."""
    until = gen_kwargs.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    temperature = float(gen_kwargs.get("temperature") or 0.0)
    top_p = gen_kwargs.get("top_p")
    return {"max_new_tokens": int(gen_kwargs.get("max_new_tokens") or 1024), "temperature": temperature,
            "top_p": float(top_p) if temperature > 0 and top_p else 1.0, "stop": tuple(u for u in until if u)}


def _build_class():
    from lmms_eval.api.model import lmms
    from tqdm import tqdm

    from coverpruner.runtime import OptionError, Pipeline

    class CoverPrunerLMM(lmms):
        """lmms-eval model over ``coverpruner.runtime.Pipeline`` (one request at a time)."""

        is_simple = True

        def __init__(self, engine=None, budget=64, method="coverpruner", provider="cpu", threads=None, tau=None,
                     max_images=None, batch_size=1, **unused):
            super().__init__()
            if not engine:
                raise OptionError("model_args needs engine=<engine dir>")
            self.pipe = Pipeline.load(str(engine), provider=str(provider),
                                      threads=int(threads) if threads not in (None, "") else None)
            self.budget = "full" if str(budget).lower() == "full" else int(budget)
            self.method = str(method)
            self.tau = None if tau in (None, "") else float(tau)
            self.max_images = None if max_images in (None, "") else int(max_images)

        def generate_until(self, requests) -> list[str]:
            answers = []
            for req in tqdm(requests, desc="coverpruner", disable=getattr(self, "rank", 0) != 0):
                context, gen_kwargs, doc_to_visual, doc_id, task, split = req.args
                visuals = [v for v in doc_to_visual(self.task_dict[task][split][doc_id]) if v is not None]
                if not visuals:
                    raise OptionError(f"{task} doc {doc_id}: no image; the coverpruner model answers image questions")
                opts = request_options(dict(gen_kwargs))
                prompt = context.replace("<image>", "").strip()
                parts = [{"type": "image", "image": v} for v in visuals] + [{"type": "text", "text": prompt}]
                res = self.pipe.chat([{"role": "user", "content": parts}], budget=self.budget, method=self.method,
                                     tau=self.tau, max_images=self.max_images, **opts)
                answers.append(res.text)
            return answers

        def loglikelihood(self, requests):
            raise NotImplementedError("coverpruner answers generate_until tasks only")

        def generate_until_multi_round(self, requests):
            raise NotImplementedError("coverpruner answers single-round tasks only")

    CoverPrunerLMM.__qualname__ = CoverPrunerLMM.__name__ = CLASS_NAME
    CoverPrunerLMM.__module__ = __name__
    return CoverPrunerLMM


def __getattr__(name):
    if name == CLASS_NAME:
        cls = _build_class()
        globals()[CLASS_NAME] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
