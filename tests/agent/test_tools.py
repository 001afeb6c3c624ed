"""The agent's tools: the public contract (names, parameters) and each tool's success and error paths."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from soba_nb.agent.tools import (
    SUMMARY_MAX_CHARS,
    TOOL_SCHEMAS,
    ToolContext,
    ToolOutcome,
    run_tool,
    summarize_arguments,
)
from soba_nb.agent.tools.python_tool import MAX_RESULT_REPR_CHARS


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    return root


@pytest.fixture
def ctx(project: Path) -> ToolContext:
    return ToolContext(project_root=project, namespace={})


def call(name: str, ctx: ToolContext, **arguments: object) -> ToolOutcome:
    return run_tool(name, json.dumps(arguments), ctx)


# --- the contract ---------------------------------------------------------------------------

EXPECTED_PARAMETERS = {
    "python": (["code", "timeout_s"], ["code"]),
    "read_file": (["path", "start_line", "end_line"], ["path"]),
    "write_file": (["path", "content"], ["path", "content"]),
    "edit_file": (["path", "old", "new"], ["path", "old", "new"]),
    "list_files": (["path"], []),
    "shell": (["command", "timeout_s"], ["command"]),
    "checkpoint": (["kind", "note"], ["kind", "note"]),
    "read_cells": (["first", "last"], []),
    "read_notebook": (["path"], []),
    "add_cell": (["source", "kind"], ["source"]),
    "edit_cell": (["execution_count", "source"], ["execution_count", "source"]),
}


def test_schemas_have_exactly_the_contract_names_and_parameters() -> None:
    assert [schema.name for schema in TOOL_SCHEMAS] == list(EXPECTED_PARAMETERS)
    for schema in TOOL_SCHEMAS:
        parameters, required = EXPECTED_PARAMETERS[schema.name]
        assert schema.parameters["type"] == "object"
        assert "additionalProperties" not in schema.parameters  # unknown ones are refused when a call comes
        assert list(schema.parameters["properties"]) == parameters
        assert sorted(schema.parameters.get("required", [])) == sorted(required)
        assert schema.description
        for name, prop in schema.parameters["properties"].items():
            # An enum names its choices itself (every request carries these tokens).
            assert prop.get("description") or prop.get("enum"), f"{schema.name}.{name} has no description"
            assert "title" not in prop


def test_schema_details_the_model_relies_on() -> None:
    schemas = {schema.name: schema.parameters for schema in TOOL_SCHEMAS}
    assert schemas["checkpoint"]["properties"]["kind"]["enum"] == ["milestone", "plan_pivot"]
    # Bounds and defaults the model reads in words (checked when a call comes: tests below).
    assert schemas["shell"]["properties"]["timeout_s"]["description"] == "Seconds, at most 600; default 60."
    assert "at most 3600" in schemas["python"]["properties"]["timeout_s"]["description"]
    assert schemas["read_cells"]["properties"]["first"]["description"] == "First In [n]; 0: the last 10 cells."
    assert schemas["list_files"]["properties"]["path"]["default"] == "."
    json.dumps(schemas)  # serialisable as sent to a provider


# --- python -----------------------------------------------------------------------------------


def test_python_reports_stdout_stderr_and_last_expression(ctx: ToolContext) -> None:
    code = "import sys\nx = 20\nprint('hello')\nprint('warn', file=sys.stderr)\nx + 1"
    outcome = call("python", ctx, code=code)
    assert outcome == ToolOutcome("stdout:\nhello\nstderr:\nwarn\nresult: 21", is_error=False)


def test_python_modifies_the_user_namespace(ctx: ToolContext) -> None:
    ctx.namespace["data"] = [3, 1, 2]
    assert not call("python", ctx, code="data.sort()\ntotal = sum(data)").is_error
    assert ctx.namespace["data"] == [1, 2, 3]
    assert ctx.namespace["total"] == 6
    assert call("python", ctx, code="total * 2").content == "result: 12"


def test_python_without_output_says_so(ctx: ToolContext) -> None:
    assert call("python", ctx, code="y = 1").content == "(no output)"
    assert call("python", ctx, code="None").content == "(no output)"


def test_python_result_uses_repr(ctx: ToolContext) -> None:
    assert call("python", ctx, code="'a' + 'b'").content == "result: 'ab'"


def test_python_clips_a_huge_result(ctx: ToolContext) -> None:
    outcome = call("python", ctx, code="'x' * 1_000_000")
    assert not outcome.is_error
    assert len(outcome.content) < MAX_RESULT_REPR_CHARS + 100
    assert "more characters]" in outcome.content


def test_python_exception_is_an_error_with_a_short_traceback(ctx: ToolContext) -> None:
    code = "print('before')\ndef check(v):\n    raise ValueError(f'bad value {v}')\ncheck(7)"
    outcome = call("python", ctx, code=code)
    assert outcome.is_error
    assert outcome.content.startswith("stdout:\nbefore\nerror: ValueError: bad value 7")
    assert "line 4, in <module>" in outcome.content
    assert "line 3, in check" in outcome.content
    assert "raise ValueError(f'bad value {v}')" in outcome.content


def test_python_traceback_leaves_out_library_frames(ctx: ToolContext) -> None:
    outcome = call("python", ctx, code="import json\njson.loads('{')")
    assert outcome.is_error
    assert "error: JSONDecodeError:" in outcome.content
    assert "json/decoder.py" not in outcome.content and "json/__init__.py" not in outcome.content
    assert "line 2, in <module>" in outcome.content


def test_python_function_from_an_earlier_call_shows_its_source(ctx: ToolContext) -> None:
    call("python", ctx, code="def fail():\n    return 1 / 0")
    outcome = call("python", ctx, code="fail()")
    assert "error: ZeroDivisionError: division by zero" in outcome.content
    assert "return 1 / 0" in outcome.content


def test_python_syntax_error_is_an_error(ctx: ToolContext) -> None:
    outcome = call("python", ctx, code="x = (1,\nprint(x")
    assert outcome.is_error
    assert outcome.content.startswith("error: SyntaxError:")


def test_python_sys_exit_does_not_stop_the_kernel(ctx: ToolContext) -> None:
    outcome = call("python", ctx, code="import sys\nsys.exit(3)")
    assert outcome.is_error
    assert "error: SystemExit: 3" in outcome.content


def test_python_failing_repr_is_reported_not_raised(ctx: ToolContext) -> None:
    code = "class Odd:\n    def __repr__(self):\n        raise RuntimeError('no')\nOdd()"
    outcome = call("python", ctx, code=code)
    assert not outcome.is_error
    assert outcome.content == "result: <repr failed: RuntimeError: no>"


# --- file tools -------------------------------------------------------------------------------


def test_write_then_read_file(ctx: ToolContext, project: Path) -> None:
    outcome = call("write_file", ctx, path="notes/a/b.txt", content="héllo\nworld\n")
    assert outcome == ToolOutcome("wrote 13 bytes to notes/a/b.txt", is_error=False)
    assert (project / "notes/a/b.txt").read_bytes() == "héllo\nworld\n".encode()
    assert call("read_file", ctx, path="notes/a/b.txt").content == "héllo\nworld\n"


def test_write_file_keeps_newlines_byte_for_byte(ctx: ToolContext, project: Path) -> None:
    call("write_file", ctx, path="crlf.txt", content="a\r\nb\r\n")
    assert (project / "crlf.txt").read_bytes() == b"a\r\nb\r\n"


def test_read_file_errors(ctx: ToolContext, project: Path) -> None:
    missing = call("read_file", ctx, path="nope.txt")
    assert missing == ToolOutcome("read_file: no such file 'nope.txt'", is_error=True)
    (project / "folder").mkdir()
    assert "is a folder" in call("read_file", ctx, path="folder").content
    (project / "blob.bin").write_bytes(b"\xff\xfe\x00")
    binary = call("read_file", ctx, path="blob.bin")
    assert binary.is_error and "not UTF-8 text" in binary.content


def test_absolute_path_inside_the_project_is_allowed(ctx: ToolContext, project: Path) -> None:
    (project / "in.txt").write_text("ok")
    assert call("read_file", ctx, path=str(project / "in.txt")).content == "ok"


@pytest.mark.parametrize("tool", ["read_file", "write_file", "edit_file", "list_files"])
def test_dotdot_escape_is_refused(ctx: ToolContext, project: Path, tool: str) -> None:
    (project.parent / "secret.txt").write_text("secret")
    arguments = {"path": "../secret.txt", "content": "x", "old": "secret", "new": "x"}
    schema = next(schema for schema in TOOL_SCHEMAS if schema.name == tool)
    outcome = call(
        tool, ctx, **{k: v for k, v in arguments.items() if k in schema.parameters["properties"]}
    )
    assert outcome.is_error
    assert outcome.content == (
        f"{tool}: path '../secret.txt' is outside the project folder {project.resolve()}"
    )
    assert (project.parent / "secret.txt").read_text() == "secret"


def test_absolute_path_outside_is_refused(ctx: ToolContext, project: Path) -> None:
    outside = project.parent / "elsewhere.txt"
    outcome = call("write_file", ctx, path=str(outside), content="x")
    assert outcome.is_error and "outside the project folder" in outcome.content
    assert not outside.exists()
    assert call("read_file", ctx, path="/etc/passwd").is_error


def test_dotdot_that_comes_back_inside_is_allowed(ctx: ToolContext, project: Path) -> None:
    (project / "a").mkdir()
    (project / "b.txt").write_text("back inside")
    assert call("read_file", ctx, path="a/../b.txt").content == "back inside"


def test_symlink_out_of_the_project_is_refused(ctx: ToolContext, project: Path) -> None:
    outside = project.parent / "outside"
    outside.mkdir()
    (outside / "data.txt").write_text("private")
    (project / "link").symlink_to(outside, target_is_directory=True)
    (project / "file_link.txt").symlink_to(outside / "data.txt")
    for outcome in (
        call("read_file", ctx, path="link/data.txt"),
        call("read_file", ctx, path="file_link.txt"),
        call("write_file", ctx, path="link/new.txt", content="x"),
        call("list_files", ctx, path="link"),
    ):
        assert outcome.is_error and "outside the project folder" in outcome.content
    assert not (outside / "new.txt").exists()


def test_symlink_inside_the_project_is_allowed(ctx: ToolContext, project: Path) -> None:
    (project / "real").mkdir()
    (project / "real" / "data.txt").write_text("inside")
    (project / "alias").symlink_to(project / "real", target_is_directory=True)
    assert call("read_file", ctx, path="alias/data.txt").content == "inside"


def test_edit_file_replaces_one_exact_occurrence(ctx: ToolContext, project: Path) -> None:
    (project / "m.py").write_text("a = 1\nb = 2\n")
    outcome = call("edit_file", ctx, path="m.py", old="b = 2", new="b = 3\nc = 4")
    assert not outcome.is_error
    assert outcome.content == "edited m.py: replaced 1 line(s) with 2 line(s)"
    assert (project / "m.py").read_text() == "a = 1\nb = 3\nc = 4\n"


def test_edit_file_zero_matches(ctx: ToolContext, project: Path) -> None:
    (project / "m.py").write_text("a = 1\n")
    outcome = call("edit_file", ctx, path="m.py", old="z = 9", new="z = 0")
    assert outcome.is_error and "0 matches" in outcome.content
    assert (project / "m.py").read_text() == "a = 1\n"


def test_edit_file_multiple_matches_names_the_count(ctx: ToolContext, project: Path) -> None:
    (project / "m.py").write_text("x = 1\nx = 1\nx = 1\n")
    outcome = call("edit_file", ctx, path="m.py", old="x = 1", new="x = 2")
    assert outcome.is_error and "occurs 3 times" in outcome.content
    assert (project / "m.py").read_text() == "x = 1\nx = 1\nx = 1\n"


def test_edit_file_refuses_empty_old_and_missing_file(ctx: ToolContext, project: Path) -> None:
    (project / "m.py").write_text("x")
    assert call("edit_file", ctx, path="m.py", old="", new="y").is_error
    assert "no such file" in call("edit_file", ctx, path="gone.py", old="a", new="b").content


def test_list_files_sorted_with_folder_slashes(ctx: ToolContext, project: Path) -> None:
    (project / "b.txt").write_text("")
    (project / "a_dir").mkdir()
    (project / "c.csv").write_text("")
    assert run_tool("list_files", "{}", ctx).content == "a_dir/\nb.txt\nc.csv"
    assert call("list_files", ctx, path="a_dir").content == "(empty folder)"


def test_list_files_caps_long_listings(ctx: ToolContext, project: Path, monkeypatch) -> None:
    from soba_nb.agent.tools import files

    monkeypatch.setattr(files, "MAX_LISTED_ENTRIES", 3)
    for index in range(5):
        (project / f"f{index}.txt").write_text("")
    assert call("list_files", ctx).content == "f0.txt\nf1.txt\nf2.txt\n… and 2 more"


def test_list_files_errors(ctx: ToolContext, project: Path) -> None:
    (project / "f.txt").write_text("")
    assert "is a file" in call("list_files", ctx, path="f.txt").content
    assert "no such folder" in call("list_files", ctx, path="nope").content


# --- shell ------------------------------------------------------------------------------------


def test_shell_reports_exit_status_then_combined_output(ctx: ToolContext, project: Path) -> None:
    outcome = call("shell", ctx, command="pwd; echo to-err >&2")
    assert outcome == ToolOutcome(f"exit status: 0\n{project.resolve()}\nto-err", is_error=False)


def test_shell_nonzero_exit_is_an_error(ctx: ToolContext) -> None:
    outcome = call("shell", ctx, command="echo failing; exit 3")
    assert outcome == ToolOutcome("exit status: 3\nfailing", is_error=True)


def test_shell_timeout_kills_the_process_group(ctx: ToolContext, project: Path) -> None:
    # The background child would write late.txt after 1 s unless its process group is killed.
    started = time.monotonic()
    command = "echo started; (sleep 1; echo late > late.txt) & sleep 30"
    outcome = call("shell", ctx, command=command, timeout_s=0.5)
    assert time.monotonic() - started < 1
    assert outcome == ToolOutcome("exit status: timeout after 0.5s\nstarted", is_error=True)
    time.sleep(max(0.0, started + 2 - time.monotonic()))
    assert not (project / "late.txt").exists()


def test_shell_sleep_with_timeout_returns_quickly(ctx: ToolContext) -> None:
    started = time.monotonic()
    outcome = call("shell", ctx, command="sleep 30", timeout_s=1)
    assert time.monotonic() - started < 5
    assert outcome == ToolOutcome("exit status: timeout after 1s", is_error=True)


def test_shell_stops_when_the_turn_is_cancelled(ctx: ToolContext) -> None:
    ctx.cancel = threading.Event()
    threading.Timer(0.3, ctx.cancel.set).start()
    started = time.monotonic()
    outcome = call("shell", ctx, command="sleep 30")
    assert time.monotonic() - started < 10
    assert outcome == ToolOutcome("exit status: cancelled", is_error=True)


def test_shell_timeout_is_limited(ctx: ToolContext) -> None:
    outcome = call("shell", ctx, command="true", timeout_s=601)
    assert outcome.is_error and "timeout_s" in outcome.content and "600" in outcome.content


def test_shell_has_no_stdin(ctx: ToolContext) -> None:
    outcome = call("shell", ctx, command="cat", timeout_s=5)
    assert outcome == ToolOutcome("exit status: 0", is_error=False)


# --- checkpoint -------------------------------------------------------------------------------


def test_checkpoint_calls_the_callback_and_reports_the_id(ctx: ToolContext) -> None:
    recorded: list[tuple[str, str]] = []

    def record(kind: str, note: str) -> str:
        recorded.append((kind, note))
        return "ck_0123abcd"

    ctx.record_checkpoint = record
    outcome = call("checkpoint", ctx, kind="milestone", note="cleaning done")
    assert outcome == ToolOutcome("recorded milestone checkpoint ck_0123abcd", is_error=False)
    assert call("checkpoint", ctx, kind="plan_pivot", note="switch to SQL").content.endswith(
        "ck_0123abcd"
    )
    assert recorded == [("milestone", "cleaning done"), ("plan_pivot", "switch to SQL")]


def test_checkpoint_bad_kind_is_an_error(ctx: ToolContext) -> None:
    ctx.record_checkpoint = lambda kind, note: pytest.fail("must not be called")
    outcome = call("checkpoint", ctx, kind="turn", note="x")
    assert outcome.is_error
    assert outcome.content.startswith("checkpoint: parameter 'kind':")
    assert "milestone" in outcome.content and "plan_pivot" in outcome.content


def test_checkpoint_without_a_callback_or_with_a_failing_one(ctx: ToolContext) -> None:
    assert call("checkpoint", ctx, kind="milestone", note="x").is_error

    def broken(kind: str, note: str) -> str:
        raise OSError("disk full")

    ctx.record_checkpoint = broken
    outcome = call("checkpoint", ctx, kind="milestone", note="x")
    assert outcome.is_error and "disk full" in outcome.content


# --- arguments and dispatch -------------------------------------------------------------------


def test_malformed_json_is_an_error_naming_the_tool(ctx: ToolContext) -> None:
    outcome = run_tool("read_file", '{"path": "a.txt"', ctx)
    assert outcome.is_error
    assert outcome.content.startswith("read_file: arguments are not valid JSON")
    assert "\n" not in outcome.content


def test_arguments_nested_absurdly_deep_are_an_error_not_a_crash(ctx: ToolContext) -> None:
    outcome = run_tool("python", '{"code": ' + "[" * 100_000 + "]" * 100_000 + "}", ctx)
    assert outcome == ToolOutcome("python: arguments are nested too deeply to read", is_error=True)


def test_non_object_arguments(ctx: ToolContext) -> None:
    outcome = run_tool("python", '["print(1)"]', ctx)
    assert outcome == ToolOutcome(
        "python: arguments must be a JSON object, got array", is_error=True
    )


def test_unknown_parameter(ctx: ToolContext) -> None:
    outcome = run_tool("read_file", '{"path": "a", "encoding": "latin-1"}', ctx)
    assert outcome.is_error
    assert outcome.content == (
        "read_file: unknown parameter 'encoding'; parameters: path, start_line (optional), end_line (optional)"
    )


def test_missing_parameter(ctx: ToolContext) -> None:
    outcome = run_tool("write_file", '{"path": "a.txt"}', ctx)
    assert outcome == ToolOutcome(
        "write_file: missing required parameter 'content'; parameters: path, content", is_error=True
    )


def test_wrong_type(ctx: ToolContext) -> None:
    outcome = run_tool("shell", '{"command": "ls", "timeout_s": "60"}', ctx)
    assert outcome.is_error
    assert outcome.content.startswith("shell: parameter 'timeout_s':")
    assert "got string" in outcome.content
    assert "\n" not in outcome.content


def test_unknown_tool_lists_the_known_tools(ctx: ToolContext) -> None:
    outcome = run_tool("run_sql", "{}", ctx)
    assert outcome.is_error
    assert outcome.content == (
        "unknown tool 'run_sql'; known tools: "
        "python, read_file, write_file, edit_file, list_files, shell, checkpoint, read_cells, read_notebook, add_cell, edit_cell"
    )


def test_empty_arguments_mean_no_arguments(ctx: ToolContext, project: Path) -> None:
    (project / "x.txt").write_text("")
    assert run_tool("list_files", "", ctx).content == "x.txt"


def test_raw_newlines_inside_json_strings_are_accepted(ctx: ToolContext) -> None:
    outcome = run_tool("python", '{"code": "a = 2\nprint(a)"}', ctx)
    assert outcome == ToolOutcome("stdout:\n2", is_error=False)


def test_unexpected_exception_becomes_an_error_outcome(ctx: ToolContext, monkeypatch) -> None:
    from soba_nb.agent.tools import TOOLS

    def explode(arguments: object, context: ToolContext) -> ToolOutcome:
        raise RuntimeError("boom")

    tool = TOOLS["list_files"]
    monkeypatch.setitem(
        TOOLS,
        "list_files",
        type(tool)(tool.name, tool.description, tool.arguments, explode, tool.summarize),
    )
    outcome = run_tool("list_files", "{}", ctx)
    assert outcome == ToolOutcome("list_files: internal error: RuntimeError: boom", is_error=True)


def test_unreadable_file_is_an_error_not_a_crash(ctx: ToolContext, project: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root can read any file")
    target = project / "locked.txt"
    target.write_text("x")
    target.chmod(0)
    outcome = call("read_file", ctx, path="locked.txt")
    assert outcome == ToolOutcome("read_file: cannot read 'locked.txt': Permission denied", True)


# --- receipts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments", "summary"),
    [
        ("python", {"code": "df.describe()\ndf.head()"}, "python: df.describe()…"),
        ("python", {"code": "x = 1"}, "python: x = 1"),
        ("read_file", {"path": "data.csv"}, "read_file data.csv"),
        ("write_file", {"path": "a.py", "content": "héllo"}, "write_file a.py (6 bytes)"),
        ("edit_file", {"path": "a.py", "old": "x", "new": "y"}, "edit_file a.py"),
        ("list_files", {}, "list_files ."),
        ("shell", {"command": "pytest -q"}, "shell: pytest -q (timeout 60s)"),
        ("shell", {"command": "sleep 1", "timeout_s": 2.5}, "shell: sleep 1 (timeout 2.5s)"),
        ("checkpoint", {"kind": "milestone", "note": "loaded"}, "checkpoint milestone: loaded"),
    ],
)
def test_summaries(name: str, arguments: dict[str, object], summary: str) -> None:
    assert summarize_arguments(name, json.dumps(arguments)) == summary


def test_summaries_are_one_short_line_and_never_raise() -> None:
    long = summarize_arguments("shell", json.dumps({"command": "echo " + "x" * 500}))
    assert len(long) == SUMMARY_MAX_CHARS and long.endswith("…")
    assert summarize_arguments("python", "{not json") == "python (invalid arguments)"
    assert summarize_arguments("nope", "{}") == "nope (unknown tool)"
    assert "\n" not in summarize_arguments("shell", json.dumps({"command": "a\nb"}))


def test_a_small_window_gets_the_same_tools_with_compact_schemas() -> None:
    from soba_nb.agent.tools import COMPACT_TOOL_SCHEMAS, FULL_SCHEMAS_SHARE, tool_schemas_for

    assert [s.name for s in COMPACT_TOOL_SCHEMAS] == [s.name for s in TOOL_SCHEMAS]
    for compact, full in zip(COMPACT_TOOL_SCHEMAS, TOOL_SCHEMAS, strict=True):
        assert list(compact.parameters["properties"]) == list(full.parameters["properties"])
        assert compact.parameters.get("required") == full.parameters.get("required")
        assert all("description" not in prop for prop in compact.parameters["properties"].values())
        assert compact.description == full.description
    assert tool_schemas_for(100_000, 1_300) is TOOL_SCHEMAS
    assert tool_schemas_for(1_664, 1_300) is COMPACT_TOOL_SCHEMAS  # a 2,048-token llama.cpp server
    assert tool_schemas_for(int(1_300 / FULL_SCHEMAS_SHARE) + 1, 1_300) is TOOL_SCHEMAS
