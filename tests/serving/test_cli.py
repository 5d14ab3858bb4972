"""coverpruner-serve: bad arguments are one line on stderr and exit 2; the uvicorn and Ray Serve modes
serve the same answers as Pipeline.generate when started from the command line."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from PIL import Image

from tests.serving.conftest import PROMPT, data_url, user_message

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args,fragment", [
    (["{missing}"], "not an engine dir"),
    (["{engine}", "--workers", "0"], "--workers must be >= 1"),
    (["{engine}", "--port", "70000"], "--port must be in 1..65535"),
    (["{engine}", "--replicas", "2"], "--replicas and --ray-address need --ray"),
    (["{engine}", "--provider", "tpu"], "unknown provider 'tpu'"),
    (["{engine}", "--max-queue", "-1"], "--max-queue must be >= 0"),
    (["{engine}", "--admission-share", "1"], "--admission-share must be in [0, 1), got 1.0"),
    (["{engine}", "--admission-share", "nan"], "--admission-share must be in [0, 1), got nan"),
    (["{engine}", "--budget", "0"], "budget must be a positive integer or 'full', got '0'"),
    (["{engine}", "--method", "magic"], "unknown method 'magic'"),
    (["{engine}", "--workers", "two"], "invalid integer value: 'two'"),
    (["{engine}", "--max-video-bytes", "0"], "--max-video-bytes must be >= 1"),
    (["{engine}", "--max-video-frames", "1"], "--max-video-frames must be >= 2"),
    (["{engine}", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ([], "the following arguments are required: ENGINE_DIR"),
])
def test_bad_arguments_one_line_exit_2(tiny_export, tmp_path, capsys, args, fragment):
    from coverpruner.serving.cli import main

    argv = [a.format(engine=tiny_export, missing=tmp_path / "nope") for a in args]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors exit from parse_args
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("coverpruner-serve: error: ") and fragment in err, err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            return time.monotonic() - t0
        except OSError:
            time.sleep(0.25)
    raise AssertionError(f"server not healthy after {timeout} s")


def _serve(engine, *extra, log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "coverpruner.serving.cli", str(engine), "--port", str(port), "--threads", "1",
           "--model-name", "tiny", "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)
    return proc, f"http://127.0.0.1:{port}"


def _stop(proc: subprocess.Popen, timeout: float = 60) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def _expected(reference, demo_png, budgets):
    image = Image.open(io.BytesIO(demo_png))
    return {b: reference.generate(image, PROMPT, budget=b, max_new_tokens=8).text for b in budgets}


def _answers(url, demo_png, budgets, threads=4):
    c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

    def ask(b):
        return b, c.chat.completions.create(model="tiny", messages=user_message(data_url(demo_png)), max_tokens=8,
                                            extra_body={"budget": b}).choices[0].message.content

    with ThreadPoolExecutor(threads) as ex:
        return list(ex.map(ask, budgets))


@pytest.mark.slow
def test_cli_uvicorn_mode(tiny_export, reference, demo_png, tmp_path):
    budgets = [8, 16, "full", 8]
    want = _expected(reference, demo_png, set(budgets))
    proc, url = _serve(tiny_export, "--workers", "2", log=tmp_path / "serve.log")
    try:
        _wait_healthy(url, proc, 60)
        assert all(text == want[b] for b, text in _answers(url, demo_png, budgets))
    finally:
        code = _stop(proc)
    assert code == 0, (tmp_path / "serve.log").read_text()[-2000:]


@pytest.mark.slow
def _replica_pids(url: str, want: int, limit_s: float) -> set:
    """Process ids /health reports, from rounds of 8 concurrent calls, until ``want`` differ or limit_s passed."""
    def pid(_):
        return json.loads(urllib.request.urlopen(f"{url}/health", timeout=30).read())["pid"]

    pids, deadline = set(), time.monotonic() + limit_s
    with ThreadPoolExecutor(8) as pool:
        while len(pids) < want and time.monotonic() < deadline:
            pids |= set(pool.map(pid, range(8)))
    return pids


def test_cli_ray_serve_two_replicas(tiny_export, reference, demo_png, tmp_path):
    pytest.importorskip("ray.serve", reason="the Ray path needs the serve-ray extra")
    budgets = [8, 16, "full", 24, 8, 16]
    want = _expected(reference, demo_png, set(budgets))
    log = tmp_path / "ray.log"
    proc, url = _serve(tiny_export, "--ray", "--replicas", "2", "--ray-cpus-per-replica", "0.5", log=log)
    try:
        try:
            startup = _wait_healthy(url, proc, 240)
        except AssertionError as exc:
            if "exited" in str(exc) and "ray" in log.read_text().lower():
                pytest.skip(f"Ray could not start here: {log.read_text().strip().splitlines()[-1][:200]}")
            raise
        print(f"ray serve ready after {startup:.1f} s")
        assert all(text == want[b] for b, text in _answers(url, demo_png, budgets))
        # both replicas serve: /health reports the answering replica's process id. Ray's router may send a
        # quiet stream of calls to one replica, so ask in concurrent rounds until both answered (bounded: 60 s)
        assert len(_replica_pids(url, want=2, limit_s=60)) == 2
    finally:
        code = _stop(proc, 120)
    assert code == 0, log.read_text()[-3000:]
