"""The `python(code)` tool: run Python in the notebook's user namespace, like a cell.

The code is executed with the user namespace as its globals, so variables it defines are
there for the user (and for the next call) afterwards. If the last statement is an
expression, it is evaluated separately and its repr is reported, as a notebook cell does.

Output format — sections in this order, each only when non-empty:

    stdout:
    <captured standard output>
    stderr:
    <captured standard error>
    result: <repr of the last expression, clipped to MAX_RESULT_REPR_CHARS>
    error: ValueError: <message>
    traceback (most recent call last):
      File "<soba-python-3>", line 2, in <module>
        raise ValueError("bad")

With none of them the content is `(no output)`. Only frames of code run by this tool appear
in the traceback (library internals are left out); each run gets its own file name
`<soba-python-N>`, registered in `linecache` so functions defined in one call still show
their source when they fail in a later one. An exception (including `SystemExit`) makes the
outcome an error; `KeyboardInterrupt` is not caught, so the turn loop can stop the turn.

Images the call displays (a matplotlib figure under the inline backend, `display(Image(…))`,
a last expression with an image representation) show in the cell as usual and come back in
the outcome (`images`); the turn loop keeps them as artifacts, names them in the content and
sends them to a model that takes images.
"""

from __future__ import annotations

import ast
import contextlib
import io
import itertools
import linecache
import traceback
from types import CodeType, TracebackType
from typing import Any

from pydantic import Field

from soba_nb.agent.tools.base import (
    DisplayCapture,
    DisplayedImage,
    ToolArguments,
    ToolContext,
    ToolOutcome,
)

NAME = "python"
DESCRIPTION = (
    "Run Python in the notebook's kernel, in the user's namespace (their variables are there; "
    "yours stay). Reports stdout, stderr, the last expression's repr and any exception."
)

MAX_RESULT_REPR_CHARS = 20_000
"""A result repr longer than this is clipped (a huge list or string would swamp the output)."""
MAX_TRACEBACK_FRAMES = 8
"""Only the innermost frames: enough to find the line, short enough to read."""
FILENAME_PREFIX = "<soba-python-"

_run_numbers = itertools.count(1)


class PythonArguments(ToolArguments):
    code: str = Field(description="Python source to run; the last expression's repr is reported.")


def summarize(arguments: PythonArguments) -> str:
    lines = [line for line in arguments.code.strip().splitlines() if line.strip()]
    first = lines[0].strip() if lines else ""
    return f"python: {first}" + ("…" if len(lines) > 1 else "")


def run(arguments: PythonArguments, ctx: ToolContext) -> ToolOutcome:
    filename = f"{FILENAME_PREFIX}{next(_run_numbers)}>"
    source = arguments.code
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    stdout, stderr = io.StringIO(), io.StringIO()
    result: Any = None
    error: str | None = None
    shown: list[DisplayedImage] = []
    displays = ctx.displays
    with displays.capture() if displays is not None else contextlib.nullcontext(shown) as shown:
        try:
            body, last_expression = _compile(source, filename)
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                if body is not None:
                    exec(body, ctx.namespace)
                if last_expression is not None:
                    result = eval(last_expression, ctx.namespace)
        except SyntaxError as exception:
            error = _describe_syntax_error(exception)
        except (Exception, SystemExit) as exception:
            error = _describe_exception(exception)
        # A last expression with an image representation (a figure, `Image(...)`) is shown,
        # as a notebook cell shows it; its repr is reported all the same.
        if result is not None and displays is not None:
            _show_image(displays, result)
    sections = []
    if stdout.getvalue():
        sections.append("stdout:\n" + stdout.getvalue().rstrip("\n"))
    if stderr.getvalue():
        sections.append("stderr:\n" + stderr.getvalue().rstrip("\n"))
    if result is not None:
        sections.append("result: " + _clipped_repr(result))
    if error is not None:
        sections.append(error)
    return ToolOutcome("\n".join(sections) or "(no output)", is_error=error is not None, images=tuple(shown))


def _show_image(displays: DisplayCapture, value: Any) -> None:
    """Show `value` when it has an image representation; a broken `_repr_*_` is the user's
    object's problem, never the turn's."""
    with contextlib.suppress(Exception):
        displays.show(value)


def _compile(source: str, filename: str) -> tuple[CodeType | None, CodeType | None]:
    """Split off a trailing expression so it can be evaluated for its value."""
    module = ast.parse(source, filename=filename, mode="exec")
    last_expression = None
    last_statement = module.body[-1] if module.body else None
    if isinstance(last_statement, ast.Expr):
        module.body.pop()
        last_expression = compile(ast.Expression(last_statement.value), filename, "eval")
    body = compile(module, filename, "exec") if module.body else None
    return body, last_expression


def _clipped_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exception:
        return f"<repr failed: {type(exception).__name__}: {exception}>"
    if len(text) > MAX_RESULT_REPR_CHARS:
        hidden = len(text) - MAX_RESULT_REPR_CHARS
        text = text[:MAX_RESULT_REPR_CHARS] + f"… [{hidden} more characters]"
    return text


def _describe_syntax_error(exception: SyntaxError) -> str:
    where = f" (line {exception.lineno})" if exception.lineno else ""
    lines = [f"error: SyntaxError: {exception.msg}{where}"]
    if exception.text:
        lines.append("    " + exception.text.strip())
    return "\n".join(lines)


def _describe_exception(exception: BaseException) -> str:
    try:
        message = str(exception)
    except Exception:
        message = "<message unavailable>"
    header = f"error: {type(exception).__name__}" + (f": {message}" if message else "")
    frames = _own_frames(exception.__traceback__)
    if not frames:
        return header
    shown = traceback.format_list(frames[-MAX_TRACEBACK_FRAMES:])
    return header + "\ntraceback (most recent call last):\n" + "".join(shown).rstrip("\n")


def _own_frames(trace: TracebackType | None) -> list[traceback.FrameSummary]:
    return [
        frame for frame in traceback.extract_tb(trace) if frame.filename.startswith(FILENAME_PREFIX)
    ]
