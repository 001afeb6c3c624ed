"""The `python(code, timeout_s)` tool: run code in the notebook's user namespace, as a cell does.

The code is what a cell takes: in a notebook it goes through the shell's input transformers
first (`ToolContext.transform`, IPython's `transform_cell`, the user's own
`input_transformers_post` included), so magics (`%timeit …`, a `%%writefile` cell magic on the
first line), `!command` and `files = !ls` work; outside IPython it is plain Python. It is
executed with the user namespace as its globals, so variables it defines are there for the user
(and for the next call) afterwards. If the last statement is an expression, it is evaluated
separately and its repr is reported, as a notebook cell does.

Output format — sections in this order, each only when non-empty:

    stdout:
    <captured standard output, `!command` output and what magics print included>
    stderr:
    <captured standard error>
    result: <repr of the last expression, clipped to MAX_RESULT_REPR_CHARS>
    error: ValueError: <message>
    traceback (most recent call last):
      File "<soba-python-3>", line 2, in <module>
        raise ValueError("bad")

With none of them the content is `(no output)`. Only frames of code run by this tool appear
in the traceback (library internals are left out); each run gets its own file name
`<soba-python-N>`, registered in `linecache` with the code as the model wrote it, so functions
defined in one call still show their source when they fail in a later one. Line numbers are
the model's: IPython drops leading blank lines, which are put back before compiling; only a
transformation that changes the number of lines (a cell magic) makes linecache hold the
transformed code instead. An exception (including `SystemExit`) makes the outcome an error;
a transformer that raises is a one-line error.

Time limit (`time_limit.TimeLimit`): `timeout_s`, or by default the turn's remaining time
(`ToolContext.turn_deadline`, at least `MIN_DEFAULT_TIMEOUT_S`; no limit outside a turn). At
the limit the code is interrupted in the kernel with a KeyboardInterrupt; the outcome is an
error saying `stopped after N s (timeout_s)` with what the call printed before and where it
was stopped, and the kernel and the variables assigned so far live on. Any other
`KeyboardInterrupt` (the user's) is not caught, so the turn loop can stop the turn.

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
import math
import time
import traceback
from collections.abc import Callable
from types import CodeType, TracebackType
from typing import Any

from pydantic import Field

from soba_nb.agent.tools.base import (
    CLIPPED,
    DisplayCapture,
    DisplayedImage,
    ToolArguments,
    ToolContext,
    ToolOutcome,
    optional_parameter,
)
from soba_nb.agent.tools.time_limit import TimeLimit

NAME = "python"
DESCRIPTION = (
    # Where it runs (the kernel, the user's namespace) the system prompt says.
    "Run code like a cell (IPython syntax works); returns stdout, stderr, the result's repr, errors and images."
    + CLIPPED
)

MAX_RESULT_REPR_CHARS = 20_000
"""A result repr longer than this is clipped (a huge list or string would swamp the output)."""
MAX_TRACEBACK_FRAMES = 8
"""Only the innermost frames: enough to find the line, short enough to read."""
FILENAME_PREFIX = "<soba-python-"
MAX_TIMEOUT_S = 3600
MIN_DEFAULT_TIMEOUT_S = 3
"""The default limit when the turn's time is (nearly) spent: the call still gets a chance."""
STOPPED = "stopped after {seconds:g} s (timeout_s)"

_run_numbers = itertools.count(1)


class PythonArguments(ToolArguments):
    code: str = Field(description="The code.")
    timeout_s: float | None = Field(
        None,
        gt=0,
        le=MAX_TIMEOUT_S,
        description=f"Seconds (at most {MAX_TIMEOUT_S}); default: the turn's time left.",
        json_schema_extra=optional_parameter,
    )


def summarize(arguments: PythonArguments) -> str:
    lines = [line for line in arguments.code.strip().splitlines() if line.strip()]
    first = lines[0].strip() if lines else ""
    limit = "" if arguments.timeout_s is None else f" (timeout {arguments.timeout_s:g}s)"
    return f"python: {first}" + ("…" if len(lines) > 1 else "") + limit


def run(arguments: PythonArguments, ctx: ToolContext) -> ToolOutcome:
    filename = f"{FILENAME_PREFIX}{next(_run_numbers)}>"
    try:
        source, cached = _transformed(arguments.code, ctx.transform)
    except SyntaxError as exception:
        return ToolOutcome(_describe_syntax_error(exception, None), is_error=True)
    except Exception as exception:
        return ToolOutcome(f"error: IPython could not transform the code: {_one_line(exception)}", is_error=True)
    linecache.cache[filename] = (len(cached), None, cached.splitlines(keepends=True), filename)
    seconds = _limit(arguments.timeout_s, ctx.turn_deadline)
    stdout, stderr = _Printed(), _Printed()
    result: Any = None
    error: str | None = None
    shown: list[DisplayedImage] = []
    displays = ctx.displays
    with displays.capture() if displays is not None else contextlib.nullcontext(shown) as shown:
        limit = TimeLimit(seconds) if seconds is not None else None
        interrupted: KeyboardInterrupt | None = None
        try:
            body, last_expression = _compile(source, filename)
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), limit or contextlib.nullcontext():
                if body is not None:
                    exec(body, ctx.namespace)
                if last_expression is not None:
                    result = eval(last_expression, ctx.namespace)
        except SyntaxError as exception:
            error = _describe_syntax_error(exception, filename)
        except KeyboardInterrupt as exception:
            if limit is None or not limit.fired:
                raise  # the user's: the turn stops
            interrupted = exception
        except (Exception, SystemExit) as exception:
            error = _describe_exception(exception)
        finally:
            if limit is not None:
                limit.end()
        if limit is not None and limit.fired:
            # Also when the code caught the interrupt and went on (`!command` does): stopped.
            error = _describe_stopped(limit.seconds, interrupted)
        # A last expression with an image representation (a figure, `Image(...)`) is shown,
        # as a notebook cell shows it; its repr is reported all the same.
        if result is not None and displays is not None:
            _show_image(displays, result)
    sections = []
    for name, stream in (("stdout", stdout), ("stderr", stderr)):
        if printed := stream.getvalue().replace("\r\n", "\n"):  # `!command` output comes from a terminal
            sections.append(f"{name}:\n" + printed.rstrip("\n"))
    if result is not None:
        sections.append("result: " + _clipped_repr(result))
    if error is not None:
        sections.append(error)
    return ToolOutcome("\n".join(sections) or "(no output)", is_error=error is not None, images=tuple(shown))


class _Printed(io.StringIO):
    """What a call prints. It says it is UTF-8, as a kernel's streams do, so what checks
    (`%timeit` writes `±`, else `+-`) prints as it would in a cell."""

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"


def _transformed(code: str, transform: Callable[[str], str] | None) -> tuple[str, str]:
    """The source to compile and the text linecache holds for tracebacks.

    IPython's transformers drop leading blank lines; they are put back, so line numbers are
    the model's. Where the transformed code has as many lines as the code, linecache holds the
    code as written (a traceback shows `!ls`, not `get_ipython().system('ls')`)."""
    if transform is None:
        return code, code
    lines = code.splitlines(keepends=True)
    blank = 0
    while blank < len(lines) and not lines[blank].strip():
        blank += 1
    rest = "".join(lines[blank:])
    source = "\n" * blank + (transform(rest) if rest else "")
    if len(source.splitlines()) == len(lines):
        return source, code
    return source, source


def _limit(timeout_s: float | None, turn_deadline: float | None) -> float | None:
    """The call's limit in seconds: `timeout_s`, else what is left of the turn (None: none)."""
    if timeout_s is not None:
        return timeout_s
    if turn_deadline is None:
        return None
    return float(max(math.ceil(turn_deadline - time.monotonic()), MIN_DEFAULT_TIMEOUT_S))


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


def _describe_syntax_error(exception: SyntaxError, filename: str | None) -> str:
    where = f" (line {exception.lineno})" if exception.lineno else ""
    lines = [f"error: SyntaxError: {exception.msg}{where}"]
    text = exception.text or ""
    if filename is not None and exception.filename == filename and exception.lineno:
        # The line as the model wrote it (linecache), not as IPython transformed it.
        text = linecache.getline(filename, exception.lineno) or text
    if text.strip():
        lines.append("    " + text.strip())
    return "\n".join(lines)


def _one_line(exception: BaseException) -> str:
    try:
        message = str(exception).strip().splitlines()
    except Exception:
        message = ["<message unavailable>"]
    return f"{type(exception).__name__}" + (f": {message[0]}" if message else "")


def _describe_exception(exception: BaseException) -> str:
    try:
        message = str(exception)
    except Exception:
        message = "<message unavailable>"
    return _with_frames(f"error: {type(exception).__name__}" + (f": {message}" if message else ""), exception)


def _describe_stopped(seconds: float, interrupt: KeyboardInterrupt | None) -> str:
    """The time limit's line, and where the code was when it was stopped (None: the code
    caught the interrupt and ended by itself)."""
    return _with_frames("error: " + STOPPED.format(seconds=seconds), interrupt)


def _with_frames(header: str, exception: BaseException | None) -> str:
    frames = _own_frames(exception.__traceback__) if exception is not None else []
    if not frames:
        return header
    shown = traceback.format_list(frames[-MAX_TRACEBACK_FRAMES:])
    return header + "\ntraceback (most recent call last):\n" + "".join(shown).rstrip("\n")


def _own_frames(trace: TracebackType | None) -> list[traceback.FrameSummary]:
    return [
        frame for frame in traceback.extract_tb(trace) if frame.filename.startswith(FILENAME_PREFIX)
    ]
