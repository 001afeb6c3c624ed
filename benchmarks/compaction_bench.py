"""Compaction benchmarks on the `periodic` sessions (a capsule every 40 turns), registered
into `run.py`'s table (imported by it).

- preflight decision: append one entry, then `Compactor.preflight` when no trigger fires
  (measurement, pending intents, trigger rules) — target flat (≤ 2× from the smallest to
  the largest session) and under 1 ms at 100k entries (median);
- deterministic capsule build for a ~200k-token history — target < 100 ms;
- model-input assembly of the next request at each size (no target; reported).
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from itertools import islice
from typing import Any

try:
    from benchmarks.generate import MODEL, PROVIDER
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    from generate import MODEL, PROVIDER  # type: ignore[no-redef]

from soba_nb.agent.prompt import SYSTEM_PROMPT
from soba_nb.agent.tools import TOOL_SCHEMAS
from soba_nb.compaction.compactor import Compactor, CompactorSettings
from soba_nb.compaction.deterministic import build_deterministic_capsule
from soba_nb.compaction.limits import soft_limit
from soba_nb.compaction.model_input import entry_tokens
from soba_nb.compaction.triggers import Thresholds, TurnState
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.store import Transcript

PREFLIGHTS = 200
DECISION_TARGET_MS = 1.0
DECISION_TARGET_RATIO = 2.0
DETERMINISTIC_TOKENS = 200_000
DETERMINISTIC_TARGET_MS = 100.0
NEVER = 10**9
"""Thresholds so high that no trigger fires: the benchmark measures the decision alone."""


def _quiet_thresholds() -> Thresholds:
    return Thresholds(
        hard_limit=NEVER, soft_limit=soft_limit(NEVER, NEVER, 0.8), auto=True,
        compact_on_turn_complete=True, compact_on_milestone=True,
        min_tokens_for_auto_compact=NEVER, min_reclaimable_tokens=NEVER,
        min_savings_ratio=0.25, keep_recent_tokens=20_000,
    )


def quiet_compactor(store: Transcript) -> Compactor:
    """The engine of the benchmark model on `store`, with thresholds no trigger reaches."""
    counter = TokenCounter.for_model(PROVIDER, MODEL)
    settings = CompactorSettings(_quiet_thresholds(), timeout_ms=15_000, max_output_tokens=8000, session_id="bench")
    return Compactor(store, counter, settings, system=SYSTEM_PROMPT, tools=TOOL_SCHEMAS)


def register(benchmark: Callable[[str], Callable[[Any], Any]], row: type, ms: Callable[[float], str], entries: Callable[[int], Any]) -> None:
    """Register the compaction benchmarks into run.py's table."""

    @benchmark("preflight decision")
    def decision(workspace: Any) -> list[Any]:
        rows: list[Any] = []
        baseline: float | None = None
        sessions = workspace.periodic()
        name = "preflight decision, capsule every 40 turns"
        for session in sessions:
            copy = workspace.folder / f"decision-{session.entries}.jsonl"
            shutil.copyfile(session.path, copy)
            with Transcript.open(copy) as store:
                engine = quiet_compactor(store)
                engine.preflight(TurnState())  # a resumed session's first preflight counts it all
                costs = []
                for entry in islice(entries(7), PREFLIGHTS):
                    store.append(entry)
                    start = time.perf_counter()
                    engine.preflight(TurnState())
                    costs.append(time.perf_counter() - start)
            copy.unlink()
            median = statistics.median(costs)
            under = median * 1000 <= DECISION_TARGET_MS
            if baseline is None:
                baseline = median
                rows.append(row(name, session.entries, ms(median), "baseline (median)",
                                "", f"< {DECISION_TARGET_MS:g} ms", under, session.size))
                continue
            ratio = median / baseline
            rows.append(row(
                name, session.entries, ms(median),
                f"{sessions[0].entries:,} entries {ms(baseline)}", f"{ratio:.2f}×",
                f"≤ {DECISION_TARGET_RATIO:g}× smallest, < {DECISION_TARGET_MS:g} ms",
                ratio <= DECISION_TARGET_RATIO and under, session.size,
            ))
        return rows

    @benchmark("deterministic capsule")
    def deterministic(workspace: Any) -> list[Any]:
        largest = workspace.periodic()[-1]
        store = Transcript.load(largest.path)
        counter = TokenCounter.for_model(PROVIDER, MODEL)
        history, tokens = [], 0
        for entry in store.path_view():
            history.append(entry)
            tokens += entry_tokens(entry, counter)
            if tokens >= DETERMINISTIC_TOKENS:
                break
        times = []
        for _ in range(5):
            start = time.perf_counter()
            build_deterministic_capsule(history, previous=None)
            times.append(time.perf_counter() - start)
        best = min(times) * 1000
        return [row("deterministic capsule", len(history), f"{best:,.1f} ms for {tokens:,} tokens", "", "",
                    f"< {DETERMINISTIC_TARGET_MS:g} ms", best < DETERMINISTIC_TARGET_MS)]

    @benchmark("model-input assembly")
    def assembly(workspace: Any) -> list[Any]:
        rows = []
        for session in workspace.periodic():
            engine = quiet_compactor(Transcript.load(session.path))
            engine.measure()
            times = []
            for _ in range(5):
                start = time.perf_counter()
                built = engine.model_input()
                times.append(time.perf_counter() - start)
            result = f"{ms(min(times))} ({len(built.messages)} messages, {built.tokens:,} tokens)"
            rows.append(row("model-input assembly, capsule every 40 turns", session.entries, result, file_bytes=session.size))
        return rows
