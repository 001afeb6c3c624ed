"""One soba-nb process of benchmarks/cold_bench.py; prints one JSON object (its last line).

    python benchmarks/cold_child.py cli budget|inspect SESSION   # the command, output discarded
    python benchmarks/cold_child.py first SESSION [--plan] [--after-load-ext]  # the first %soba of a new kernel
    python benchmarks/cold_child.py turns SESSION TURNS          # what each turn adds before its request
    python benchmarks/cold_child.py floor                        # the interpreter alone: no soba-nb

Only the standard library is imported before the command runs: a `cli` process costs what
`soba-nb COMMAND SESSION` costs (the parent times it from outside).
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

KIB = 1024
CELLS_PER_TURN = 3


def max_rss() -> int:
    """Peak RSS of this process so far, in bytes (`VmHWM`, as `resume_bench._max_rss` reads it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * KIB
    except OSError:  # no /proc: the rusage figure
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB


def cli(command: str, path: Path) -> dict[str, Any]:
    """`soba-nb COMMAND SESSION`, as the console script runs it (`soba_nb.cli.console`)."""
    from soba_nb.cli import console

    sys.argv = ["soba-nb", command, str(path)]
    with contextlib.redirect_stdout(io.StringIO()):
        code = console()
    if code != 0:
        raise SystemExit(f"soba-nb {command} {path} exited {code}")
    return {"rss": max_rss()}


PAUSE_S = 1.0
"""`first --after-load-ext`: the time between `%load_ext soba_nb` and the first `%soba` (a user
typing a request takes longer)."""


def first(path: Path, plan: bool, after_load_ext: bool = False) -> dict[str, Any]:
    """The first `%soba` of a new kernel (soba-nb imported at `%load_ext`): the session opened,
    its preflight's measure, upkeep and trigger decision, and — when nothing is to be
    compacted — the input `request_for_sending` builds. With `plan`: then the compaction plan a
    `hard_limit` trigger starts with (the region's total, the first open call, the cut)."""
    from generate import open_session

    from soba_nb.compaction.planner import plan_cut
    from soba_nb.compaction.triggers import TurnState, decide
    from soba_nb.layout import SessionLayout

    pause = 0.0
    if after_load_ext:  # what `%load_ext soba_nb` starts (soba_nb/notebook/warm_up.py), then the user types
        from generate import bench_config

        from soba_nb.notebook import warm_up

        warm_up.start_for(bench_config())
        time.sleep(PAUSE_S)
        pause = PAUSE_S
    rss_imports = max_rss()
    gc.collect()
    start = time.perf_counter()
    session = open_session(path)
    opened = time.perf_counter()
    compactor, tracker = session.compactor, session.compactor.tracker
    measurement = compactor.measure()
    compactor.keep_extract_snapshots()
    decision = decide(
        effective=measurement.effective, t=compactor.thresholds, intents=tracker.pending_intents,
        turn=TurnState(), guard=tracker.guard,
    )  # fmt: skip
    decided = time.perf_counter()
    result: dict[str, Any] = {"open": opened - start, "preflight": decided - opened, "model_input": 0.0, "pause": pause}
    result["trigger"] = None if decision.trigger is None else decision.trigger.value
    if decision.trigger is None:
        compactor.request_for_sending()
        result["model_input"] = time.perf_counter() - decided
    result["rss"], result["rss_imports"] = max_rss(), rss_imports
    if plan:
        index = SessionLayout(path).tokens  # every count made is added to it: what the plan counted
        lines = len(index.read_bytes().splitlines()) if index.exists() else 0
        begin = time.perf_counter()
        compactor.measure()
        plan_cut(
            session.transcript.path_view(), session.counter, keep_recent_tokens=compactor.thresholds.keep_recent_tokens,
            capsule_at=tracker.capsule_index, facts=tracker.region_facts,
        )  # fmt: skip
        result["plan"] = time.perf_counter() - begin
        result["plan_counted"] = len(index.read_bytes().splitlines()) - lines
    session.close()
    return result


def cells(turn: int) -> list[Any]:
    """The cells a user ran between two turns: a load, a look at the data, a plot that failed."""
    from soba_nb.transcript.entries import CellRecord

    table = "\n".join(f"{row:>4}  north  {1000 + 37 * row + turn:>8}  0.{row:02d}" for row in range(12))
    return [
        CellRecord(execution_count=3 * turn + 1, source=f"df = pd.read_csv('sales_{turn}.csv')\ndf.shape",
                   output=f"({1200 + turn}, 8)"),
        CellRecord(execution_count=3 * turn + 2, source="df.groupby('region').revenue.sum()", output=table),
        CellRecord(execution_count=3 * turn + 3, source=f"df.plot(x='month', y='revenue{turn}')", outcome="error",
                   error=f"KeyError: 'revenue{turn}'\n  File \"<cell>\", line 1"),
    ]  # fmt: skip


def turns(path: Path, count: int) -> dict[str, Any]:
    """What soba adds to each turn before its request leaves, as `TurnRunner.run` and `_loop`
    do it: the cells since the previous turn fitted to `notebook.contextTokens` and appended,
    the user message, the preflight and `request_for_sending`; then (not timed) the answer and
    its usage, as a turn leaves them. Median seconds."""
    import statistics  # here: a `cli` process imports only what the console script would

    from generate import open_session

    from soba_nb.compaction.cells_context import fit_cells
    from soba_nb.compaction.triggers import TurnState
    from soba_nb.transcript.entries import MessageEntry, UsageEntry

    session = open_session(path)
    compactor, append = session.compactor, session.transcript.append
    compactor.request_for_sending()  # resumed: the first request reads what was kept
    times, usage = [], compactor.measure().effective
    for turn in range(count):
        records = cells(turn)
        gc.collect()
        start = time.perf_counter()
        block = fit_cells(records, session.config.notebook.context_tokens, session.counter)
        if block is not None:
            append(block)
        append(MessageEntry(role="user", content=f"Why does the plot of revenue{turn} fail? Fix it."))
        if compactor.preflight(TurnState()) is not None:
            raise SystemExit(f"{path}: a preflight compacted during the per-turn benchmark")
        built = compactor.request_for_sending()
        times.append(time.perf_counter() - start)
        usage = compactor.send_figure(built)
        append(MessageEntry(role="assistant", content=f"The column is called revenue, not revenue{turn}."))
        # The provider's figure for what was sent: the generated session's usage figures are
        # made up, and below our own count of it by more than the clipped part a figure
        # computed from them can be negative, which no provider reports (nor a transcript takes).
        append(UsageEntry(input_tokens=max(usage, 0), output_tokens=40, provider="openai", model="gpt-4o"))
    session.close()
    return {"turn": statistics.median(times), "turn_first": times[0], "rss": max_rss()}


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "floor":
        result = {"rss": max_rss()}
    elif mode == "cli":
        result = cli(argv[1], Path(argv[2]))
    elif mode == "first":
        result = first(Path(argv[1]), plan="--plan" in argv[2:], after_load_ext="--after-load-ext" in argv[2:])
    else:
        result = turns(Path(argv[1]), int(argv[2]))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
