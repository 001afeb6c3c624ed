"""Argument handling for the magics: shell-like splitting, `--options` before a verbatim
prompt, `{name}` substitution from the notebook namespace, and `magic_arguments` parsing
that turns a bad argument into a one-line `UsageError` instead of a traceback.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from IPython.core.error import UsageError

PROMPT_VALUE_CHARS = 2_000
"""A `{name}` in a prompt becomes the value's repr, clipped to this many characters: enough
for what a notebook shows of a value (a DataFrame's head, a short list, a message), never a
whole dataset (about 500-700 tokens at most)."""
CLIPPED = "… [clipped]"
_VARIABLE = re.compile(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_]*)\}(?!\})")
_TOKEN = re.compile(r"""\s*("(?:[^"\\]|\\.)*"|'[^']*'|\S+)""")


def split_arguments(text: str) -> list[str]:
    """Shell-like words: quotes group, backslashes stay (Windows paths survive)."""
    lexer = shlex.shlex(text, posix=True)
    lexer.whitespace_split = True
    lexer.escape = ""
    return list(lexer)


def clipped_repr(value: Any, limit: int = PROMPT_VALUE_CHARS) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not break the prompt
        text = f"<{type(value).__name__}: repr failed ({type(exc).__name__})>"
    return text if len(text) <= limit else text[:limit] + CLIPPED


def substitute_variables(prompt: str, namespace: Mapping[str, Any]) -> str:
    """`{name}` → clipped repr of `namespace[name]`; anything else stays as typed."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        return clipped_repr(namespace[name]) if name in namespace else match.group(0)

    return _VARIABLE.sub(replace, prompt)


def split_options(line: str, takes_value: frozenset[str]) -> tuple[list[str], str]:
    """Leading `--options` (with their values) and the rest of the line, verbatim.

    The prompt is not tokenized, so quotes and spacing in it survive; `--` ends options.
    """
    options: list[str] = []
    position = 0
    while match := _TOKEN.match(line, position):
        token = match.group(1)
        if not token.startswith("--"):
            break
        position = match.end()
        if token == "--":
            break
        options.append(token)
        if token in takes_value and (value := _TOKEN.match(line, position)):
            options.append(value.group(1))
            position = value.end()
    return options, line[position:].strip()


def unquote_prompt(prompt: str) -> str:
    """`%soba "clean df"` asks for `clean df`: one pair of matching outer quotes is shell
    habit, not part of the request. Anything else is kept as typed."""
    if len(prompt) >= 2 and prompt[0] == prompt[-1] and prompt[0] in "\"'" and prompt[0] not in prompt[1:-1]:
        return prompt[1:-1].strip()
    return prompt


def parse(func: Callable[..., Any], argv: str | list[str]) -> Any:
    """Parse with the magic's `magic_arguments` parser; errors are one-line `UsageError`s."""
    name = getattr(func, "argcmd_name", func.__name__)
    if isinstance(argv, str):
        try:
            argv = split_arguments(argv)
        except ValueError as exc:
            raise UsageError(f"%{name}: {exc}") from None
    try:
        return getattr(func, "parser").parse_args(argv)  # noqa: B009 - set by magic_arguments
    except UsageError as exc:
        raise UsageError(f"%{name}: {exc}") from None


def error_line(exc: BaseException) -> str:
    """The first line of an error's message (its type name when the message is empty); for
    the system's refusal, the file and the reason (`PATH: Is a directory`), without Python's
    `[Errno 21]`."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror if exc.filename is None else f"{exc.filename}: {exc.strerror}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
