"""Resume at scale, side by side with pi: the headline rows of `benchmarks/run.py`.

For each size, on an `analysis` session with no capsule and on the same session ending in a
capsule (benchmarks/generate.py), every run is a fresh process, as a restarted kernel is:

- resume: `assembly.open_session(...)` on the transcript (open: the store, the token index, the
  compactor), then `Compactor.measure()`, then `Compactor.model_input()`, each timed; peak RSS
  (`ru_maxrss`) read right after, and after the imports alone;
- no capsule: then the compaction plan (`plan_cut` on the path, as `Compactor` plans a
  `%compact`), the summary input for that plan (`build_summary_prompt`, called as
  `barrier.py` calls it), and appending entries;
- ends in a capsule: then what every request costs (`preflight` + `request_for_sending`,
  as the turn loop calls them) after each appended entry that asks the model;
- the parse floor: another fresh process reads the file and `orjson.loads` every line
  (collector off: the least any loader must do).

pi's side (benchmarks/pi_resume.mjs) runs on the same session in pi's format
(benchmarks/pi_session.py), interleaved run by run with ours: soba-nb, pi, soba-nb, pi.
Times are the best run; RSS the largest. A child prints one JSON object:

    python benchmarks/resume_bench.py soba SESSION VARIANT APPENDS BUDGET_S
    python benchmarks/resume_bench.py floor SESSION
"""

from __future__ import annotations

import functools
import gc
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

try:
    from benchmarks.generate import analysis_rounds, open_session
    from benchmarks.pi_runner import PiSetup, run_pi
    from benchmarks.pi_session import PiConverter, write_pi_session
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    from generate import analysis_rounds, open_session  # type: ignore[no-redef]
    from pi_runner import PiSetup, run_pi  # type: ignore[no-redef]
    from pi_session import PiConverter, write_pi_session  # type: ignore[no-redef]

BEST_OF = 5
"""Repetitions of an in-process operation (plan, summary input), within `OPERATION_BUDGET_S`."""
OPERATION_BUDGET_S = 3.0
APPEND_ROUNDS = 10
"""Rounds (5 entries each) appended after a resume: 50 appends, 20 requests."""
APPEND_SEED = 7
KIB = 1024
STATUS = Path("/proc/self/status")


def runs_for(entries: int) -> int:
    """Fresh-process runs per side and variant: fewer for the big sessions."""
    return 5 if entries <= 10_000 else 3 if entries <= 100_000 else 2


# -- the child processes ----------------------------------------------------------------------


def _max_rss() -> int:
    """Peak RSS of this process so far, in bytes.

    `VmHWM` (the high-water mark of this process's own memory), not `getrusage`: on Linux
    `ru_maxrss` of a child also carries its parent's RSS at the time it was spawned (exec
    folds the parent's memory, briefly shared, into it), so every child of a big benchmark
    process would report at least the parent's size. pi's side reads the same figure.
    """
    try:
        for line in STATUS.read_text(encoding="ascii").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * KIB
    except OSError:  # no /proc (macOS): the rusage figure, with the caveat above
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB


def _best_of(function: Callable[[], Any]) -> tuple[float, Any]:
    best, value, started = float("inf"), None, time.perf_counter()
    for _ in range(BEST_OF):
        gc.collect()
        start = time.perf_counter()
        value = function()
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() - started > OPERATION_BUDGET_S:
            break
    return best, value


def _plan(session: Any) -> Any:
    """The cut a `%compact` plans now (`Compactor` calls `plan_cut` so)."""
    from soba_nb.compaction.planner import plan_cut

    session.compactor.measure()
    return plan_cut(
        session.transcript.path_view(),
        session.counter,
        keep_recent_tokens=session.compactor.thresholds.keep_recent_tokens,
        capsule_at=session.compactor.tracker.capsule_index,
        facts=session.compactor.tracker.region_facts,
    )


def _summary_input(session: Any, cut: Any) -> Any:
    """The summarizer's request for `cut`, built as `barrier._summarize` builds it."""
    from soba_nb.compaction.capsule import parse_capsule
    from soba_nb.compaction.extract_snapshots import ExtractSnapshots
    from soba_nb.compaction.summary_prompt import build_summary_prompt

    # The snapshots are read from the file each time, as a kernel that resumed would read them.
    snapshots = ExtractSnapshots(session.transcript.file)
    previous = None if cut.previous is None else parse_capsule(cut.previous.content, require_all=False)
    return build_summary_prompt(
        cut.summarize,
        previous=previous,
        focus=None,
        max_input_tokens=session.compactor.thresholds.hard_limit,
        count=session.counter.count_text,
        scans=functools.partial(snapshots.start, capsule_id=None if cut.previous is None else cut.previous.id),
    )


def _extract_scan(session: Any, cut: Any, dropped: int) -> int:
    """The summary input's extract alone: from the newest snapshot at or before the boundary
    (read from the file, as a resumed kernel reads it) to the boundary. Returns how many
    entries it read."""
    from soba_nb.compaction.extract_snapshots import ExtractSnapshots

    entries = cut.summarize
    snapshots = ExtractSnapshots(session.transcript.file)
    begun = snapshots.start(entries, dropped, capsule_id=None if cut.previous is None else cut.previous.id)
    begun.scan.run(entries[begun.covered : dropped])
    return dropped - begun.covered


def _whole_scan(cut: Any) -> float:
    """One pass of the extract's scan over every summarized entry (what a summary without
    snapshots would run), timed once."""
    from soba_nb.compaction.extract import fresh_start

    entries = list(cut.summarize)
    start = time.perf_counter()
    fresh_start(entries).scan.run(entries)
    return time.perf_counter() - start


def _append(session: Any, data: dict[str, Any]) -> float:
    from soba_nb.transcript.entries import entry_from_dict

    start = time.perf_counter()
    session.transcript.append(entry_from_dict(data))
    return time.perf_counter() - start


class CompactedDuringBenchmark(AssertionError):
    """A preflight compacted: the per-request figure would time a compaction."""


def soba_child(path: Path, variant: str, appends: list[dict[str, Any]]) -> dict[str, Any]:
    from soba_nb.compaction.triggers import TurnState

    rss_imports = _max_rss()
    gc.collect()
    start = time.perf_counter()
    session = open_session(path)
    opened = time.perf_counter()
    session.compactor.measure()
    measured = time.perf_counter()
    built = session.compactor.model_input()
    done = time.perf_counter()
    result: dict[str, Any] = {
        "open": opened - start, "measure": measured - opened, "model_input": done - measured,
        "rss": _max_rss(), "rss_imports": rss_imports, "messages": len(built.messages),
    }  # fmt: skip
    if variant == "plan":
        result["plan"], cut = _best_of(lambda: _plan(session))
        result["summary"], prompt = _best_of(lambda: _summary_input(session, cut))
        result["summary_chars"] = len(prompt.system) + len(prompt.user)
        result["summary_scan"], result["summary_scan_read"] = _best_of(lambda: _extract_scan(session, cut, prompt.dropped))
        result["summary_whole_scan"] = _whole_scan(cut)
        result["summary_count"], _ = _best_of(lambda: session.counter.count_text(prompt.system + prompt.user))
        result["summarized"] = len(cut.summarize)
        result["append"] = statistics.median(_append(session, data) for data in appends)
    elif variant == "requests":
        appended, requests = [], []
        for data in appends:
            appended.append(_append(session, data))
            if not (data["type"] == "tool_result" or data.get("role") == "user"):
                continue
            start = time.perf_counter()
            if session.compactor.preflight(TurnState()) is not None:
                raise CompactedDuringBenchmark(f"{path}: a preflight compacted during the per-request benchmark")
            session.compactor.request_for_sending()
            requests.append(time.perf_counter() - start)
        result["request"], result["append"] = statistics.median(requests), statistics.median(appended)
    session.close()
    return result


def floor_child(path: Path) -> dict[str, Any]:
    import orjson

    loads = orjson.loads
    gc.collect()
    gc.disable()
    start = time.perf_counter()
    with path.open("rb") as handle:
        parsed = [loads(line) for line in handle.read().split(b"\n") if line]
    seconds = time.perf_counter() - start
    return {"floor": seconds, "entries": len(parsed)}


def child_main(argv: list[str]) -> int:
    mode, path = argv[0], Path(argv[1])
    if mode == "floor":
        result = floor_child(path)
    else:
        variant, appends = argv[2], json.loads(Path(argv[3]).read_text(encoding="utf-8"))["soba"]
        result = soba_child(path, variant, appends)
    print(json.dumps(result))
    return 0


# -- running the children -----------------------------------------------------------------------


def run_child(script: Path, *args: str) -> dict[str, Any]:
    """Run `script` in a fresh Python process; the JSON object its last line prints."""
    command = [sys.executable, str(script), *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def write_appends(path: Path) -> Path:
    """The entries both sides append after resuming: soba-nb's dicts and pi's calls."""
    converter = PiConverter(str(path.parent))
    soba = list(islice(analysis_rounds(APPEND_SEED), APPEND_ROUNDS * 5))
    pi = [converter.append_item(data) for data in soba]
    path.write_text(json.dumps({"soba": soba, "pi": pi}), encoding="utf-8")
    pi_only = path.with_name(path.stem + "-pi.json")
    pi_only.write_text(json.dumps(pi), encoding="utf-8")
    return path


@dataclass
class Runs:
    """Every run's figures for one session and variant, per side."""

    soba: list[dict[str, Any]] = field(default_factory=list)
    pi: list[dict[str, Any]] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)

    def best(self, side: str, *keys: str) -> float | None:
        runs = self.soba if side == "soba" else self.pi
        totals = [sum(run[key] for key in keys) for run in runs if all(key in run for key in keys)]
        return min(totals) if totals else None

    def phases(self, side: str, *keys: str) -> dict[str, float]:
        """The phases of the fastest run (so they add up to its total)."""
        runs = self.soba if side == "soba" else self.pi
        fastest = min(runs, key=lambda run: sum(run[key] for key in keys))
        return {key: fastest[key] for key in keys}

    def peak(self, side: str, key: str = "rss") -> int | None:
        runs = self.soba if side == "soba" else self.pi
        values = [run[key] for run in runs if key in run]
        return max(values) if values else None


def side_by_side(
    soba_session: Path,
    pi_session: Path | None,
    variant: str,
    runs: int,
    scratch: Path,
    pi: PiSetup | None,
) -> Runs:
    """`runs` interleaved fresh-process runs of each side on copies of the session."""
    appends = write_appends(scratch / "appends.json")
    result = Runs()
    for run in range(runs):
        result.floor.append(run_child(Path(__file__), "floor", str(soba_session))["floor"])
        copy = scratch / f"soba-{run}"
        shutil.copytree(soba_session.parent, copy)
        try:
            result.soba.append(run_child(Path(__file__), "soba", str(copy / soba_session.name), variant, str(appends)))
        finally:
            shutil.rmtree(copy)
        if pi is not None and pi_session is not None:
            copy = scratch / f"pi-{run}"
            copy.mkdir()
            shutil.copyfile(pi_session, copy / pi_session.name)
            try:
                pi_appends = appends.with_name(appends.stem + "-pi.json")
                result.pi.append(run_pi(pi, copy / pi_session.name, variant, pi_appends, OPERATION_BUDGET_S))
            finally:
                shutil.rmtree(copy)
    return result


def first_resume(soba_session: Path, scratch: Path) -> dict[str, Any]:
    """One resume of the transcript alone, copied without what soba-nb keeps beside it."""
    copy = scratch / "first-resume"
    copy.mkdir()
    shutil.copyfile(soba_session, copy / soba_session.name)
    appends = write_appends(scratch / "appends.json")
    try:
        return run_child(Path(__file__), "soba", str(copy / soba_session.name), "resume", str(appends))
    finally:
        shutil.rmtree(copy)


# -- the rows ----------------------------------------------------------------------------------

RESUME_TARGET_PI = 0.6
RESUME_TARGET_FLOOR = 2.0
RSS_TARGET_PI = 1.0
PLAN_TARGET_PI = 0.1
SUMMARY_TARGET_S = 0.050
LARGE_MINUTES = 6
"""About how long the 300k-entry size adds to a run on the 2-core development machine (the cold rows included)."""
NO_CAPSULE, CAPSULE = "no capsule", "ends in a capsule"


@dataclass
class Measured:
    """Everything measured on one size."""

    entries: int
    files: dict[str, int]
    """Bytes of the soba-nb transcript per variant."""
    pi_files: dict[str, int]
    runs: dict[str, Runs]
    first: dict[str, Any]


def measure_size(workspace: Any, size: int) -> Measured:
    pi = workspace.pi
    scratch = workspace.folder / f"scratch-{size}"
    scratch.mkdir()
    runs, files, pi_files = {}, {}, {}
    for variant, capsule, child in ((NO_CAPSULE, False, "plan"), (CAPSULE, True, "requests")):
        session = workspace.analysis(size, capsule=capsule).path
        files[variant] = session.stat().st_size
        pi_session = None
        if pi is not None:
            folder = workspace.folder / f"pi-{size}-{'capsule' if capsule else 'plain'}"
            folder.mkdir(exist_ok=True)
            pi_session = write_pi_session(session, folder / session.name)
            pi_files[variant] = pi_session.stat().st_size
        runs[variant] = side_by_side(session, pi_session, child, runs_for(size), scratch, pi)
    first = first_resume(workspace.analysis(size).path, scratch)
    shutil.rmtree(scratch)
    return Measured(size, files, pi_files, runs, first)


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    return None if mine is None or not theirs else mine / theirs


def register(benchmark: Callable[[str], Callable[[Any], Any]], row: type, ms: Callable[[float], str], mib: Callable[[float], str]) -> None:
    """Register the headline rows into run.py's table."""

    def vs(name: str, m: Measured, variant: str, mine: float | None, text: str, theirs: float | None,
           their_text: str, target: float | None, target_text: str) -> Any:
        ratio = _ratio(mine, theirs)
        ok = None if ratio is None or target is None else ratio <= target
        return row(name, m.entries, text, their_text if theirs is not None else "pi: not run",
                   "" if ratio is None else f"{ratio:.2f}×", target_text, ok, m.files[variant])

    def resume_rows(m: Measured, variant: str) -> list[Any]:
        runs = m.runs[variant]
        keys = ("open", "measure", "model_input")
        total = runs.best("soba", *keys)
        assert total is not None
        phases = runs.phases("soba", *keys)
        text = f"{ms(total)} (open {ms(phases['open'])} + measure {ms(phases['measure'])} + model input {ms(phases['model_input'])})"
        pi_total = runs.best("pi", "open", "context")
        pi_text = ""
        if pi_total is not None:
            pi_phases = runs.phases("pi", "open", "context")
            pi_text = (
                f"pi {ms(pi_total)} (open {ms(pi_phases['open'])} + buildSessionContext {ms(pi_phases['context'])}; "
                f"pi's file {mib(m.pi_files[variant])})"
            )
        floor = min(runs.floor)
        return [
            vs(f"resume, {variant}", m, variant, total, text, pi_total, pi_text, RESUME_TARGET_PI, f"≤ {RESUME_TARGET_PI:g}× pi"),
            vs(f"resume vs parse floor, {variant}", m, variant, total, ms(total), floor,
               f"orjson floor {ms(floor)}", RESUME_TARGET_FLOOR, f"≤ {RESUME_TARGET_FLOOR:g}× floor"),
        ]

    def rss_row(m: Measured, variant: str) -> Any:
        runs = m.runs[variant]
        mine, theirs = runs.peak("soba"), runs.peak("pi")
        text = f"{mib(mine or 0)} (imports {mib(runs.peak('soba', 'rss_imports') or 0)})"
        their_text = f"pi {mib(theirs)} (imports {mib(runs.peak('pi', 'rssImports') or 0)})" if theirs else ""
        return vs(f"peak RSS after resume, {variant}", m, variant, mine, text, theirs, their_text,
                  RSS_TARGET_PI, f"≤ {RSS_TARGET_PI:g}× pi")

    def operation_rows(m: Measured) -> list[Any]:
        plain, capsule = m.runs[NO_CAPSULE], m.runs[CAPSULE]
        plan, pi_plan = plain.best("soba", "plan"), plain.best("pi", "plan")
        summary, pi_summary = plain.best("soba", "summary"), plain.best("pi", "summary")
        request, pi_request = capsule.best("soba", "request"), capsule.best("pi", "request")
        append, pi_append = plain.best("soba", "append"), plain.best("pi", "append")
        summarized = plain.soba[0]["summarized"]
        chars = plain.soba[0]["summary_chars"]
        scan, count = plain.best("soba", "summary_scan"), plain.best("soba", "summary_count")
        read, whole = plain.soba[0]["summary_scan_read"], plain.best("soba", "summary_whole_scan")
        summary_row = row(
            f"summary input, {NO_CAPSULE}", m.entries,
            f"{ms(summary or 0)} ({summarized:,} entries → {chars:,} chars; alone: the extract from the newest "
            f"snapshot, {read:,} entries, {ms(scan or 0)} (one pass over all: {ms(whole or 0)}); "
            f"counting the request once {ms(count or 0)})",
            f"pi serializeConversation {ms(pi_summary)}" if pi_summary is not None else "pi: not run",
            "" if _ratio(summary, pi_summary) is None else f"{_ratio(summary, pi_summary):.2f}×",
            f"≤ {SUMMARY_TARGET_S * 1000:g} ms", (summary or 0) <= SUMMARY_TARGET_S, m.files[NO_CAPSULE],
        )
        return [
            vs(f"compaction plan, {NO_CAPSULE}", m, NO_CAPSULE, plan, ms(plan or 0), pi_plan,
               f"pi prepareCompaction {ms(pi_plan or 0)}", PLAN_TARGET_PI, f"≤ {PLAN_TARGET_PI:g}× pi"),
            summary_row,
            vs(f"every request, {CAPSULE}", m, CAPSULE, request, f"{ms(request or 0)} (preflight + model input, median)",
               pi_request, f"pi check before a response {ms(pi_request or 0)}", None, ""),
            vs(f"append one entry, {NO_CAPSULE}", m, NO_CAPSULE, append, f"{ms(append or 0)} (median)", pi_append,
               f"pi appendMessage {ms(pi_append or 0)}", None, ""),
        ]

    def first_row(m: Measured) -> Any:
        first = m.first
        total = first["open"] + first["measure"] + first["model_input"]
        pi_total = m.runs[NO_CAPSULE].best("pi", "open", "context")
        return vs(f"first resume without the token index, {NO_CAPSULE} (1 run)", m, NO_CAPSULE, total,
                  f"{ms(total)} (measure {ms(first['measure'])})", pi_total,
                  f"pi {ms(pi_total or 0)}", None, "")

    @benchmark("resume")
    def resume(workspace: Any) -> list[Any]:
        measured = [measure_size(workspace, size) for size in workspace.sizes]
        groups: list[Callable[[Measured], list[Any]]] = [
            lambda m: resume_rows(m, NO_CAPSULE)[:1], lambda m: resume_rows(m, CAPSULE)[:1],
            lambda m: resume_rows(m, NO_CAPSULE)[1:], lambda m: resume_rows(m, CAPSULE)[1:],
            lambda m: [rss_row(m, NO_CAPSULE)], lambda m: [rss_row(m, CAPSULE)],
            lambda m: operation_rows(m)[:1], lambda m: operation_rows(m)[1:2],
            lambda m: operation_rows(m)[2:3], lambda m: operation_rows(m)[3:],
            lambda m: [first_row(m)],
        ]
        return [line for group in groups for m in measured for line in group(m)]


if __name__ == "__main__":
    raise SystemExit(child_main(sys.argv[1:]))
