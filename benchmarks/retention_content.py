"""Long, realistic tool outputs for the retention benchmark's synthetic sessions.

Everything here is filler that makes a session long the way real sessions are long —
dataframe reprs, `describe()` tables, CSV samples, source files, test and lint logs — in the
exact formats soba-nb's tools report (`exit status: N` first for `shell`; `result:` /
`error:` sections for `python`). None of it contains a planted fact's key string: facts are
planted by `retention_sessions`, never by chance here.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

WORDS = (
    "value", "column", "region", "cohort", "pivot", "merge", "groupby", "index", "null",
    "outlier", "histogram", "quantile", "feature", "window", "join", "filter", "schema",
    "dtype", "timestamp", "resample", "rolling", "segment", "bucket", "rate", "count",
    "sum", "mean", "share", "trend", "lag", "bin", "weight", "label", "sample", "score",
)  # fmt: skip
VERBS = ("checks", "computes", "returns", "drops", "fills", "aggregates", "normalizes", "joins")


REMARKS = (
    "The {column} distribution is right-skewed: half the rows are below {a} and the top 1% sits above {b}.",
    "About {p}% of the {frame} rows fall in the largest {segment} group.",
    "There is no obvious seasonality in {column}; the monthly means stay within {p}% of each other.",
    "{column} and {other} move together (Spearman {r}).",
    "Nothing unusual in the tail of {column} beyond a handful of values near {b}.",
    "The sample looks consistent with the data dictionary.",
    "This was only a look at the data; nothing was changed.",
    "The {segment} groups differ mostly in volume, not in {column}.",
    "Roughly {p}% of {column} values are exact duplicates, which is expected for this field.",
)
STEP_TEXTS = (
    "Let me look at {column} in {frame}.",
    "I'll check {column} first.",
    "A quick look at {frame} by {segment}.",
    "Let me pull a sample of {frame}.",
    "Checking the raw file directly.",
)


def remark(rng: random.Random, frame: str = "table", column: str = "value", other: str = "target",
           segment: str = "segment", templates: Sequence[str] = REMARKS) -> str:
    """One plain sentence an assistant says about the data (no planted key in it)."""
    return rng.choice(templates).format(
        frame=frame, column=column, other=other, segment=segment, p=rng.randint(2, 60),
        a=f"{rng.uniform(1, 300):.1f}", b=f"{rng.uniform(300, 9000):.0f}", r=f"{rng.uniform(-0.6, 0.9):.2f}",
    )


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def sentence(rng: random.Random, count: int) -> str:
    return words(rng, count).capitalize() + "."


def _cell(rng: random.Random, column: str, row: int) -> str:
    if column.endswith(("_id", "id")):
        return str(100000 + row * 7 + rng.randint(0, 6))
    if column.endswith(("_date", "_at", "month")):
        return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if column in ("region", "plan", "channel", "segment", "type", "store", "country"):
        return rng.choice(("north", "south", "east", "west", "basic", "pro", "web", "app"))
    return f"{rng.uniform(0, 500):.2f}"


def frame_repr(rng: random.Random, columns: Sequence[str], total_rows: int, shown: int = 5) -> str:
    """A pandas-style DataFrame repr: head, `...`, tail, then `[N rows x M columns]`."""
    widths = [max(len(c), 10) for c in columns]
    lines = ["       " + "  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    indexes = [*range(shown), *range(total_rows - shown, total_rows)]
    for position, index in enumerate(indexes):
        if position == shown:
            lines.append("...    " + "  ".join("...".rjust(w) for w in widths))
        cells = (_cell(rng, c, index).rjust(w) for c, w in zip(columns, widths, strict=True))
        lines.append(f"{index:<7}" + "  ".join(cells))
    lines.append("")
    lines.append(f"[{total_rows} rows x {len(columns)} columns]")
    return "\n".join(lines)


def describe_table(rng: random.Random, columns: Sequence[str], rows: int) -> str:
    """`df.describe()` of the numeric columns."""
    numeric = [c for c in columns if not c.endswith(("_id", "_date", "_at"))] or list(columns)
    lines = ["        " + "".join(c.rjust(16) for c in numeric)]
    for stat in ("count", "mean", "std", "min", "25%", "50%", "75%", "max"):
        if stat == "count":
            values = [f"{rows - rng.randint(0, rows // 10):.1f}" for _ in numeric]
        else:
            values = [f"{rng.uniform(-50, 900):.4f}" for _ in numeric]
        lines.append(stat.ljust(8) + "".join(v.rjust(16) for v in values))
    return "\n".join(lines)


def value_counts(rng: random.Random, label: str, count: int) -> str:
    """A `value_counts()` Series repr of `count` rows."""
    lines = [label]
    for index in range(count):
        lines.append(f"{rng.choice(WORDS)}_{index:<14}{rng.randint(3, 9000)}")
    lines.append(f"Name: count, Length: {count}, dtype: int64")
    return "\n".join(lines)


def title_of(path: str) -> str:
    """A document's title from its file name (never the path itself, a planted key)."""
    if "/" not in path and "." not in path:
        return "Project targets"  # `Makefile`: its name is its whole path
    return path.rsplit("/", 1)[-1].split(".", 1)[0].replace("_", " ").capitalize()


def csv_sample(rng: random.Random, columns: Sequence[str], rows: int) -> str:
    lines = [",".join(columns)]
    lines += [",".join(_cell(rng, c, index) for c in columns) for index in range(rows)]
    return "\n".join(lines)


def source_module(rng: random.Random, module: str, functions: Sequence[str], extra: int) -> str:
    """A Python source file defining `functions` and `extra` helpers."""
    parts = [f'"""{module}: {words(rng, 10)}."""\n\nimport numpy as np\nimport pandas as pd\n']
    names = [*functions, *(f"_{rng.choice(WORDS)}_{rng.choice(WORDS)}_{i}" for i in range(extra))]
    for name in names:
        column, other = rng.choice(WORDS), rng.choice(WORDS)
        parts.append(
            f"\n\ndef {name}(df: pd.DataFrame) -> pd.DataFrame:\n"
            f'    """{rng.choice(VERBS).capitalize()} the {column} {words(rng, 8)}."""\n'
            f"    out = df.copy()\n"
            f"    out[{column!r}] = out[{other!r}].fillna(0).rolling({rng.randint(2, 30)}).mean()\n"
            f"    out = out[out[{column!r}] >= {rng.uniform(0, 5):.2f}]\n"
            f"    return out.groupby({rng.choice(WORDS)!r}, as_index=False).agg("
            f"{rng.choice(('sum', 'mean', 'max'))!r})\n"
        )
    return "".join(parts)


def markdown_doc(rng: random.Random, title: str, sections: int) -> str:
    parts = [f"# {title}\n"]
    for _ in range(sections):
        parts.append(f"\n## {words(rng, 3).title()}\n\n{sentence(rng, 30)} {sentence(rng, 24)}\n")
        parts.extend(f"- `{rng.choice(WORDS)}_{rng.choice(WORDS)}`: {sentence(rng, 9)}\n" for _ in range(6))
    return "".join(parts)


def pytest_log(rng: random.Random, test_file: str, tests: int, failures: Sequence[tuple[str, str]]) -> str:
    """The `shell` tool's output of a pytest run (exit status first, as the tool reports it)."""
    failed_names = {name for name, _ in failures}
    names = [name for name, _ in failures] + [f"test_{rng.choice(WORDS)}_{i}" for i in range(tests - len(failures))]
    rng.shuffle(names)
    lines = [f"exit status: {1 if failures else 0}", "=" * 30 + " test session starts " + "=" * 30]
    lines += [f"{test_file}::{name} {'FAILED' if name in failed_names else 'PASSED'}" for name in names]
    for name, error in failures:
        lines += ["", "_" * 20 + f" {name} " + "_" * 20, "", f"    def {name}():"]
        lines += [f"        {words(rng, 6)}" for _ in range(rng.randint(6, 14))]
        lines += [f">       {words(rng, 5)}", f"E       {error}", "", f"{test_file}:{rng.randint(10, 200)}: {error.split(':')[0]}"]
    summary = f"{len(failures)} failed, {tests - len(failures)} passed" if failures else f"{tests} passed"
    lines.append("=" * 20 + f" {summary} in {rng.uniform(0.5, 12):.2f}s " + "=" * 20)
    return "\n".join(lines)


def lint_log(rng: random.Random, problems: int, status: int) -> str:
    """The `shell` tool's output of a linter run that found `problems` problems."""
    lines = [f"exit status: {status}", "ruff check src tests"]
    for _ in range(problems):
        code = rng.choice(("E501 Line too long", "F401 imported but unused", "B008 call in default argument",
                           "UP006 use `list` instead of `List`", "SIM108 use ternary operator"))
        lines.append(f"src/{rng.choice(('clean', 'features', 'pipeline', 'utils'))}.py:{rng.randint(1, 300)}:{rng.randint(1, 80)}: {code}")
    lines.append(f"Found {problems} errors.")
    lines.append(f"make: *** [lint] Error {status}")
    return "\n".join(lines)


def python_error(error: str, code: str, run: int) -> str:
    """The `python` tool's report of an exception (its format, own frames only)."""
    first = code.splitlines()[0]
    return (
        f"error: {error}\ntraceback (most recent call last):\n"
        f'  File "<soba-python-{run}>", line 1, in <module>\n    {first}\n'
        f'  File "<soba-python-{run - 3}>", line 14, in build\n    out = out.join(lookup, on=key)'
    )
