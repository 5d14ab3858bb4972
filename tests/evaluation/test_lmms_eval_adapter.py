"""The lmms-eval model adapter against a stand-in of the lmms-eval API it uses.

lmms-eval itself is not installed for the tests: it pulls torch (a CUDA build on a fresh machine),
torchvision, datasets, wandb and ~60 other packages. The stand-in has the three names the adapter touches,
with lmms-eval's signatures: ``lmms_eval.api.model.lmms`` (base class: rank, task_dict), ``ModelManifest``
(entry-point payload) and requests whose ``args`` are ``(context, gen_kwargs, doc_to_visual, doc_id, task,
split)``, as lmms-eval's ``generate_until`` receives them.
"""

import importlib
import io
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from tests.evaluation.datasets import png_bytes

FAKE = {
    "lmms_eval/__init__.py": "",
    "lmms_eval/api/__init__.py": "",
    "lmms_eval/api/model.py": (
        "class lmms:\n"
        "    is_simple = True\n"
        "    def __init__(self):\n"
        "        self._rank = 0\n"
        "        self.task_dict = {}\n"
        "    @property\n"
        "    def rank(self):\n"
        "        return self._rank\n"),
    "lmms_eval/models/__init__.py": "",
    "lmms_eval/models/registry_v2.py": (
        "from dataclasses import dataclass\n"
        "@dataclass(frozen=True)\n"
        "class ModelManifest:\n"
        "    model_id: str\n"
        "    simple_class_path: str = None\n"
        "    chat_class_path: str = None\n"
        "    aliases: tuple = ()\n"),
}


@pytest.fixture
def fake_lmms_eval(tmp_path, monkeypatch):
    for rel, text in FAKE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n == "lmms_eval" or n.startswith("lmms_eval.")]:
        monkeypatch.delitem(sys.modules, name)
    import coverpruner.evaluation.lmms_eval_adapter as adapter

    adapter = importlib.reload(adapter)  # forget a class built against another lmms_eval
    yield adapter
    vars(adapter).pop(adapter.CLASS_NAME, None)  # the class built on the stand-in must not outlive it
    for name in [n for n in sys.modules if n == "lmms_eval" or n.startswith("lmms_eval.")]:
        sys.modules.pop(name, None)


def test_entry_point_is_declared():
    meta = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["lmms_eval.models"]["coverpruner"] == \
        "coverpruner.evaluation.lmms_eval_adapter:manifest"


def test_manifest_names_a_class_of_lmms(fake_lmms_eval):
    manifest = fake_lmms_eval.manifest()
    assert manifest.model_id == "coverpruner"
    module, cls_name = manifest.simple_class_path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), cls_name)
    from lmms_eval.api.model import lmms

    assert issubclass(cls, lmms) and cls.is_simple


def test_request_options():
    from coverpruner.evaluation.lmms_eval_adapter import request_options

    assert request_options({"max_new_tokens": 16, "temperature": 0, "top_p": 1.0, "num_beams": 1,
                            "do_sample": False}) == {"max_new_tokens": 16, "temperature": 0.0, "top_p": 1.0,
                                                     "stop": ()}
    assert request_options({"until": ["ASSISTANT:"]})["max_new_tokens"] == 1024  # lmms-eval llava default
    assert request_options({"until": "\n\n"})["stop"] == ("\n\n",)


@pytest.mark.slow
def test_generate_until_answers_like_the_pipeline(fake_lmms_eval, tiny_export, eval_pipe):
    cls = fake_lmms_eval.CoverPrunerLMM
    model = cls(engine=str(tiny_export), budget="16", method="uniform", threads="1")
    images = {i: Image.open(io.BytesIO(png_bytes(20 + i))).convert("RGB") for i in range(2)}
    docs = [{"image": images[0], "q": "Is there a dog?"}, {"image": images[1], "q": "What color?"}]
    model.task_dict = {"toy": {"test": docs}}
    requests = [SimpleNamespace(args=(f"<image>\n{d['q']}", {"max_new_tokens": 3, "temperature": 0},
                                      lambda doc: [doc["image"]], i, "toy", "test")) for i, d in enumerate(docs)]
    answers = model.generate_until(requests)
    expect = [eval_pipe.generate(d["image"], d["q"], budget=16, method="uniform", max_new_tokens=3).text
              for d in docs]
    assert answers == expect
    # the task's until strings end decoding where they appear (issue 35: stop strings inside the engine loop)
    from tests.stops import stop_at

    full = eval_pipe.generate(docs[0]["image"], docs[0]["q"], budget=16, method="uniform", max_new_tokens=14)
    stop, cut = stop_at(eval_pipe.encoder.decode, full.token_ids, 10)
    (request,) = requests[:1]
    request.args = (request.args[0], {"max_new_tokens": 200, "until": [stop]}, *request.args[2:])
    assert model.generate_until([request]) == [cut]
    with pytest.raises(Exception, match="engine"):
        cls(engine=None)


@pytest.mark.slow
def test_generate_until_sends_every_image(fake_lmms_eval, tiny_export, eval_pipe):
    """A request with two visuals: both, in doc_to_visual's order, then the text, as one user message."""
    model = fake_lmms_eval.CoverPrunerLMM(engine=str(tiny_export), budget="16", threads="1", max_images="2")
    pair = [Image.open(io.BytesIO(png_bytes(30 + i))).convert("RGB") for i in range(2)]
    model.task_dict = {"toy": {"test": [{"images": pair}]}}
    request = SimpleNamespace(args=("<image> <image>\nWhich is brighter?", {"max_new_tokens": 3},
                                    lambda doc: doc["images"], 0, "toy", "test"))
    [answer] = model.generate_until([request])
    messages = [{"role": "user", "content": [{"type": "image", "image": pair[0]}, {"type": "image", "image": pair[1]},
                                             {"type": "text", "text": "Which is brighter?"}]}]
    assert answer == eval_pipe.chat(messages, budget=16, max_new_tokens=3).text
    model.task_dict = {"toy": {"test": [{"images": pair + pair[:1]}]}}
    with pytest.raises(Exception, match="max_images"):  # three images, max_images=2
        model.generate_until([request])


def test_real_lmms_eval_finds_the_model():
    """With lmms-eval installed next to this package (pip install 'coverpruner[lmms-eval]'), its registry
    resolves --model coverpruner through the entry point."""
    pytest.importorskip("lmms_eval", reason="lmms-eval is not installed (optional extra lmms-eval)")
    from lmms_eval.api.model import lmms
    from lmms_eval.models import get_model

    assert issubclass(get_model("coverpruner"), lmms)
