"""What a step changes in place, read with `ast` (`soba_nb.agent.mutations`), for `/rebuild`."""

from __future__ import annotations

import ast

import pytest

from soba_nb.agent.mutations import modified_names


def changed(code: str) -> list[str]:
    return sorted(set().union(*(modified_names(statement) for statement in ast.parse(code).body)))


@pytest.mark.parametrize(
    ("code", "names"),
    [
        ('df["revenue"] = df.price * df.units', ["df"]),
        ("df.loc[df.x < 0, 'x'] = 0", ["df"]),
        ("model.coef_ = None", ["model"]),
        ("a, b[0] = 1, 2", ["b"]),
        ("counts[key] += 1", ["counts"]),
        ('del cfg["key"]', ["cfg"]),
        ("rows.append(1)", ["rows"]),
        ("last = rows.pop()", ["rows"]),
        ("df.drop(columns=['a'], inplace=True)", ["df"]),
        ("for row in rows:\n    row['r'] = 1", ["row", "rows"]),
        ("for i, row in enumerate(rows):\n    row.update(a=1)", ["row", "rows"]),
        ("for k, v in d.items():\n    v.append(k)", ["d", "v"]),
        ("if ok:\n    seen.add(1)", ["seen"]),
        # nothing changed in place: a binding, a read, a new object, another scope
        ("x = 1", []),
        ("df.head()", []),
        ("clean = df.dropna()", []),
        ("df.drop(columns=['a'], inplace=False)", []),
        ("for x in xs:\n    print(x)", []),
        ("def f():\n    g.append(1)", []),
        ("f = lambda: q.append(1)", []),
        ("class C:\n    items = []\n    items.append(1)", []),
    ],
)
def test_what_a_step_changes_in_place(code: str, names: list[str]) -> None:
    assert changed(code) == names
