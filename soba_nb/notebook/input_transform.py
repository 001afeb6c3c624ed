"""Keep a `%soba` prompt that ends with `?` a prompt, not an IPython help request.

IPython reads any line ending in `?` as "show help for the last name", so
`%soba what is in df?` would never reach soba. A cleanup transformer (it runs before
IPython's help detection) rewrites such a line of our magics into the equivalent
`get_ipython().run_line_magic(...)` call, which is exactly what IPython would have run.
"""

from __future__ import annotations

import re
from typing import Any

MAGICS = ("soba", "compact", "capsule", "rewind")
_LINE = re.compile(r"^(?P<indent>[ \t]*)%(?P<name>" + "|".join(MAGICS) + r")(?P<rest>(?:[ \t].*)?)$")


def protect_question_marks(lines: list[str]) -> list[str]:
    """The cell's lines with our magic lines that end in `?` turned into explicit calls."""
    if lines and lines[0].lstrip().startswith("%%"):
        return lines  # a cell magic: its body is the prompt, IPython does not touch it
    out = []
    for line in lines:
        match = _LINE.match(line.rstrip("\n"))
        if match is None or not match["rest"].rstrip().endswith("?"):
            out.append(line)
            continue
        call = f"get_ipython().run_line_magic({match['name']!r}, {match['rest'].strip()!r})"
        out.append(f"{match['indent']}{call}\n")
    return out


def install(shell: Any) -> None:
    if protect_question_marks not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.append(protect_question_marks)


def uninstall(shell: Any) -> None:
    while protect_question_marks in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.remove(protect_question_marks)
