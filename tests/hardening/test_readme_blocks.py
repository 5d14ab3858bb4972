"""Issue 17 item 15: the README's commands work as written.

- export --help states the --dtype default;
- the quantize examples write a new engine dir (they wrote into the fp16 dir of the export above them);
- eval --data may name a folder of JSONL files (it said "no .parquet or .arrow files");
- the Qwen2.5-VL block runs on the tiny preset (1008x1008 was outside its pixel limits).
"""

from __future__ import annotations

import re
import shlex

import pytest

from .conftest import REPO


def shell_commands(markdown: str) -> list[list[str]]:
    """The commands of the ```bash blocks: continuation lines joined, comments dropped, split with shlex."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                out.append(shlex.split(line))
    return out


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


@pytest.fixture(scope="module")
def readme_commands() -> list[list[str]]:
    return shell_commands((REPO / "README.md").read_text())


def test_export_help_states_the_dtype_default(capsys):
    from coverpruner.export.cli import build_parser

    help_text = " ".join(build_parser().format_help().split())
    m = re.search(r"--dtype \{[^}]*\}\s+(.*?)(?= --[a-z])", help_text)
    assert m and "default" in m.group(1), f"--dtype help: {m and m.group(1)!r}"


def test_quantize_examples_write_their_own_dir(readme_commands):
    exports = [c for c in readme_commands if c[0] == "coverpruner-export"]
    plain = {_flag(c, "--output") for c in exports if "--quantize" not in c}
    quantized = [c for c in exports if "--quantize" in c]
    assert quantized, "the README shows no quantize example"
    for cmd in quantized:
        assert _flag(cmd, "--output") not in plain, f"{shlex.join(cmd)} writes into an fp16 engine dir of the README"


def test_eval_data_may_be_a_folder_of_jsonl(tmp_path, capsys):
    import json

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


@pytest.mark.slow
def test_qwen_block_runs_on_the_tiny_preset(readme_commands, tmp_path, demo_image, capsys):
    """The README's Qwen2.5-VL commands with the model alias -> a tiny random checkpoint, the image -> the demo
    image, engines/ -> a temporary folder; every other flag as written."""
    from coverpruner.export.cli import main as export_main
    from coverpruner.runtime.cli import main as run_main
    from coverpruner.testing.qwen_checkpoints import write_qwen_checkpoint

    ckpt = write_qwen_checkpoint(tmp_path / "qwen-tiny", "qwen2.5-vl-tiny")
    block = [c for c in readme_commands if any("qwen" in a for a in c)]
    assert [c[0] for c in block] == ["coverpruner-export", "coverpruner-run"]
    for cmd in block:
        args = [str(ckpt) if a.startswith("qwen2.5-vl") else str(demo_image) if a.endswith((".png", ".jpg"))
                else str(tmp_path / a) if a.startswith("engines/") else a for a in cmd[1:]]
        if cmd[0] == "coverpruner-export":
            code = export_main(args + ["--no-progress", "--dtype", "fp32"])
        else:
            code = run_main(args + ["--max-new-tokens", "2"])
        assert code == 0, f"{shlex.join(cmd)}: {capsys.readouterr().err}"
