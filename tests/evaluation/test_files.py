"""Output files: whole-line JSONL appends, repair of a cut last line, atomic replace."""

import json

import pytest

from coverpruner.evaluation.files import JsonlAppender, read_jsonl, write_atomic


def test_cut_last_line_is_dropped_and_repaired(tmp_path):
    path = tmp_path / "p.jsonl"
    with JsonlAppender(path) as out:
        out.append({"a": 1})
        out.append({"a": 2})
    path.write_text(path.read_text() + '{"a": 3, "b"')  # a run killed mid-write
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    assert path.read_text().endswith('"b"')  # reading alone changes nothing
    assert read_jsonl(path, repair=True) == [{"a": 1}, {"a": 2}]
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n'
    with JsonlAppender(path) as out:
        out.append({"a": 4})
    assert [r["a"] for r in read_jsonl(path)] == [1, 2, 4]


def test_broken_line_in_the_middle_is_an_error(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(path)


def test_write_atomic_replaces_whole_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "m.json"
    write_atomic(path, json.dumps({"x": 1}))
    write_atomic(path, json.dumps({"x": 2}))
    assert json.loads(path.read_text()) == {"x": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]
