"""Issue 19's acceptance tests: Pipeline.chat, coverpruner-run --messages and the server against the independent
references of reference.py.

The API these tests assume (docs/conversations.md):
    Pipeline.chat(messages, budget=64, method="coverpruner", demand="turn", max_new_tokens=128, tau=None,
                  ignore_eos=False, max_images=None, **family_options) -> ChatResult
    ChatResult: text, token_ids, finish_reason, timings, prompt_tokens, prefill_tokens, cached_tokens,
                images: [ImageResult(num_visual_tokens, kept_indices int64 [m_j], relevance float32 [n_j] | None)]
    coverpruner-run DIR --messages conv.json [--json] [--ignore-eos] [--max-new-tokens N] [--budget B]
    server: POST /v1/chat/completions with any OpenAI message list; usage.prompt_tokens_details.cached_tokens;
            response["coverpruner"]["images"][j] = {"kept_indices", "num_visual_tokens"}
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conversations import reference as R
from tests.conversations.conftest import PRESETS
from tests.conversations.conversations import CONVERSATIONS, data_url, image, two_turns

pytestmark = pytest.mark.slow
STEPS = 8


@pytest.fixture(scope="session")
def conv_export(builds):
    """name -> fp32 engine dir of the family's tiny checkpoint (tests/conftest.py Builds: exported once per run)."""
    return lambda name: builds.export(PRESETS[name])


@pytest.fixture(scope="session")
def conv_pipe(conv_export):
    from coverpruner.runtime import Pipeline

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = Pipeline.load(conv_export(name), prefix_cache_mb=256)
        return cache[name]

    return get


def _same_kept(got, want):
    assert [np.asarray(g.kept_indices).tolist() for g in got.images] == [k.tolist() for k in want.selection.keep]


@pytest.mark.parametrize("demand", ["turn", "latest"])
@pytest.mark.parametrize("budget", ["full", 16])
@pytest.mark.parametrize("fam_name", R.FAMILIES)
def test_two_turns_equal_the_reference(conv_pipe, hf_family, fam_name, budget, demand):
    """[system, user(image A + question), assistant(answer), user(image B + question)]."""
    want = R.chat(hf_family(fam_name), two_turns(), budget=budget, demand=demand, max_new_tokens=STEPS)
    got = conv_pipe(fam_name).chat(two_turns(), budget=budget, demand=demand, max_new_tokens=STEPS)
    assert got.token_ids == want.tokens
    _same_kept(got, want)
    assert got.prefill_tokens == want.rows.size
    for g, rel in zip(got.images, want.selection.relevance):
        if budget != "full":
            # float32 softmax (HF eager) vs the probe graph: relative rounding ~1e-6 of each value
            np.testing.assert_allclose(g.relevance, rel, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("conversation", ["text_only", "three_images"])
@pytest.mark.parametrize("fam_name", R.FAMILIES)
def test_text_only_and_three_images_equal_the_reference(conv_pipe, hf_family, fam_name, conversation):
    messages = CONVERSATIONS[conversation]()
    for budget in ("full", 16):
        want = R.chat(hf_family(fam_name), messages, budget=budget, max_new_tokens=STEPS)
        got = conv_pipe(fam_name).chat(messages, budget=budget, max_new_tokens=STEPS)
        assert got.token_ids == want.tokens
        _same_kept(got, want)
    if conversation == "text_only":
        assert got.images == [] and got.token_ids == R.hf_generate(hf_family(fam_name), messages, STEPS)


@pytest.mark.parametrize("fam_name", R.FAMILIES)
def test_generate_is_chat_with_one_user_message(conv_pipe, fam_name):
    pipe, img = conv_pipe(fam_name), image(0)
    one = pipe.generate(img, "Describe it.", budget=16, max_new_tokens=STEPS)
    chat = pipe.chat([{"role": "user", "content": [{"type": "image", "image": img},
                                                   {"type": "text", "text": "Describe it."}]}],
                     budget=16, max_new_tokens=STEPS)
    assert chat.token_ids == one.token_ids and chat.images[0].kept_indices.tolist() == one.kept_indices.tolist()


@pytest.mark.parametrize("fam_name", R.FAMILIES)
def test_prefix_cache_gives_identical_tokens(conv_pipe, fam_name):
    """Turn 2 after turn 1 reuses the pruned prefix (cached_tokens > 0) and answers exactly as a cold request."""
    pipe = conv_pipe(fam_name)
    pipe.clear_prefix_cache()
    cold = pipe.chat(two_turns(), budget=16, max_new_tokens=STEPS)
    pipe.clear_prefix_cache()
    pipe.chat(two_turns()[:2], budget=16, max_new_tokens=STEPS)
    warm = pipe.chat(two_turns(), budget=16, max_new_tokens=STEPS)
    assert warm.cached_tokens > 0 and cold.cached_tokens == 0
    assert warm.token_ids == cold.token_ids
    assert [g.kept_indices.tolist() for g in warm.images] == [g.kept_indices.tolist() for g in cold.images]


def test_too_many_images_is_one_clear_error(conv_pipe):
    from coverpruner.runtime.errors import PromptError

    messages = [{"role": "user", "content": [{"type": "image", "image": image(k % 3)} for k in range(5)]
                 + [{"type": "text", "text": "Compare."}]}]
    with pytest.raises(PromptError, match=r"5 images.*at most 4"):
        conv_pipe("llava").chat(messages, max_images=4)


def test_run_cli_messages_json(conv_export, hf_family, tmp_path):
    """coverpruner-run DIR --messages conv.json --json: token_ids, text and images[j].kept_indices."""
    paths = []
    for k in range(2):
        paths.append(tmp_path / f"{k}.png")
        image(k).save(paths[-1])
    messages = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(paths[0])}},
                                             {"type": "text", "text": "What is in the first picture?"}]},
                {"role": "assistant", "content": "a red circle"},
                {"role": "user", "content": [{"type": "image", "image": str(paths[1])},
                                             {"type": "text", "text": "And what changed in this one?"}]}]
    (tmp_path / "conv.json").write_text(json.dumps(messages))
    out = subprocess.run([sys.executable, "-m", "coverpruner.runtime.cli", str(conv_export("llava")), "--messages",
                          str(tmp_path / "conv.json"), "--budget", "16", "--max-new-tokens", str(STEPS), "--json",
                          "--ignore-eos"], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    want = R.chat(hf_family("llava"), two_turns(), budget=16, max_new_tokens=STEPS)
    assert len(got["token_ids"]) == STEPS
    assert [img["kept_indices"] for img in got["images"]] == [k.tolist() for k in want.selection.keep]


def test_server_turn_by_turn_with_cache(conv_export, conv_pipe):
    """Through the openai client: turn 1, then turn 2 with the history: Pipeline.chat's answers; turn 2 reports
    cached_tokens > 0 and equals a server started with --prefix-cache-mb 0."""
    import openai

    from coverpruner.serving import ServerConfig
    from tests.serving.conftest import start_server

    def as_openai(messages):
        out = []
        for msg in messages:
            parts = msg["content"]
            if not isinstance(parts, str):
                parts = [p if p["type"] != "image" else
                         {"type": "image_url", "image_url": {"url": data_url(p["image"])}} for p in parts]
            out.append({"role": msg["role"], "content": parts})
        return out

    turns = [two_turns()[:2], two_turns()]
    answers = {}
    for cache_mb in (256, 0):
        with start_server(ServerConfig(str(conv_export("llava")), threads=1, model_name="tiny",
                                       prefix_cache_mb=cache_mb)) as url:
            c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
            answers[cache_mb] = [c.chat.completions.create(model="tiny", messages=as_openai(m), max_tokens=STEPS,
                                                           extra_body={"budget": 16}) for m in turns]
    for k, messages in enumerate(turns):
        want = conv_pipe("llava").chat(messages, budget=16, max_new_tokens=STEPS)
        for cache_mb in (256, 0):
            r = answers[cache_mb][k]
            assert r.choices[0].message.content == want.text
            assert [i["kept_indices"] for i in r.model_extra["coverpruner"]["images"]] == \
                [g.kept_indices.tolist() for g in want.images]
    assert answers[256][1].usage.prompt_tokens_details.cached_tokens > 0
    assert answers[0][1].usage.prompt_tokens_details.cached_tokens == 0


def test_run_cli_messages_picture_and_bad_file(conv_export, tmp_path):
    """--save-selection draws one panel per image; a broken CONV.json is one line on stderr and exit 2."""
    from PIL import Image

    image(0).save(tmp_path / "a.png")
    image(2).save(tmp_path / "b.png")
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "a.png"}},
                                             {"type": "image", "image": "b.png"},
                                             {"type": "text", "text": "Compare them."}]}]
    (tmp_path / "conv.json").write_text(json.dumps(messages))
    cmd = [sys.executable, "-m", "coverpruner.runtime.cli", str(conv_export("llava")), "--budget", "16",
           "--max-new-tokens", "2"]
    subprocess.run(cmd + ["--messages", str(tmp_path / "conv.json"), "--save-selection", str(tmp_path / "sel.png")],
                   capture_output=True, text=True, check=True)
    single = subprocess.run(cmd + ["--image", str(tmp_path / "a.png"), "--prompt", "Compare them.",
                                   "--save-selection", str(tmp_path / "one.png")], capture_output=True, text=True,
                            check=True)
    assert single.returncode == 0
    # two panels side by side: wider than the one-image picture
    assert Image.open(tmp_path / "sel.png").width > Image.open(tmp_path / "one.png").width
    (tmp_path / "bad.json").write_text("{not json")
    for extra in (["--messages", str(tmp_path / "bad.json")],
                  ["--messages", str(tmp_path / "conv.json"), "--image", str(tmp_path / "a.png")]):
        out = subprocess.run(cmd + extra, capture_output=True, text=True)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
