"""The agent's tools (SPEC §9): their schemas for the model, and `run_tool` for the turn loop.

The names and parameters are a public contract:

    python(code, timeout_s)       read_file(path, start_line, end_line)
    write_file(path, content)     edit_file(path, old, new)  list_files(path=".")
    shell(command, timeout_s=60)  checkpoint(kind, note)     read_cells(first, last)
    read_notebook(path)           add_cell(source, kind)     edit_cell(execution_count, source)

Every description ends by saying that output over model input's limit is clipped (SPEC §15).

`run_tool(name, arguments, ctx)` takes the raw JSON argument text from the model and never
raises (except `KeyboardInterrupt`): malformed arguments, an unknown tool, a failing tool and
an unexpected exception all become a `ToolOutcome` with `is_error=True` and a message naming
the tool and the problem, which the model sees and can act on. Content is returned whole;
clipping for model input happens when the input is assembled.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from soba_nb.agent.tool_schemas import COMPACT_TOOL_SCHEMAS as COMPACT_TOOL_SCHEMAS  # re-exported
from soba_nb.agent.tool_schemas import FULL_SCHEMAS_SHARE as FULL_SCHEMAS_SHARE  # re-exported
from soba_nb.agent.tool_schemas import TOOL_SCHEMAS as TOOL_SCHEMAS  # re-exported
from soba_nb.agent.tool_schemas import tool_schemas_for as tool_schemas_for  # re-exported
from soba_nb.agent.tools import checkpoint, files, notebook, python_tool, shell
from soba_nb.agent.tools.base import (
    ToolArguments,
    ToolContext,
    ToolError,
    ToolOutcome,
    resolve_in_project,
)
from soba_nb.messages import ToolSchema
from soba_nb.text import clip

__all__ = [
    "TOOLS",
    "TOOL_NAMES",
    "TOOL_SCHEMAS",
    "SUMMARY_MAX_CHARS",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutcome",
    "resolve_in_project",
    "run_tool",
    "summarize_arguments",
]

SUMMARY_MAX_CHARS = 80
"""A receipt line in the UI; longer summaries end with "…"."""
_VALUE_PREVIEW_CHARS = 40


def _without_titles(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's generated titles: the model only needs types and descriptions."""
    cleaned: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key == "properties" and isinstance(value, dict):
            value = {name: _without_titles(sub) for name, sub in value.items()}
        cleaned[key] = value
    return cleaned


@dataclass(frozen=True)
class Tool:
    """One tool: its contract (name, description, argument model) and its behaviour."""

    name: str
    description: str
    arguments: type[ToolArguments]
    run: Callable[[Any, ToolContext], ToolOutcome]
    summarize: Callable[[Any], str]

    @property
    def schema(self) -> ToolSchema:
        parameters = _without_titles(self.arguments.model_json_schema())
        # `additionalProperties: false` (pydantic's extra="forbid") is no instruction a model
        # needs: no request asks for strict schemas, and a call with an unknown parameter is
        # refused by name all the same. Left out, 5 tokens a tool (SPEC §15's 1,300).
        parameters.pop("additionalProperties", None)
        return ToolSchema(name=self.name, description=self.description, parameters=parameters)


TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool(
            python_tool.NAME,
            python_tool.DESCRIPTION,
            python_tool.PythonArguments,
            python_tool.run,
            python_tool.summarize,
        ),
        Tool(
            "read_file",
            files.READ_FILE_DESCRIPTION,
            files.ReadFileArguments,
            files.read_file,
            files.summarize_read_file,
        ),
        Tool(
            "write_file",
            files.WRITE_FILE_DESCRIPTION,
            files.WriteFileArguments,
            files.write_file,
            files.summarize_write_file,
        ),
        Tool(
            "edit_file",
            files.EDIT_FILE_DESCRIPTION,
            files.EditFileArguments,
            files.edit_file,
            files.summarize_edit_file,
        ),
        Tool(
            "list_files",
            files.LIST_FILES_DESCRIPTION,
            files.ListFilesArguments,
            files.list_files,
            files.summarize_list_files,
        ),
        Tool(shell.NAME, shell.DESCRIPTION, shell.ShellArguments, shell.run, shell.summarize),
        Tool(
            checkpoint.NAME,
            checkpoint.DESCRIPTION,
            checkpoint.CheckpointArguments,
            checkpoint.run,
            checkpoint.summarize,
        ),
        Tool(
            "read_cells",
            notebook.READ_CELLS_DESCRIPTION,
            notebook.ReadCellsArguments,
            notebook.read_cells,
            notebook.summarize_read_cells,
        ),
        Tool(
            "read_notebook",
            notebook.READ_NOTEBOOK_DESCRIPTION,
            notebook.ReadNotebookArguments,
            notebook.read_notebook,
            notebook.summarize_read_notebook,
        ),
        Tool(
            "add_cell",
            notebook.ADD_CELL_DESCRIPTION,
            notebook.AddCellArguments,
            notebook.add_cell,
            notebook.summarize_add_cell,
        ),
        Tool(
            "edit_cell",
            notebook.EDIT_CELL_DESCRIPTION,
            notebook.EditCellArguments,
            notebook.edit_cell,
            notebook.summarize_edit_cell,
        ),
    )
}
TOOL_NAMES: tuple[str, ...] = tuple(TOOLS)


def generated_schemas() -> tuple[ToolSchema, ...]:
    """The schemas the argument models give; what `soba_nb.agent.tool_schemas` reads from its
    file must be these (tests/agent/test_tool_schemas.py)."""
    return tuple(tool.schema for tool in TOOLS.values())


def run_tool(name: str, arguments: str, ctx: ToolContext) -> ToolOutcome:
    """Run one tool call from the model; every problem becomes an error outcome."""
    tool = TOOLS.get(name)
    if tool is None:
        return ToolOutcome(f"unknown tool '{name}'; known tools: {', '.join(TOOL_NAMES)}", True)
    try:
        parsed = _parse_arguments(tool, arguments)
        return tool.run(parsed, ctx)
    except ToolError as error:
        return ToolOutcome(str(error), is_error=True)
    except Exception as error:
        return ToolOutcome(f"{name}: internal error: {type(error).__name__}: {error}", True)


def summarize_arguments(name: str, arguments: str) -> str:
    """A one-line summary of a call for UI receipts, e.g. `shell: pytest -q (timeout 60s)`."""
    tool = TOOLS.get(name)
    try:
        summary = (
            tool.summarize(_parse_arguments(tool, arguments)) if tool else f"{name} (unknown tool)"
        )
    except Exception:
        summary = f"{name} (invalid arguments)"
    return _one_line(summary)


def _parse_arguments(tool: Tool, arguments: str) -> ToolArguments:
    # Some servers send "" for a call without arguments; that is an empty object.
    text = arguments if arguments.strip() else "{}"
    try:
        # strict=False: models often put raw newlines inside JSON strings (code, file content).
        value = json.loads(text, strict=False)
    except json.JSONDecodeError as error:
        raise ToolError(f"{tool.name}: arguments are not valid JSON ({error})") from error
    except RecursionError:
        raise ToolError(f"{tool.name}: arguments are nested too deeply to read") from None
    if not isinstance(value, dict):
        raise ToolError(f"{tool.name}: arguments must be a JSON object, got {_json_type(value)}")
    try:
        return tool.arguments.model_validate(value)
    except ValidationError as error:
        raise ToolError(_describe_validation_error(tool, error)) from error


def _describe_validation_error(tool: Tool, error: ValidationError) -> str:
    problems = []
    for detail in error.errors():
        parameter = ".".join(str(part) for part in detail["loc"])
        kind = detail["type"]
        if kind == "missing":
            problems.append(f"missing required parameter '{parameter}'")
        elif kind == "extra_forbidden":
            problems.append(f"unknown parameter '{parameter}'")
        else:
            got = detail.get("input")
            shown = _json_type(got) if kind.endswith("_type") else _preview(got)
            problems.append(f"parameter '{parameter}': {detail['msg']} (got {shown})")
    expected = ", ".join(
        name + ("" if field.is_required() else " (optional)")
        for name, field in tool.arguments.model_fields.items()
    )
    return f"{tool.name}: {'; '.join(problems)}; parameters: {expected}"


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _preview(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= _VALUE_PREVIEW_CHARS else text[: _VALUE_PREVIEW_CHARS - 1] + "…"


def _one_line(text: str) -> str:
    """The first line of a summary (an ellipsis when more follows), clipped (`soba_nb.text`)."""
    lines = text.strip().splitlines() or [""]
    line = " ".join(lines[0].split()) + ("…" if len(lines) > 1 and not lines[0].endswith("…") else "")
    return clip(line, SUMMARY_MAX_CHARS)
