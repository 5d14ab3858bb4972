"""Serving fixtures: the session's tiny engine dir behind a real uvicorn server on 127.0.0.1.

`start_server(config)` runs the app in a thread on a free loopback port and yields its base URL;
`server` is one module-wide server (2 workers, 1 ORT thread per pipeline) and `client` the official
openai client pointed at it; `reference` a Pipeline loaded the same way for the expected answers.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="serving tests need the serve extra (fastapi)")
pytest.importorskip("uvicorn", reason="serving tests need the serve extra (uvicorn)")
pytest.importorskip("openai", reason="serving tests talk through the openai client")

PROMPT = "What is shown in this image?"


@contextlib.contextmanager
def start_server(config):
    """Run create_app(config) under uvicorn in a daemon thread; yield 'http://127.0.0.1:PORT'."""
    from coverpruner.serving import create_app

    with serve_app(create_app(config)) as url:
        yield url


@contextlib.contextmanager
def serve_app(app):
    """Run a built app under uvicorn in a daemon thread on a free loopback port; yield its base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        app.state.server.pool.shutdown()


@pytest.fixture(scope="module")
def server(tiny_export):
    from coverpruner.serving import ServerConfig

    with start_server(ServerConfig(str(tiny_export), workers=2, threads=1, max_queue=64,
                                   model_name="tiny")) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(tiny_export):
    from coverpruner.runtime import Pipeline

    return Pipeline.load(tiny_export, provider="cpu", threads=1)


@pytest.fixture(scope="session")
def demo_png() -> bytes:
    from importlib.resources import files

    return (files("coverpruner") / "assets" / "demo.png").read_bytes()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def user_message(url: str, text: str = PROMPT) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def thinking_switch(engine) -> bool:
    """Whether the engine dir's chat template has Qwen3's thinking switch (it reads ``enable_thinking``; read from
    its manifest.json, not through the server)."""
    return "enable_thinking" in json.loads((Path(engine) / "manifest.json").read_text())["chat_template"]


def thinking_off(engine) -> dict:
    """Request body fields that put a generic test's answer in the content: chat_template_kwargs enable_thinking
    false where the template has the switch (Qwen3.5 thinks by default, and random weights never close the
    thinking: the content would stay empty), nothing elsewhere (a template that reads no such variable refuses
    it)."""
    return {"chat_template_kwargs": {"enable_thinking": False}} if thinking_switch(engine) else {}
