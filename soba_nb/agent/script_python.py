"""A cell or a `python` call as plain Python, for a script that runs with `python` alone.

Notebook code may use IPython's syntax: line magics (`%matplotlib inline`), shell commands
(`!ls`, `files = !ls`), help (`df?`) and cell magics (`%%time`). None of it runs outside
IPython, so each such line becomes `pass` with the line in a comment (the indentation kept, so
a block around it still parses) — but `%time statement` keeps its statement (it runs once) — and `%pip install …` / `!pip install …` is also named in the
script's header. A cell magic whose body is Python (`%%time`, `%%timeit`, `%%capture`,
`%%prun`) keeps its body; any other (`%%bash`, `%%html`, `%%writefile`) is left out whole, its
lines commented. Code that is still not Python afterwards is left out whole the same way:
every line of the result compiles.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

PYTHON_BODY_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
"""Cell magics whose body is Python run as usual."""
IPYTHON_ONLY = "IPython only, left out:"
NOT_PYTHON = "not Python outside IPython, left out:"
_LINE = re.compile(r"^(?P<indent>[ \t]*)(?P<rest>.*)$")
_IPYTHON_LINE = re.compile(
    r"^(?:[%!]"  # %magic, !command
    r"|[A-Za-z_][\w.]*\s*=\s*[%!]"  # files = !ls, t = %timeit -o …
    r"|[A-Za-z_][\w.]*\?{1,2}\s*$"  # df?  np.mean??
    r"|\?{1,2}[A-Za-z_])"  # ?df
)
_TIMED = re.compile(r"^%time\s+(?P<statement>.+)$")
"""`%time statement` runs the statement once: the script keeps it (it may bind a name)."""
_INSTALL = re.compile(r"^[%!]\s*(?:python3?\s+-m\s+)?(?:pip|conda|mamba)\s+install\s+(?P<what>.+)$")


@dataclass
class PlainCode:
    text: str
    """The code as plain Python (compiles)."""
    left_out: list[str] = field(default_factory=list)
    """The IPython-only lines left out (stripped), in order."""
    installs: list[str] = field(default_factory=list)
    """What `%pip install …` lines installed (`pandas==2.2 pyarrow`)."""
    whole_left_out: bool = False
    """The code is not Python even without its IPython lines: all of it is commented."""


def plain_python(code: str) -> PlainCode:
    """`code` as plain Python (see the module docstring)."""
    if _parses(code):
        return PlainCode(code)
    lines = code.splitlines()
    result = PlainCode("")
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and lines[first].lstrip().startswith("%%"):
        magic = lines[first].lstrip()[2:].split(maxsplit=1)[0] if lines[first].lstrip()[2:].strip() else ""
        if magic not in PYTHON_BODY_MAGICS:
            return _commented(code, NOT_PYTHON)
        result.left_out.append(lines[first].strip())
        lines[first] = f"# {IPYTHON_ONLY} {lines[first].strip()}"
    for index, line in enumerate(lines):
        match = _LINE.match(line)
        assert match is not None  # the pattern matches any line
        rest = match["rest"]
        if not _IPYTHON_LINE.match(rest):
            continue
        if (install := _INSTALL.match(rest.strip())) is not None:
            result.installs.append(install["what"].strip())
        if (timed := _TIMED.match(rest.strip())) is not None and _parses(timed["statement"]):
            result.left_out.append("%time")
            lines[index] = f"{match['indent']}{timed['statement']}  # {IPYTHON_ONLY} %time"
        else:
            result.left_out.append(rest.strip())
            lines[index] = f"{match['indent']}pass  # {IPYTHON_ONLY} {rest.strip()}"
    text = "\n".join(lines)
    if not _parses(text):
        return _commented(code, NOT_PYTHON)
    result.text = text
    return result


def _commented(code: str, why: str) -> PlainCode:
    body = "\n".join(f"# {line}" if line.strip() else "#" for line in code.splitlines())
    return PlainCode(f"# ({why})\n{body}", whole_left_out=True)


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True
