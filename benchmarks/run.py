"""Transcript benchmarks: `python benchmarks/run.py` prints a Markdown table.

For sessions of 1k, 10k and 100k entries (benchmarks/generate.py, written to a temporary
folder) it measures:

- load: `Transcript.load` against the floor of bare `json.loads` on every line of the same
  file (target: at most 3× the floor);
- count per preflight: append one entry, then measure effective tokens with the agent's
  incremental `BudgetTracker`, which counts only what is new (`TokenCounter.cached` keyed by
  entry id) — the cost must not grow with the session (target: at 100k entries within 2×
  of 1k entries);
- peak memory of a load (tracemalloc).

Adding a benchmark: decorate a function `(sessions) -> list[Row]` with `@benchmark("name")`
(here or in a module that imports this one and then calls `main()`); each `Row` is one line
of the table.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

try:
    from benchmarks import compaction_bench
    from benchmarks.generate import SIZES, write_session
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import compaction_bench  # type: ignore[no-redef]
    from generate import SIZES, write_session  # type: ignore[no-redef]

from soba_nb.agent.session import SYSTEM_PROMPT
from soba_nb.agent.tools import TOOL_SCHEMAS
from soba_nb.cli import model_of
from soba_nb.compaction.budget import BudgetTracker
from soba_nb.compaction.model_input import fixed_tokens
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import Entry, MessageEntry, ToolResultEntry
from soba_nb.transcript.store import Transcript

LOAD_TARGET_RATIO = 3.0
PREFLIGHT_TARGET_RATIO = 2.0
PREFLIGHTS = 200
"""Preflights measured per session size (each: append one entry, count what is new)."""
PREFLIGHT_RESULT_BYTES = 4000
"""Size of the tool result appended on every other preflight (like a dataframe repr)."""
MIB = 1024 * 1024


@dataclass(frozen=True)
class Session:
    """A generated session file."""

    entries: int
    path: Path

    @property
    def size(self) -> int:
        return self.path.stat().st_size


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    benchmark: str
    entries: int
    result: str
    compared_with: str = ""
    ratio: str = ""
    target: str = ""
    ok: bool | None = None
    """None when the row has no target."""


Benchmark = Callable[[Sequence[Session]], list[Row]]
BENCHMARKS: dict[str, Benchmark] = {}


def benchmark(name: str) -> Callable[[Benchmark], Benchmark]:
    """Register a benchmark; it runs after those registered before it."""

    def register(function: Benchmark) -> Benchmark:
        if name in BENCHMARKS:
            raise ValueError(f"benchmark {name!r} is registered twice")
        BENCHMARKS[name] = function
        return function

    return register


# -- helpers ---------------------------------------------------------------------------------


def best_of(runs: int, function: Callable[[], object]) -> float:
    """The fastest of `runs` timed calls, in seconds, each from a collected heap."""
    times = []
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def runs_for(session: Session) -> int:
    return 5 if session.entries <= 10_000 else 3


def milliseconds(seconds: float) -> str:
    return f"{seconds * 1000:,.2f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def megabytes(count: int) -> str:
    return f"{count / MIB:,.1f} MiB"


def mark(ok: bool | None) -> str:
    return "" if ok is None else ("✓" if ok else "✗ missed")


# -- load vs. the parse floor ------------------------------------------------------------------


def parse_floor(path: Path) -> list[object]:
    """The least any loader must do: read the file and `json.loads` every line."""
    return [json.loads(line) for line in path.read_bytes().split(b"\n") if line]


@benchmark("load")
def load_benchmark(sessions: Sequence[Session]) -> list[Row]:
    rows = []
    for session in sessions:
        runs = runs_for(session)
        floor = best_of(runs, lambda s=session: parse_floor(s.path))
        load = best_of(runs, lambda s=session: Transcript.load(s.path))
        ratio = load / floor
        ok = ratio <= LOAD_TARGET_RATIO
        rows.append(
            Row(
                "load",
                session.entries,
                milliseconds(load),
                f"json.loads floor {milliseconds(floor)}",
                f"{ratio:.2f}×",
                f"≤ {LOAD_TARGET_RATIO:g}× floor",
                ok,
            )
        )
    return rows


# -- incremental counting per preflight --------------------------------------------------------


def preflight_entries(seed: int) -> Iterator[Entry]:
    """What a session appends between preflights: user messages and multi-KB tool results."""
    rng = random.Random(seed)
    words = ("revenue", "region", "cohort", "median", "merge", "pivot", "null", "plot")
    index = 0
    while True:
        if index % 2:
            lines = [
                f"{row:>5}  {rng.choice(words):>8}  {rng.uniform(0, 1e6):>12.2f}"
                for row in range(130)
            ]
            content = "\n".join(lines)[:PREFLIGHT_RESULT_BYTES]
            yield ToolResultEntry(call_id=f"call_{index}", name="python", content=content)
        else:
            yield MessageEntry(role="user", content=" ".join(rng.choice(words) for _ in range(40)))
        index += 1


def preflight_costs(session: Session, folder: Path) -> tuple[list[float], int]:
    """Seconds per preflight, `PREFLIGHTS` times: append one entry, then measure effective
    tokens with the agent's own incremental tracker (entry counts cached by entry id).
    Also returns how many full rebuilds the tracker did after the first preflight."""
    copy = folder / f"preflight-{session.entries}.jsonl"
    shutil.copyfile(session.path, copy)
    with Transcript.open(copy) as store:
        counter = TokenCounter.for_model(*model_of(store))
        tracker = BudgetTracker(counter, fixed_tokens(SYSTEM_PROMPT, TOOL_SCHEMAS, counter))
        tracker.measure(store.path_view())  # a resumed session's first preflight counts it all
        rebuilds = tracker.rebuilds
        costs = []
        source = preflight_entries(seed=7)
        for _ in range(PREFLIGHTS):
            entry = next(source)
            start = time.perf_counter()
            store.append(entry)
            tracker.measure(store.path_view())
            costs.append(time.perf_counter() - start)
    copy.unlink()
    return costs, tracker.rebuilds - rebuilds


@benchmark("count per preflight")
def preflight_benchmark(sessions: Sequence[Session]) -> list[Row]:
    rows = []
    folder = sessions[0].path.parent
    baseline: float | None = None
    for session in sessions:
        costs, rebuilds = preflight_costs(session, folder)
        if rebuilds:
            raise AssertionError(f"{session.entries}: {rebuilds} full recounts during preflights")
        median = statistics.median(costs)
        result = f"{milliseconds(median)} (mean {milliseconds(statistics.mean(costs))})"
        if baseline is None:
            baseline = median
            rows.append(Row("count per preflight", session.entries, result, "baseline (median)"))
            continue
        ratio = median / baseline
        ok = ratio <= PREFLIGHT_TARGET_RATIO
        rows.append(
            Row(
                "count per preflight",
                session.entries,
                result,
                f"{sessions[0].entries:,} entries {milliseconds(baseline)}",
                f"{ratio:.2f}×",
                f"≤ {PREFLIGHT_TARGET_RATIO:g}× smallest",
                ok,
            )
        )
    return rows


# -- memory ------------------------------------------------------------------------------------


@contextmanager
def traced() -> Iterator[Callable[[], int]]:
    gc.collect()
    tracemalloc.start()
    try:
        yield lambda: tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@benchmark("peak memory (load)")
def memory_benchmark(sessions: Sequence[Session]) -> list[Row]:
    rows = []
    for session in sessions:
        with traced() as peak:
            Transcript.load(session.path)
            used = peak()
        rows.append(
            Row(
                "peak memory (load)",
                session.entries,
                megabytes(used),
                f"file {megabytes(session.size)}",
                f"{used / session.size:.1f}× file",
            )
        )
    return rows


compaction_bench.register(benchmark, Row, milliseconds, preflight_entries)


# -- the table ---------------------------------------------------------------------------------

COLUMNS = ("benchmark", "entries", "file", "result", "compared with", "ratio", "target")


def render(rows: Sequence[Row], sessions: Sequence[Session]) -> str:
    sizes = {session.entries: session.size for session in sessions}
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        file_size = megabytes(sizes[row.entries]) if row.entries in sizes else ""
        target = f"{row.target} {mark(row.ok)}".strip()
        cells = (
            row.benchmark,
            f"{row.entries:,}",
            file_size,
            row.result,
            row.compared_with,
            row.ratio,
            target,
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(
    sizes: Sequence[int], folder: Path, names: Sequence[str] | None = None
) -> tuple[list[Row], list[Session]]:
    """Generate the sessions in `folder` and run the registered benchmarks (or `names`)."""
    sessions = [
        Session(size, write_session(folder / f"session-{size}.jsonl", size)) for size in sizes
    ]
    rows: list[Row] = []
    for name, function in BENCHMARKS.items():
        if names is None or name in names:
            rows.extend(function(sessions))
    return rows, sessions


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Transcript benchmarks (prints a Markdown table).")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=list(SIZES), help="session sizes in entries"
    )
    parser.add_argument(
        "--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these benchmarks"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="soba-bench-") as folder:
        rows, sessions = run(sorted(args.sizes), Path(folder), args.only)
        print(render(rows, sessions))
    missed = [row for row in rows if row.ok is False]
    print()
    print(
        f"python {sys.version.split()[0]}; targets: load ≤ {LOAD_TARGET_RATIO:g}× the parse floor, "
        f"count per preflight at the largest size ≤ {PREFLIGHT_TARGET_RATIO:g}× the smallest; "
        + ("all met." if not missed else f"{len(missed)} missed.")
    )
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
