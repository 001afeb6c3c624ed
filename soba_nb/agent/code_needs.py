"""What an exported script needs to run, for its header: the packages it imports (with the
versions installed where it was exported), the files it reads, and the names a notebook
provides that a plain interpreter does not (`display`).

Read from the code with `ast`, never by running it. A file is named when a string in the code
is the path of a file that exists (relative to the notebook's folder, where the kernel ran
it); it is *written* when the first call that names it writes (`to_csv`, `savefig`,
`open(…, "w")`, …), else *read*: the script needs the files it reads and makes the others.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

WRITERS = frozenset(
    {
        "to_csv", "to_parquet", "to_excel", "to_json", "to_feather", "to_pickle", "to_hdf",
        "to_html", "to_sql", "savefig", "save", "savez", "savez_compressed", "savetxt",
        "write_text", "write_bytes", "write_image", "write_html", "dump", "touch", "mkdir",
    }
)
"""Calls that make the file a string argument names."""
NOTEBOOK_NAMES = {"display": "from IPython.display import display"}
"""Names IPython puts in a notebook's namespace, and the import a script needs for each."""
MAX_PATH_CHARS = 260


@dataclass
class Needs:
    packages: list[str] = field(default_factory=list)
    """`pandas 2.2.3` (or `pandas` when not installed here), in the order first imported."""
    reads: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)
    """Lines the script adds first (`from IPython.display import display`)."""


def needs_of(codes: Iterable[str], base: Path | None) -> Needs:
    """What the code (the steps, in order, each plain Python) needs; `base`: the folder the
    code ran in (None: files are not looked for)."""
    needs = Needs()
    modules: dict[str, None] = {}
    bound: set[str] = set()
    read_names: set[str] = set()
    files: dict[str, bool] = {}
    for code in codes:
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules.update((alias.name.split(".")[0], None) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules[node.module.split(".")[0]] = None
            if isinstance(node, ast.Import | ast.ImportFrom):
                bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            elif isinstance(node, ast.Name):
                (read_names if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bound.add(node.name)
            elif isinstance(node, ast.Call) and base is not None:
                _files_of_call(node, base, files)
        if base is not None:
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and _is_file(node.value, base):
                    files.setdefault(node.value, False)
    third_party = [module for module in modules if _third_party(module)]
    distributions = metadata.packages_distributions() if third_party else {}
    needs.packages = [_with_version(module, distributions.get(module, [])) for module in third_party]
    needs.reads = [name for name, written in files.items() if not written]
    needs.writes = [name for name, written in files.items() if written]
    needs.imports = [line for name, line in NOTEBOOK_NAMES.items() if name in read_names and name not in bound]
    return needs


def _files_of_call(call: ast.Call, base: Path, files: dict[str, bool]) -> None:
    function = call.func
    name = function.attr if isinstance(function, ast.Attribute) else function.id if isinstance(function, ast.Name) else ""
    writes = name in WRITERS or (name == "open" and _open_mode(call) in "wax")
    for argument in [*call.args, *(keyword.value for keyword in call.keywords)]:
        text = argument.value if isinstance(argument, ast.Constant) else None
        if isinstance(text, str) and (writes or _is_file(text, base)):
            files.setdefault(text, writes)


def _open_mode(call: ast.Call) -> str:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    text = mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else "r"
    return next((letter for letter in text if letter in "rwax"), "r")


def _is_file(text: str, base: Path) -> bool:
    if not text or len(text) > MAX_PATH_CHARS or "\n" in text or "\x00" in text:
        return False
    try:
        return (base / text).is_file()
    except OSError:  # a name too long, a folder we may not read
        return False


def _third_party(module: str) -> bool:
    return module not in sys.stdlib_module_names and module != "__future__"


def _with_version(module: str, distributions: list[str]) -> str:
    for distribution in distributions[:1]:
        try:
            return f"{module} {metadata.version(distribution)}"
        except metadata.PackageNotFoundError:
            break
    return module
