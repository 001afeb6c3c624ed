"""`read_file(path, start_line, end_line)` (SPEC §15): a line range, 1-based and inclusive, and a
first line saying which lines the result holds of how many — through `run_tool` with the JSON
arguments a model sends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from soba_nb.agent.tools import ToolContext, ToolOutcome, run_tool, summarize_arguments
from soba_nb.compaction.model_input import TOOL_OUTPUT_LIMIT_CHARS


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "ten.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)), encoding="utf-8")
    return root


@pytest.fixture
def ctx(project: Path) -> ToolContext:
    return ToolContext(project_root=project, namespace={})


def read(ctx: ToolContext, arguments: str) -> ToolOutcome:
    return run_tool("read_file", arguments, ctx)


def test_a_range_is_one_based_and_inclusive_with_a_header(ctx):
    outcome = read(ctx, '{"path": "ten.txt", "start_line": 3, "end_line": 5}')
    assert outcome == ToolOutcome("[lines 3–5 of 10]\nline 3\nline 4\nline 5\n")


def test_either_end_may_be_left_out(ctx):
    assert read(ctx, '{"path": "ten.txt", "start_line": 9}').content == "[lines 9–10 of 10]\nline 9\nline 10\n"
    assert read(ctx, '{"path": "ten.txt", "end_line": 2}').content == "[lines 1–2 of 10]\nline 1\nline 2\n"
    assert read(ctx, '{"path": "ten.txt", "start_line": 4, "end_line": 4}').content == "[line 4 of 10]\nline 4\n"


def test_an_end_past_the_file_is_its_end(ctx):
    assert read(ctx, '{"path": "ten.txt", "start_line": 10, "end_line": 5000}').content == "[line 10 of 10]\nline 10\n"


def test_null_is_the_same_as_leaving_it_out(ctx, project):
    whole = (project / "ten.txt").read_text()
    assert read(ctx, '{"path": "ten.txt", "start_line": null, "end_line": null}').content == whole


def test_a_short_file_read_whole_has_no_header(ctx, project):
    assert read(ctx, '{"path": "ten.txt"}').content == (project / "ten.txt").read_text()


def test_a_file_longer_than_the_clip_says_how_many_lines_it_has(ctx, project):
    lines = [f"row {n:05d} " + "x" * 60 + "\n" for n in range(1, 1204)]
    (project / "long.csv").write_text("".join(lines), encoding="utf-8")
    assert len("".join(lines)) > TOOL_OUTPUT_LIMIT_CHARS
    whole = read(ctx, '{"path": "long.csv"}').content
    assert whole == "[lines 1–1,203 of 1,203]\n" + "".join(lines)
    part = read(ctx, '{"path": "long.csv", "start_line": 40, "end_line": 80}').content
    assert part.splitlines()[0] == "[lines 40–80 of 1,203]"
    assert part.splitlines()[1:] == [line.rstrip("\n") for line in lines[39:80]]


def test_a_last_line_without_a_newline_and_crlf_lines(ctx, project):
    (project / "open.txt").write_text("a\nb\nc", encoding="utf-8")
    assert read(ctx, '{"path": "open.txt", "start_line": 2}').content == "[lines 2–3 of 3]\nb\nc"
    (project / "dos.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    assert read(ctx, '{"path": "dos.txt", "start_line": 2, "end_line": 2}').content == "[line 2 of 3]\ntwo\r\n"
    (project / "feed.txt").write_text("page\x0cbreak\nnext\n", encoding="utf-8")  # only \n ends a line
    assert read(ctx, '{"path": "feed.txt", "start_line": 2}').content == "[line 2 of 2]\nnext\n"


def test_bad_ranges_are_one_line_errors_naming_the_parameter(ctx):
    cases = {
        '{"path": "ten.txt", "start_line": 0}': "read_file: parameter 'start_line': Input should be greater than or equal to 1 (got 0)",
        '{"path": "ten.txt", "end_line": -3}': "read_file: parameter 'end_line': Input should be greater than or equal to 1 (got -3)",
        '{"path": "ten.txt", "start_line": "3"}': "read_file: parameter 'start_line': Input should be a valid integer (got string)",
        '{"path": "ten.txt", "start_line": 6, "end_line": 5}': "read_file: start_line 6 is after end_line 5",
        '{"path": "ten.txt", "start_line": 11}': "read_file: start_line 11 is past the end of 'ten.txt' (10 lines)",
    }
    for arguments, message in cases.items():
        outcome = read(ctx, arguments)
        assert outcome.is_error and outcome.content.startswith(message), outcome.content
        assert "\n" not in outcome.content


def test_an_empty_file_is_said_to_be_empty(ctx, project):
    (project / "empty.txt").write_text("")
    assert read(ctx, '{"path": "empty.txt", "start_line": 1, "end_line": 3}').content == "(empty file)"


def test_the_refusals_hold_with_a_range(ctx, project, tmp_path):
    (tmp_path / "outside.txt").write_text("secret\n")
    (project / "link.txt").symlink_to(tmp_path / "outside.txt")
    (project / "blob.bin").write_bytes(b"\xff\xfe\x00binary")
    (project / "folder").mkdir()
    ranged = ', "start_line": 1, "end_line": 1}'
    assert "outside the project" in read(ctx, '{"path": "../outside.txt"' + ranged).content
    assert read(ctx, '{"path": "link.txt"' + ranged).is_error
    assert "not UTF-8 text" in read(ctx, '{"path": "blob.bin"' + ranged).content
    assert "is a folder" in read(ctx, '{"path": "folder"' + ranged).content
    assert read(ctx, '{"path": "missing.txt"' + ranged).content == "read_file: no such file 'missing.txt'"


def test_the_receipt_names_the_range():
    arguments = json.dumps({"path": "ten.txt", "start_line": 3, "end_line": 5})
    assert summarize_arguments("read_file", arguments) == "read_file ten.txt (lines 3–5)"
    assert summarize_arguments("read_file", '{"path": "ten.txt", "start_line": 7}') == "read_file ten.txt (from line 7)"
    assert summarize_arguments("read_file", '{"path": "ten.txt"}') == "read_file ten.txt"


def test_the_head_of_a_data_file_larger_than_read_file_takes_whole(ctx, project):
    """A 12 MB CSV (over the 8 MB a whole read takes): its header and first rows, and how many
    lines it has, without reading it whole into memory."""
    rows = 400_000
    with (project / "big.csv").open("w", encoding="utf-8") as out:
        out.write("region,amount,day\n")
        for n in range(rows):
            out.write(f"West,{n}.25,2026-01-{n % 28 + 1:02d}\n")
    assert (project / "big.csv").stat().st_size > 8 * 1024 * 1024
    whole = read(ctx, '{"path": "big.csv"}')
    assert whole.is_error and "give start_line and end_line to read part of it" in whole.content
    head = read(ctx, '{"path": "big.csv", "end_line": 3}')
    assert head == ToolOutcome(f"[lines 1–3 of {rows + 1:,}]\nregion,amount,day\nWest,0.25,2026-01-01\nWest,1.25,2026-01-02\n")
    tail = read(ctx, f'{{"path": "big.csv", "start_line": {rows + 1}}}')
    assert tail.content == f"[line {rows + 1:,} of {rows + 1:,}]\nWest,{rows - 1}.25,2026-01-{(rows - 1) % 28 + 1:02d}\n"
    too_many = read(ctx, '{"path": "big.csv", "start_line": 2}')
    assert too_many.is_error and "ask for fewer lines" in too_many.content and "\n" not in too_many.content


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
@pytest.mark.parametrize(
    "text",
    ["", "\n", "a", "a\n", "a\nb", "a\nb\n", "\n\n\nx", "one\r\ntwo\r\n", "é\n€\n😀 no newline", "x" * 50 + "\n" + "y" * 9],
)
def test_any_chunking_reads_the_lines_a_whole_split_finds(tmp_path, monkeypatch, chunk, text):
    import os

    import soba_nb.agent.tools.line_range as line_range

    monkeypatch.setattr(line_range, "CHUNK_BYTES", chunk)
    data = text.encode("utf-8")
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    expected = [part + b"\n" for part in data.split(b"\n")[:-1]] + ([data.split(b"\n")[-1]] if not data.endswith(b"\n") and data else [])
    for first in range(1, len(expected) + 2):
        for last in [None, *range(first, len(expected) + 2)]:
            fd = os.open(path, os.O_RDONLY)
            try:
                lines, total = line_range.read_range(fd, first, last, 1 << 20)
            finally:
                os.close(fd)
            assert total == len(expected)
            assert lines == expected[first - 1 : last]
