"""Which of the agent's `python` calls built each variable, and which names its work used.

Read from the transcript (the calls and their results on the current path), so it needs no
bookkeeping of its own and survives a kernel restart with the session. The code of each call
is parsed with `ast` (never run): a name bound at module level — assignment targets, `for`
and `with … as` targets, imports, `def`/`class`, `:=` outside functions — is *assigned*; a
name loaded anywhere (a function body reads globals too) is *read*; `del x` unbinds it.

Only calls that succeeded count as producers: a call that raised may have stopped before its
assignment, and re-running it would fail again. A call the tool never answered (cancelled)
does not count either.

The user's own cells (`cell_sources` entries: whole sources, how each ended) are read the same
way, as steps of their own: `builders` names, per variable, the last step that assigned it —
the user's cell `In [3]` or the agent's call — so a restart note can tell the user's variables
from the agent's, and `/rebuild` can re-run both in the order they ran. `producers` and `used`
stay the agent's alone (a capsule marks what the agent built).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from soba_nb.agent.mutations import modified_names
from soba_nb.agent.soba_magics import without_soba_lines
from soba_nb.transcript.entries import CellSourcesEntry, Entry, ToolCallEntry
from soba_nb.transcript.pairing import results_by_call

PYTHON_TOOL = "python"
REBUILD_PREFIX = "rebuild_"
"""The call id of a `/rebuild` re-run (`/code` leaves re-runs out: their code is there once)."""
LABEL_CHARS = 48
"""A call is named by its code's first line, clipped to this."""


@dataclass(frozen=True)
class PythonCall:
    """One `python` call on the path, with what its code binds and reads."""

    entry_id: str
    call_id: str
    code: str
    ok: bool
    assigned: frozenset[str]
    read: frozenset[str]
    deleted: frozenset[str]
    imported: frozenset[str] = frozenset()
    """The assigned names bound by `import` (modules and imported names, not the work)."""
    order: tuple[str, ...] = ()
    """The names it assigned or read, by their last occurrence in the code."""
    cell: int | None = None
    """For the user's cell: its execution count (`In [n]`); None for the agent's call."""
    modified: frozenset[str] = frozenset()
    """Names whose objects it changes in place (`df["x"] = …`, `rows.append(…)`: `mutations`)."""

    @property
    def label(self) -> str:
        """`In [3]` for a cell; for a call its code's first line as its receipt showed it
        (`` `monthly = sales.groupby(…)…` ``): the user and the model know a call by its code,
        neither sees an entry id."""
        if self.cell is not None:
            return f"In [{self.cell}]"
        head = next((line.strip() for line in self.code.splitlines() if line.strip()), "")
        more = len(head) > LABEL_CHARS or len(self.code.strip().splitlines()) > 1
        return f"`{head[:LABEL_CHARS].rstrip()}{'…' if more else ''}`"


@dataclass
class Provenance:
    """The python calls on a path and, per variable, the call that last assigned it."""

    calls: list[PythonCall] = field(default_factory=list)
    producers: dict[str, PythonCall] = field(default_factory=dict)
    """Variable → the last successful call that assigned it (a later `del` removes it)."""
    used: dict[str, None] = field(default_factory=dict)
    """Names the agent's calls assigned or read, least recently used first."""
    steps: list[PythonCall] = field(default_factory=list)
    """The user's recorded cells and the agent's calls, in the order they ran."""
    builders: dict[str, PythonCall] = field(default_factory=dict)
    """Variable → the last successful step, cell or call, that assigned it."""
    changers: dict[str, list[PythonCall]] = field(default_factory=dict)
    """Variable → the successful steps after its builder that changed it in place, in order:
    a rebuild runs them too, or `df` comes back without the column a later cell added."""

    def ranked(self) -> list[str]:
        """Names the agent's work used, most recently used first."""
        return list(reversed(self.used))

    def producing_calls(self, names: Iterable[str]) -> list[PythonCall]:
        """The calls that built `names`, in the order they ran."""
        wanted = {id(self.producers[name]) for name in names if name in self.producers}
        return [call for call in self.calls if id(call) in wanted]


def trace(entries: Iterable[Entry]) -> Provenance:
    """The provenance of the variables built on a path (entries in path order)."""
    entries = list(entries)
    results = results_by_call(entries)  # by order: call ids repeat across answers
    provenance = Provenance()
    for entry in entries:
        if isinstance(entry, CellSourcesEntry):
            for cell in entry.cells:
                step = _step(entry.id, "", without_soba_lines(cell.source), ok=cell.outcome != "error", cell=cell.execution_count)
                if step is not None:
                    _built(provenance.builders, step, provenance.changers)
                    provenance.steps.append(step)
            continue
        if not isinstance(entry, ToolCallEntry) or entry.name != PYTHON_TOOL:
            continue
        result = results.get(entry.id)
        call = _python_call(entry, ok=result is not None and not result.is_error)
        if call is None:
            continue
        provenance.calls.append(call)
        provenance.steps.append(call)
        _built(provenance.builders, call, provenance.changers)
        for name in call.order:
            provenance.used.pop(name, None)
            provenance.used[name] = None
        _built(provenance.producers, call)
    return provenance


def _built(builders: dict[str, PythonCall], step: PythonCall, changers: dict[str, list[PythonCall]] | None = None) -> None:
    """`builders` (and `changers`) after `step` ran: what it assigned is its, what it deleted
    is gone, what it changed in place was changed by it too."""
    if not step.ok:
        return
    for name in step.deleted:
        builders.pop(name, None)
    for name in step.assigned:
        builders[name] = step
        if changers is not None:
            changers[name] = []
    if changers is not None:
        for name in step.modified - step.assigned:
            if name in builders:
                changers.setdefault(name, []).append(step)


def _parsed_as_a_cell(code: str) -> ast.Module | None:
    """Code in IPython syntax (`files = !ls`, `%timeit …`) as the tool ran it: through
    IPython's own input transformation (the static one: a user's own transformers are not
    known here), then parsed; None when it is not Python even then."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return ast.parse(TransformerManager().transform_cell(code))  # type: ignore[no-untyped-call]
    except Exception:  # a transformer's own failure is a refusal too
        return None


def _python_call(entry: ToolCallEntry, *, ok: bool) -> PythonCall | None:
    try:
        arguments = json.loads(entry.arguments)
    except ValueError:
        return None
    code = arguments.get("code") if isinstance(arguments, dict) else None
    if not isinstance(code, str):
        return None
    return _step(entry.id, entry.call_id, code, ok=ok)


def _step(entry_id: str, call_id: str, code: str, *, ok: bool, cell: int | None = None) -> PythonCall | None:
    tree: ast.Module | None
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        tree = _parsed_as_a_cell(code)
    if tree is None:  # the tool refused it too: nothing was bound
        return None
    names = _Names()
    modified: set[str] = set()
    for statement in tree.body:
        names.statement(statement)
        modified |= modified_names(statement)
    public = {name for name in names.assigned if not name.startswith("_")}
    return PythonCall(
        entry_id=entry_id,
        call_id=call_id,
        code=code,
        ok=ok,
        assigned=frozenset(public),
        read=frozenset(name for name in names.read if not name.startswith("_")),
        deleted=frozenset(names.deleted),
        imported=frozenset(public & names.imported),
        order=tuple(name for name in sorted(names.seen, key=names.seen.__getitem__) if not name.startswith("_")),
        cell=cell,
        modified=frozenset(name for name in modified if not name.startswith("_")),
    )


class _Names:
    """Module-level bindings and every load in a module's statements."""

    def __init__(self) -> None:
        self.assigned: set[str] = set()
        self.read: set[str] = set()
        self.deleted: set[str] = set()
        self.imported: set[str] = set()
        self.seen: dict[str, tuple[int, int]] = {}
        """Name → (line, column) of its last occurrence."""

    def statement(self, node: ast.stmt) -> None:
        for child in ast.walk(node):
            if isinstance(child, ast.Name):
                self._see(child.id, child)
            elif isinstance(child, ast.alias):
                self._see((child.asname or child.name).split(".")[0], node)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self._see(child.name, child)
        for name, bound in _module_scope_names(node):
            if isinstance(node, ast.Import | ast.ImportFrom):
                self.imported.add(name)
            else:
                self.imported.discard(name)
            if bound:
                self.assigned.add(name)
                self.deleted.discard(name)
            else:
                self.assigned.discard(name)
                self.deleted.add(name)
        self.read.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))


    def _see(self, name: str, node: ast.AST) -> None:
        position = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        if position >= self.seen.get(name, (-1, -1)):
            self.seen[name] = position


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _module_scope_names(node: ast.AST) -> list[tuple[str, bool]]:
    """(name, bound) for each name `node` binds (True) or deletes (False) in module scope, in
    order: nested functions, classes and lambdas are skipped (only a `def`/`class` name is
    bound), and so are comprehension variables (a `:=` inside one still binds outside)."""
    found: list[tuple[str, bool]] = []

    def visit(current: ast.AST) -> None:
        if isinstance(current, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.append((current.name, True))
            return
        if isinstance(current, ast.Lambda):
            return
        if isinstance(current, ast.Import | ast.ImportFrom):
            found.extend((a.asname or a.name.split(".")[0], True) for a in current.names if a.name != "*")
            return
        if isinstance(current, _COMPREHENSIONS):
            found.extend(
                (n.target.id, True)
                for n in ast.walk(current)
                if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name)
            )
            return
        if isinstance(current, ast.Name) and isinstance(current.ctx, ast.Store | ast.Del):
            found.append((current.id, isinstance(current.ctx, ast.Store)))
        for child in ast.iter_child_nodes(current):
            visit(child)

    visit(node)
    return found
