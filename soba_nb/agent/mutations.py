"""The names a cell or call changes in place, read with `ast` (never run), for `/rebuild`.

`df["revenue"] = df.price * df.units` binds no name, yet after it `df` is not what the cell
that built it made: a rebuild that re-ran only that cell would hand back a `df` without the
column the later work reads. So besides the names a step binds (`provenance`), it *modifies*
the root name of what it stores into or deletes from (`df[...] =`, `df.attr =`, `df[...] +=`,
`del cfg["key"]`), and the object whose method it calls when the method changes its object
(`rows.append(…)`, `last = rows.pop()`, `arr.sort()`) or is told to (`inplace=True`).

A loop that changes its items changes what it loops over (`for row in rows: row["x"] = …`
changes `rows`). Statements inside functions, classes and lambdas are their own scope and are
not looked at (as for bindings); a call whose arguments are changed by the callee (`fill(df)`)
and other aliases (`r = rows[0]; r["x"] = 1`) cannot be seen from here.
"""

from __future__ import annotations

import ast

MUTATING_METHODS = frozenset(
    {
        # list, dict, set, bytearray, deque
        "append", "extend", "insert", "remove", "pop", "clear", "sort", "reverse", "update",
        "setdefault", "popitem", "add", "discard", "difference_update", "intersection_update",
        "symmetric_difference_update", "appendleft", "extendleft", "popleft", "rotate",
        # numpy arrays
        "fill", "resize", "put", "itemset", "setflags",
    }
)
"""Methods that change the object they are called on."""


def modified_names(statement: ast.stmt) -> set[str]:
    """The names whose objects `statement` changes in place (module scope only)."""
    return _changed(statement)


def _changed(node: ast.AST) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
        return set()
    found: set[str] = set()
    if isinstance(node, ast.Assign):
        found.update(name for target in node.targets for name in _stored_into(target))
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        found.update(_stored_into(node.target))
    elif isinstance(node, ast.Delete):
        found.update(name for target in node.targets for name in _stored_into(target))
    elif isinstance(node, ast.Call) and (name := _changed_by_call(node)) is not None:
        found.add(name)  # `rows.append(x)`, `last = rows.pop()`
    for child in ast.iter_child_nodes(node):
        found |= _changed(child)
    if isinstance(node, ast.For | ast.AsyncFor):
        # `for row in rows: row["revenue"] = …` changes what `rows` holds.
        loop_names = {name.id for name in ast.walk(node.target) if isinstance(name, ast.Name)}
        if loop_names & found:
            found |= _iterated(node.iter)
    return found


def _iterated(node: ast.expr) -> set[str]:
    """The names whose items a loop over `node` visits: `rows` for `rows`, `rows.items()`,
    `enumerate(rows)`, `zip(a, b)`, `df.iterrows()`."""
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute):
            root = _root(node.func.value)
            return {root} if root is not None else set()
        return {name for argument in node.args for name in _iterated(argument)}
    root = _root(node)
    return {root} if root is not None else set()


def _stored_into(target: ast.expr) -> list[str]:
    """`df` for `df["x"]` or `df.x` (a store into the object); nothing for a plain name (a
    binding, not a change); each part of a tuple target."""
    if isinstance(target, ast.Tuple | ast.List):
        return [name for element in target.elts for name in _stored_into(element)]
    if isinstance(target, ast.Starred):
        return _stored_into(target.value)
    if isinstance(target, ast.Subscript | ast.Attribute):
        root = _root(target)
        return [root] if root is not None else []
    return []


def _changed_by_call(call: ast.Call) -> str | None:
    function = call.func
    if not isinstance(function, ast.Attribute):
        return None
    inplace = any(
        keyword.arg == "inplace" and isinstance(keyword.value, ast.Constant) and keyword.value.value is True
        for keyword in call.keywords
    )
    return _root(function.value) if function.attr in MUTATING_METHODS or inplace else None


def _root(node: ast.expr) -> str | None:
    """The name at the root of `a.b[c].d` (`a`), or None (`f().x`, `"s".y`)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None
