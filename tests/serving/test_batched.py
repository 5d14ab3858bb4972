"""coverpruner-serve --max-batch: concurrent clients share batched decode steps and get the batch-1 answers;
a client that goes away leaves the batch; a dir that cannot batch is refused in one line."""

from __future__ import annotations

import io
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from PIL import Image

from coverpruner.runtime import OptionError, Pipeline
from tests.serving.conftest import PROMPT, data_url, start_server, user_message

pytestmark = pytest.mark.slow

OPTIONS = [dict(budget=b, method=m, max_tokens=t) for b, m, t in
           [(8, "coverpruner", 6), (16, "divprune", 9), ("full", "coverpruner", 7), (12, "uniform", 10)]]


@pytest.fixture(scope="module")
def ort_export(builds):
    return builds.export("tiny", "ort")


def test_concurrent_clients_batched_match_batch_1(ort_export, demo_png):
    from coverpruner.serving import ServerConfig

    reference = Pipeline.load(ort_export, threads=1)
    image = Image.open(io.BytesIO(demo_png))
    want = [reference.generate(image, PROMPT, max_new_tokens=o["max_tokens"],
                               **{k: v for k, v in o.items() if k != "max_tokens"}).text for o in OPTIONS]
    config = ServerConfig(str(ort_export), workers=1, threads=1, max_queue=8, model_name="tiny", max_batch=3,
                          batch_context=256)
    with start_server(config) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        msgs = user_message(data_url(demo_png))

        def ask(i):
            o = OPTIONS[i % len(OPTIONS)]
            extra = {k: v for k, v in o.items() if k != "max_tokens"}
            return i, client.chat.completions.create(model="tiny", messages=msgs, max_tokens=o["max_tokens"],
                                                     extra_body=extra).choices[0].message.content

        with ThreadPoolExecutor(6) as ex:
            answers = list(ex.map(ask, range(12)))
        assert all(text == want[i % len(OPTIONS)] for i, text in answers)
        # a streaming client that goes away leaves the batch; the worker serves the next request
        long = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=200, stream=True,
                                              extra_body={"budget": 8, "ignore_eos": True})
        next(iter(long))
        long.close()
        deadline = time.monotonic() + 20
        while b'"running":0' not in urllib.request.urlopen(f"{url}/health").read().replace(b" ", b"") \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ask(0)[1] == want[0]


def test_max_batch_on_a_standard_form_dir_is_refused(tiny_export):
    from coverpruner.serving import ServerConfig, create_app

    with pytest.raises(OptionError, match="batched decoding needs the ORT-form decoder"):
        create_app(ServerConfig(str(tiny_export), workers=1, threads=1, max_batch=4))


def test_only_a_batched_server_takes_turns_with_its_admissions(ort_export):
    """admission_share applies to a batch of slots (its engine takes turns with the admission); a --max-batch 1
    server keeps its admission side by side at normal priority (no share, no staging session of the decoder)."""
    from coverpruner.serving.app import ServerConfig, ServerState

    for max_batch, share in ((1, None), (2, 0.5)):
        state = ServerState(ServerConfig(str(ort_export), workers=1, threads=1, max_batch=max_batch,
                                         batch_context=256, admission_share=0.5))
        try:
            model = state.pipelines[0].model
            assert model.admission_share == share
            assert (model.staging_session() is not None) == (share is not None)
        finally:
            state.pool.shutdown()
