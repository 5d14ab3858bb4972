"""The README's and docs/usage.md's shell blocks run as written, on the tiny presets (issue 17 item 15).

Every command of every ```bash block is either run or listed in NOT_RUN with the reason, so a new block fails
here until it runs or says why it cannot. The ```python blocks of docs/usage.md run too.

Substitutions, the only differences from the text (explicit, so the blocks stay what a user types):
- MODELS: a real model alias -> the random-weight tiny preset of the same family (`builds.checkpoint`);
- FILES: `demo/tiny-engine` -> the session's tiny engine dir; the example images (photo.jpg, chart.png,
  cat.jpg) -> the bundled demo image; `data/POPE` -> 2 POPE rows in the hub's parquet layout; `preds.jsonl` ->
  predictions for those rows; `demo/` (coverpruner-demo's workdir) is seeded with the session's tiny checkpoint
  and engine dir, which the demo then reuses;
- coverpruner-run, coverpruner-demo and coverpruner-eval run get `--max-new-tokens 2` (random weights: any
  length proves the same), coverpruner-export `--no-progress`;
- `--port 8000` -> a free port; the server is started, answers one request, and is stopped with SIGINT.
Relative outputs (engines/..., kept.png, eval-results) land in a temporary working directory shared by the
blocks of one page, in page order (later blocks use the engine dirs of earlier ones, as a reader would).
"""

from __future__ import annotations

import base64
import importlib
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.hardening.conftest import free_port, repo_env

REPO = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/usage.md")
MODELS = {"llava-1.5-7b": "tiny", "llava-next-7b": "llava-next-tiny", "qwen2.5-vl-7b": "qwen2.5-vl-tiny"}
IMAGES = ("photo.jpg", "chart.png", "cat.jpg")
NOT_RUN = {  # command prefix -> why this test does not run it
    "pip install": "set-up; .ci/run runs these in a fresh virtual environment",
    "python -m pytest": "the test command itself",
    "coverpruner-serve demo/tiny-engine --ray": "Ray Serve: tests/serving/test_cli.py starts two replicas",
    "coverpruner-run engines/llava7b --provider tensorrt": "needs a GPU (tests marked gpu cover the TensorRT "
                                                             "runtime)",
}
_SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def blocks(page: str, lang: str) -> list[tuple[str, str]]:
    """(heading above it, text) of each ```lang block of ``page``."""
    out, heading = [], "top"
    for part in re.split(r"(^```[a-z]*\n.*?^```)", (REPO / page).read_text(), flags=re.S | re.M):
        if part.startswith(f"```{lang}\n"):
            out.append((heading, part[len(lang) + 4:-3]))
        else:
            heads = re.findall(r"^#+ (.*)$", part, flags=re.M)
            heading = heads[-1] if heads else heading
    return out


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a bash block: continuation lines joined, comments dropped, split with shlex."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split("  #")[0].strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line))
    return out


def _not_run(cmd: list[str]) -> str | None:
    text = shlex.join(cmd)
    return next((why for prefix, why in NOT_RUN.items() if text.startswith(prefix)), None)


SHELL_BLOCKS = [(page, heading, shell_commands(text)) for page in PAGES for heading, text in blocks(page, "bash")]


@pytest.fixture(scope="module")
def readme_commands() -> list[list[str]]:
    return [c for page, _, cmds in SHELL_BLOCKS if page == "README.md" for c in cmds]


@pytest.fixture(scope="module")
def usage_commands() -> list[list[str]]:
    return [c for page, _, cmds in SHELL_BLOCKS if page == "docs/usage.md" for c in cmds]


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_export_help_states_the_dtype_default(capsys):
    from coverpruner.export.cli import build_parser

    help_text = " ".join(build_parser().format_help().split())
    m = re.search(r"--dtype \{[^}]*\}\s+(.*?)(?= --[a-z])", help_text)
    assert m and "default" in m.group(1), f"--dtype help: {m and m.group(1)!r}"


def test_quantize_examples_write_their_own_dir(usage_commands):
    exports = [c for c in usage_commands if c[0] == "coverpruner-export"]
    plain = {_flag(c, "--output") for c in exports if "--quantize" not in c}
    quantized = [c for c in exports if "--quantize" in c]
    assert quantized, "docs/usage.md shows no quantize example"
    for cmd in quantized:
        assert _flag(cmd, "--output") not in plain, f"{shlex.join(cmd)} writes into an fp16 engine dir of the docs"


def test_eval_data_may_be_a_folder_of_jsonl(tmp_path, capsys):
    from coverpruner.evaluation.cli import main
    from tests.evaluation.datasets import write_jsonl

    folder = tmp_path / "GQA"
    write_jsonl(folder / "testdev.jsonl", [{"id": "a", "question": "q?", "answer": "red"}], [1])
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"question_id": "a", "prediction": "red"}) + "\n")
    code = main(["score", "--task", "gqa", "--data", str(folder), "--predictions", str(preds), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["n"] == 1


# -- running the blocks ---------------------------------------------------------------------------------------

class Workspace:
    """One page's working directory and the substitutions (module doc)."""

    def __init__(self, root: Path, builds, tiny_export: Path, demo_image: Path):
        self.root, self.builds, self.tiny_export, self.demo_image = root, builds, tiny_export, Path(str(demo_image))
        self._pope: Path | None = None

    def arg(self, a: str) -> str:
        if a in MODELS:
            return str(self.builds.checkpoint(MODELS[a]))
        if a == "demo/tiny-engine":
            return str(self.tiny_export)
        if a in IMAGES:
            return str(self.demo_image)
        if a == "data/POPE":
            return str(self.pope())
        if a == "preds.jsonl":
            return str(self.predictions())
        return str(REPO / a) if (REPO / a).exists() and not (self.root / a).exists() and "/" in a else a

    def pope(self) -> Path:
        from tests.evaluation.datasets import pope_rows, write_parquet

        if self._pope is None:
            self._pope = self.root / "_data" / "POPE"
            write_parquet(self._pope / "data" / "test-00000-of-00001.parquet", pope_rows(2), [1, 2])
        return self._pope

    def predictions(self) -> Path:
        from tests.evaluation.datasets import pope_rows

        path = self.root / "_data" / "preds.jsonl"
        path.write_text("".join(json.dumps({"question_id": r["question_id"], "prediction": "Yes"}) + "\n"
                                for r in pope_rows(2)))
        return path

    def seed_demo(self) -> None:
        """coverpruner-demo's default workdir with the session's tiny checkpoint and engine (reused by it)."""
        demo = self.root / "demo"
        if not demo.exists():
            shutil.copytree(self.builds.checkpoint("tiny"), demo / "tiny-checkpoint")
            shutil.copytree(self.tiny_export, demo / "tiny-engine")


def _entry_point(name: str):
    module, _, func = _SCRIPTS[name].partition(":")
    return getattr(importlib.import_module(module), func)


def _serve(argv: list[str], ws: Workspace) -> None:
    """Start coverpruner-serve, wait for /health, answer one chat completion, stop it with SIGINT (exit 0)."""
    import urllib.request

    port = free_port()
    argv = [str(port) if a == "8000" and argv[i - 1] == "--port" else a for i, a in enumerate(argv)]
    proc = subprocess.Popen([sys.executable, "-m", "coverpruner.serving.cli", *argv], env=repo_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if json.loads(r.read())["status"] == "ok":
                        break
            except OSError:
                pass
            assert proc.poll() is None, f"coverpruner-serve exited {proc.returncode}: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "coverpruner-serve did not answer /health in 120 s"
            time.sleep(0.2)
        model = json.loads(urllib.request.urlopen(f"{base}/v1/models", timeout=10).read())["data"][0]["id"]
        image = "data:image/png;base64," + base64.b64encode(ws.demo_image.read_bytes()).decode()
        body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "What is shown?"}]}]}
        req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200 and json.loads(r.read())["choices"][0]["message"]["content"] is not None
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, proc.stderr.read()


def run_command(cmd: list[str], ws: Workspace, capsys) -> None:
    """Run one documented command (substituted) in the page's working directory; fail with its stderr."""
    name, argv = cmd[0], [ws.arg(a) for a in cmd[1:]]
    if name == "coverpruner-serve":
        return _serve(argv, ws)
    if name == "coverpruner-build":
        from tests.trt_plans import load_trt_rtx

        load_trt_rtx()  # skips with what to install when TensorRT-RTX is missing
    if name == "coverpruner-demo":
        ws.seed_demo()
        argv += ["--max-new-tokens", "2"]
    if name == "coverpruner-run" or (name == "coverpruner-eval" and argv[:1] == ["run"]):
        argv += [] if "--max-new-tokens" in argv else ["--max-new-tokens", "2"]
    if name == "coverpruner-export":
        argv += ["--no-progress"]
    assert name in _SCRIPTS, f"{shlex.join(cmd)}: not a coverpruner command; run it here or add it to NOT_RUN"
    try:
        code = _entry_point(name)(argv)
    except SystemExit as exc:
        code = exc.code
    assert code in (0, None), f"{shlex.join(cmd)} -> exit {code}: {capsys.readouterr().err[-2000:]}"


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory, builds, tiny_export, demo_image) -> dict:
    return {page: Workspace(tmp_path_factory.mktemp(page.replace("/", "_")), builds, tiny_export, demo_image)
            for page in PAGES}


@pytest.mark.slow
@pytest.mark.parametrize("page,heading,commands", SHELL_BLOCKS,
                         ids=[f"{p}:{h}:{i}" for i, (p, h, _) in enumerate(SHELL_BLOCKS)])
def test_shell_block_runs(page, heading, commands, workspaces, monkeypatch, capsys):
    ws = workspaces[page]
    monkeypatch.chdir(ws.root)
    ran = 0
    for cmd in commands:
        if _not_run(cmd) is None:
            run_command(cmd, ws, capsys)
            ran += 1
    if not ran:
        pytest.skip("; ".join(sorted({_not_run(c) for c in commands})))


PYTHON_BLOCKS = [(h, t) for h, t in blocks("docs/usage.md", "python")]


@pytest.mark.slow
@pytest.mark.parametrize("heading,code", PYTHON_BLOCKS, ids=[h for h, _ in PYTHON_BLOCKS])
def test_python_block_runs(heading, code, tiny_export, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # the blocks name coverpruner/assets/demo.png relative to the checkout
    exec(compile(code.replace('"demo/tiny-engine"', repr(str(tiny_export))), f"docs/usage.md: {heading}", "exec"),
         {"__name__": "__doc_block__"})


def test_every_block_is_seen():
    """The parser finds the blocks this test promises to run (a changed fence would silently skip them)."""
    assert {p for p, _, _ in SHELL_BLOCKS} == set(PAGES)
    assert sum(len(c) for _, _, c in SHELL_BLOCKS) >= 15 and len(PYTHON_BLOCKS) >= 2
    assert any("Qwen2.5-VL" == h for _, h, _ in SHELL_BLOCKS)
