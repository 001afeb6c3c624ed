"""Transcript benchmarks: `python benchmarks/run.py` prints a Markdown table.

Headline rows (benchmarks/resume_bench.py), on `analysis` sessions of 1k, 10k and 100k
entries (300k with `--large`) with no capsule, and the same sessions ending in a capsule:
resume (open + measure + model input, each timed) in a fresh process against pi's
`SessionManager.open` + `buildSessionContext` and against the orjson parse floor; peak RSS
after resume; the compaction plan against pi's `prepareCompaction`; the summary input; the
cost of every request; appending one entry. pi's figures need pi installed (see
benchmarks/pi_runner.py); without it the table says so in one line and shows ours alone.

The cold rows (benchmarks/cold_bench.py, issue 28): the same session's `.jsonl` alone (opened
cold) and its folder whole (warm), `soba-nb budget` / `inspect` as whole processes and the first
`%soba` of a new kernel, against pi's whole-process resume, interleaved; peak RSS; the first
compaction plan after a cold open; what each turn adds before its request leaves (at 100k).

Then the older rows, on `periodic` sessions (a capsule every 40 turns):

- load: `Transcript.load` against the floor of bare `json.loads` on every line of the same
  file (target: at most 3× the floor);
- count per preflight: append one entry, then measure effective tokens with the engine
  (`Compactor.measure`), which counts only what is new — flat in session length (target: at
  100k entries within 2× of 1k entries);
- the preflight decision, the deterministic capsule and model-input assembly
  (benchmarks/compaction_bench.py).

And the large inputs (benchmarks/large_input_bench.py): redaction throughput, a 50 MB
message appended and the session resumed after it, 100 MB of shell output through the
`shell` tool. And recording the user's cells (benchmarks/cells_bench.py, `--only cells`):
the added cost per cell after 10,000 cells, the record's memory, a cell printing 10 MB. And
what every request carries before any work (benchmarks/prompt_bench.py, `--only prompt`): the
system prompt and tool schemas per kind of counter, and the embedded model's window.

Adding a benchmark: decorate a function `(workspace) -> list[Row]` with `@benchmark("name")`
(here or in a module that imports this one and then calls `main()`); each `Row` is one line
of the table. `workspace` makes the sessions a benchmark asks for, once.
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

try:
    from benchmarks import (
        cells_bench,
        cold_bench,
        compaction_bench,
        large_input_bench,
        prompt_bench,
        resume_bench,
    )
    from benchmarks.generate import LARGE_SIZE, SIZES, compact_session, write_session
    from benchmarks.pi_runner import find_pi
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import cells_bench  # type: ignore[no-redef]
    import cold_bench  # type: ignore[no-redef]
    import compaction_bench  # type: ignore[no-redef]
    import large_input_bench  # type: ignore[no-redef]
    import prompt_bench  # type: ignore[no-redef]
    import resume_bench  # type: ignore[no-redef]
    from generate import LARGE_SIZE, SIZES, compact_session, write_session  # type: ignore[no-redef]
    from pi_runner import find_pi  # type: ignore[no-redef]

from soba_nb.transcript.entries import Entry, MessageEntry, ToolResultEntry
from soba_nb.transcript.store import Transcript

LOAD_TARGET_RATIO = 3.0
PREFLIGHT_TARGET_RATIO = 2.0
PREFLIGHTS = 200
"""Preflights measured per session size (each: append one entry, count what is new)."""
PREFLIGHT_RESULT_BYTES = 4000
"""Size of the tool result appended on every other preflight (like a dataframe repr)."""
PERIODIC_MAX_ENTRIES = 100_000
"""The older `periodic` sessions (1.4 KB an entry) stop here: the headline rows go larger."""
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
    """None when the row has no target (or what it is compared with is absent)."""
    file_bytes: int | None = None


class Workspace:
    """The sessions of one run, generated in a temporary folder the first time they are asked for."""

    def __init__(self, folder: Path, sizes: Sequence[int]):
        self.folder = folder
        self.sizes = tuple(sizes)
        self._periodic: list[Session] | None = None
        self._analysis: dict[tuple[int, bool], Session] = {}
        self.pi, self.pi_line = find_pi()

    def periodic(self) -> list[Session]:
        """`periodic` sessions (a capsule every 40 turns) of every size up to 100k entries."""
        if self._periodic is None:
            sizes = [size for size in self.sizes if size <= PERIODIC_MAX_ENTRIES] or [min(self.sizes)]
            self._periodic = [
                Session(size, write_session(self.folder / f"periodic-{size}", size, kind="periodic", settled=False))
                for size in sizes
            ]
        return self._periodic

    def analysis(self, size: int, *, capsule: bool = False) -> Session:
        """The `analysis` session of `size` entries: no capsule, or the same ending in one."""
        key = (size, capsule)
        if key not in self._analysis:
            if capsule:
                plain = self.analysis(size)
                path = compact_session(plain.path, self.folder / f"analysis-{size}-capsule")
            else:
                path = write_session(self.folder / f"analysis-{size}", size)
            self._analysis[key] = Session(size, path)
        return self._analysis[key]


Benchmark = Callable[[Workspace], list[Row]]
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


def megabytes(count: float) -> str:
    return f"{count / MIB:,.1f} MiB"


def mark(ok: bool | None) -> str:
    return "" if ok is None else ("✓" if ok else "✗ missed")


# -- resume, side by side with pi (the headline) ---------------------------------------------------

resume_bench.register(benchmark, Row, milliseconds, megabytes)
cold_bench.register(benchmark, Row, milliseconds, megabytes)
large_input_bench.register(benchmark, Row, milliseconds, megabytes)


# -- load vs. the parse floor ------------------------------------------------------------------


def parse_floor(path: Path) -> list[object]:
    """The least any loader must do: read the file and `json.loads` every line."""
    return [json.loads(line) for line in path.read_bytes().split(b"\n") if line]


@benchmark("load")
def load_benchmark(workspace: Workspace) -> list[Row]:
    rows = []
    for session in workspace.periodic():
        runs = runs_for(session)
        floor = best_of(runs, lambda s=session: parse_floor(s.path))
        load = best_of(runs, lambda s=session: Transcript.load(s.path))
        ratio = load / floor
        ok = ratio <= LOAD_TARGET_RATIO
        rows.append(
            Row(
                "load, capsule every 40 turns",
                session.entries,
                milliseconds(load),
                f"json.loads floor {milliseconds(floor)}",
                f"{ratio:.2f}×",
                f"≤ {LOAD_TARGET_RATIO:g}× floor",
                ok,
                session.size,
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


def preflight_costs(session: Session, folder: Path) -> tuple[list[float], int | None]:
    """Seconds per preflight, `PREFLIGHTS` times: append one entry, then measure effective
    tokens with the engine (entry counts cached by entry id). Also returns how many full
    recounts the engine's tracker reported after the first preflight, when it reports them."""
    copy = folder / f"preflight-{session.entries}.jsonl"
    shutil.copyfile(session.path, copy)
    with Transcript.open(copy) as store:
        engine = compaction_bench.quiet_compactor(store)
        engine.measure()  # a resumed session's first preflight counts it all
        rebuilds = getattr(engine.tracker, "rebuilds", None)
        costs = []
        source = preflight_entries(seed=7)
        for _ in range(PREFLIGHTS):
            entry = next(source)
            start = time.perf_counter()
            store.append(entry)
            engine.measure()
            costs.append(time.perf_counter() - start)
    copy.unlink()
    after = getattr(engine.tracker, "rebuilds", None)
    return costs, None if rebuilds is None or after is None else after - rebuilds


@benchmark("count per preflight")
def preflight_benchmark(workspace: Workspace) -> list[Row]:
    rows = []
    sessions = workspace.periodic()
    baseline: float | None = None
    name = "count per preflight, capsule every 40 turns"
    for session in sessions:
        costs, rebuilds = preflight_costs(session, workspace.folder)
        if rebuilds:
            raise AssertionError(f"{session.entries}: {rebuilds} full recounts during preflights")
        median = statistics.median(costs)
        result = f"{milliseconds(median)} (mean {milliseconds(statistics.mean(costs))})"
        if baseline is None:
            baseline = median
            rows.append(Row(name, session.entries, result, "baseline (median)", file_bytes=session.size))
            continue
        ratio = median / baseline
        ok = ratio <= PREFLIGHT_TARGET_RATIO
        rows.append(
            Row(
                name,
                session.entries,
                result,
                f"{sessions[0].entries:,} entries {milliseconds(baseline)}",
                f"{ratio:.2f}×",
                f"≤ {PREFLIGHT_TARGET_RATIO:g}× smallest",
                ok,
                session.size,
            )
        )
    return rows


compaction_bench.register(benchmark, Row, milliseconds, preflight_entries)
cells_bench.register(benchmark, Row, milliseconds, megabytes)
prompt_bench.register(benchmark, Row, milliseconds, megabytes)


# -- the table ---------------------------------------------------------------------------------

COLUMNS = ("benchmark", "entries", "file", "result", "compared with", "ratio", "target")


def render(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        file_size = megabytes(row.file_bytes) if row.file_bytes is not None else ""
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


def run(sizes: Sequence[int], folder: Path, names: Sequence[str] | None = None) -> tuple[list[Row], Workspace]:
    """Run the registered benchmarks (or `names`) on sessions generated in `folder`."""
    workspace = Workspace(folder, sizes)
    rows: list[Row] = []
    for name, function in BENCHMARKS.items():
        if names is None or name in names:
            rows.extend(function(workspace))
    return rows, workspace


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Transcript benchmarks (prints a Markdown table).")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=list(SIZES), help="session sizes in entries"
    )
    parser.add_argument(
        "--large", action="store_true", help=f"add {LARGE_SIZE:,} entries (about {resume_bench.LARGE_MINUTES} more minutes)"
    )
    parser.add_argument(
        "--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these benchmarks"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    sizes = sorted(set(args.sizes) | ({LARGE_SIZE} if args.large else set()))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="soba-bench-") as folder:
        rows, workspace = run(sizes, Path(folder), args.only)
        print(render(rows))
    missed = [row for row in rows if row.ok is False]
    print()
    print(workspace.pi_line)
    for note in workspace.pi.notes if workspace.pi else ():
        print(f"note: {note}")
    if LARGE_SIZE not in sizes:
        print(f"{LARGE_SIZE:,} entries: not run (add --large; about {resume_bench.LARGE_MINUTES} more minutes on 2 cores)")
    print(
        f"python {sys.version.split()[0]}; {time.monotonic() - started:,.0f} s; "
        + ("all targets met." if not missed else f"{len(missed)} targets missed.")
    )
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
