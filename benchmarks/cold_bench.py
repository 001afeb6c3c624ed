"""A transcript opened cold, next to the same one warm, side by side with pi (issue 28).

Rows of `benchmarks/run.py` (`--only cold`). A transcript is opened cold when it comes without
what soba-nb keeps beside it (`.tokens`, `.budget`, `.extract`): a capsule handoff's source
session, a transcript attached to a bug report, `soba-nb inspect` in CI on an artifact, a
session folder restored without its caches. Here: the `analysis` session with no capsule
(benchmarks/generate.py), its `.jsonl` alone copied to a fresh folder (cold), and its folder
copied whole (warm). Each run is a fresh process of each, interleaved with pi's:

- `soba-nb budget SESSION` and `soba-nb inspect SESSION`, whole processes timed from outside
  (interpreter, imports, load, figures, exit; benchmarks/cold_child.py imports only the
  standard library before the command);
- the first `%soba` of a new kernel: `open_session`, the preflight's measure, upkeep and trigger
  decision, and the input `request_for_sending` builds when nothing is to be compacted — timed
  from `open_session` (a kernel imported soba-nb at `%load_ext`), the whole process beside it;
- pi 1.6.0's whole-process resume: a fresh Node process importing its session manager,
  `SessionManager.open` + `buildSessionContext` (benchmarks/pi_resume.mjs, variant `resume`);
- peak RSS (`VmHWM`) of each process;
- the Python interpreter alone (`python cold_child.py floor`: no soba-nb imported), the floor
  under every soba-nb command on this machine, beside pi's whole process.

Two cold copies: the `.jsonl` as a finished turn leaves it (its last `turn` checkpoint carries
the budget tracker's state: only what follows is counted) and the same with no state in it (that
checkpoint, the generated session's only one, left out), as a file written before states were
recorded: measured from its last usage figure on, which counts (plain text here: from the
encoding's plain tokens the cache folder holds, soba_nb/plain_counts.py, where other text would
build tiktoken's encoder). (A real copy made mid-turn starts from its previous turn's checkpoint
and counts the current turn: the same counts, but not the region's at the first compaction.)

Times are the best run, RSS the largest. Once per size (1 run): the compaction plan a `hard_limit`
trigger starts with after the first preflight, each way — with no state, the one step that still
counts what came before the last usage figure (the region's total, the capsule's before-figures).

And what soba adds to each turn before the request leaves (the `turn` rows), on the session
ending in a capsule: the cells since the previous turn fitted and appended, the request, the
preflight and `request_for_sending` (benchmarks/cold_child.py `turns`), median of `TURNS`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from benchmarks.cold_child import PAUSE_S
    from benchmarks.pi_runner import SCRIPT as PI_SCRIPT
    from benchmarks.pi_runner import PiSetup
    from benchmarks.pi_session import write_pi_session
    from benchmarks.resume_bench import runs_for
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    from cold_child import PAUSE_S  # type: ignore[no-redef]
    from pi_runner import SCRIPT as PI_SCRIPT  # type: ignore[no-redef]
    from pi_runner import PiSetup  # type: ignore[no-redef]
    from pi_session import write_pi_session  # type: ignore[no-redef]
    from resume_bench import runs_for  # type: ignore[no-redef]

CHILD = Path(__file__).with_name("cold_child.py")
TARGET_PI = 1.0
RSS_TARGET_PI = 1.0
TURNS = 20
TURN_SIZE = 100_000
TURN_TARGET_S = 0.005
COMMANDS = ("budget", "inspect")
STATES = ("cold", "bare", "warm")
LABELS = {
    "cold": "cold open (the `.jsonl` alone, after a finished turn)",
    "bare": "cold open, no state in the file (written before states were recorded)",
    "warm": "warm open",
}


class ChildFailed(RuntimeError):
    """A benchmark process did not print its figures."""


def whole_process(command: list[str]) -> tuple[float, dict[str, Any]]:
    """Seconds from spawning `command` to its exit, and the JSON object it printed last."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise ChildFailed(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seconds, result


def compile_package() -> None:
    """soba-nb's bytecode, as `pip install` compiles it for an installed package (an editable
    install's Python writes it at the first import, unless PYTHONDONTWRITEBYTECODE is set, as on
    the machines these figures come from: then every process would compile every module again,
    about 55 ms of each whole process at 1k entries)."""
    import compileall

    import soba_nb

    compileall.compile_dir(Path(soba_nb.__file__).parent, quiet=1)


def keep_tokenizer_files() -> None:
    """What the user's cache folder holds on any machine where soba-nb has counted once: the
    encoding's ranks and its plain tokens (soba_nb/tokenizer_cache.py, soba_nb/plain_counts.py),
    written by the first process that builds the encoder (here, before any is timed)."""
    subprocess.run([sys.executable, "-c", "from soba_nb.tokens import get_encoding; get_encoding('o200k_base')"], check=True)


def child(*args: str) -> list[str]:
    return [sys.executable, str(CHILD), *args]


def pi_command(pi: PiSetup, session: Path) -> list[str]:
    return [pi.node, str(PI_SCRIPT), str(pi.package), str(session), "resume", "-", "0"]


@dataclass
class Runs:
    """Every run's figures for one size: `(state, what) -> [(seconds, result)]`."""

    figures: dict[tuple[str, str], list[tuple[float, dict[str, Any]]]] = field(default_factory=dict)

    def add(self, key: tuple[str, str], seconds: float, result: dict[str, Any]) -> None:
        self.figures.setdefault(key, []).append((seconds, result))

    def best(self, key: tuple[str, str], measure: Callable[[float, dict[str, Any]], float] | None = None) -> tuple[float, dict[str, Any]] | None:
        """The fastest run (by `measure`, default the whole process) and its figures."""
        runs = self.figures.get(key)
        if not runs:
            return None
        pick = measure or (lambda seconds, _: seconds)
        seconds, result = min(runs, key=lambda run: pick(*run))
        return pick(seconds, result), result

    def peak(self, key: tuple[str, str]) -> int | None:
        runs = self.figures.get(key)
        return max(result["rss"] for _, result in runs) if runs else None


def in_kernel(seconds: float, result: dict[str, Any]) -> float:
    """The first `%soba`'s time from `open_session` (what a kernel that loaded soba-nb waits)."""
    return float(result["open"] + result["preflight"] + result["model_input"])


@dataclass
class Measured:
    entries: int
    file_bytes: int
    runs: Runs
    plans: dict[str, dict[str, Any]]
    turn: dict[str, Any] | None


def turn_size(sizes: tuple[int, ...]) -> int:
    """The size the per-turn rows run at: `TURN_SIZE`, or the largest below it."""
    return max([size for size in sizes if size <= TURN_SIZE] or [min(sizes)])


def copies(session: Path, scratch: Path, run: int) -> dict[str, Path]:
    """Per run: the `.jsonl` alone in a fresh folder (one for the commands, which write nothing,
    one for the first `%soba`, which may); the same with no state in it (its last `turn`
    checkpoint, the only one that carries the budget tracker's state, left out); and the
    session folder copied whole."""
    made = {}
    for state, name in (("cold", "cold"), ("cold first", "cold-first")):
        folder = scratch / f"{name}-{run}"
        folder.mkdir()
        made[state] = Path(shutil.copyfile(session, folder / session.name))
    data = session.read_bytes()
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    assert b'"type":"checkpoint"' in last and b'"budget":' in last, f"{session} does not end with a finished turn"
    for state, name in (("bare", "bare"), ("bare first", "bare-first"), ("bare loaded", "bare-loaded")):
        folder = scratch / f"{name}-{run}"
        folder.mkdir()
        made[state] = folder / session.name
        made[state].write_bytes(data[: len(data.rstrip(b"\n")) - len(last)])
    warm = scratch / f"warm-{run}"
    shutil.copytree(session.parent, warm)
    made["warm"] = made["warm first"] = warm / session.name
    return made


def measure_size(workspace: Any, size: int) -> Measured:
    session = workspace.analysis(size).path
    scratch = workspace.folder / f"cold-{size}"
    scratch.mkdir()
    pi_session: Path | None = None
    if workspace.pi is not None:
        folder = workspace.folder / f"pi-{size}-plain"
        folder.mkdir(exist_ok=True)
        pi_session = folder / session.name
        if not pi_session.exists():
            write_pi_session(session, pi_session)
    runs = Runs()
    for run in range(runs_for(size)):
        paths = copies(session, scratch, run)
        steps: list[tuple[tuple[str, str], list[str]]] = []
        if pi_session is not None:
            steps.append((("pi", "resume"), pi_command(workspace.pi, pi_session)))
        for state in STATES:
            for command in COMMANDS:
                steps.append(((state, command), child("cli", command, str(paths[state]))))
            steps.append(((state, "first"), child("first", str(paths[f"{state} first"]))))
        steps.append((("bare", "first loaded"), child("first", str(paths["bare loaded"]), "--after-load-ext")))
        steps.append((("floor", "python"), child("floor")))
        shift = run % len(steps)  # a different order each run: none is always first after a pause
        for key, command in steps[shift:] + steps[:shift]:
            runs.add(key, *whole_process(command))
        for path in {path.parent for path in paths.values()}:
            shutil.rmtree(path)
    plans = {}
    for state in STATES:
        paths = copies(session, scratch, 99)
        plans[state] = whole_process(child("first", str(paths[f"{state} first"]), "--plan"))[1]
        for path in {path.parent for path in paths.values()}:
            shutil.rmtree(path)
    turn = None
    if size == turn_size(workspace.sizes):
        folder = scratch / "turns"
        shutil.copytree(workspace.analysis(size, capsule=True).path.parent, folder)
        turn = whole_process(child("turns", str(folder / session.name), str(TURNS)))[1]
    shutil.rmtree(scratch)
    return Measured(size, session.stat().st_size, runs, plans, turn)


def register(benchmark: Callable[[str], Callable[[Any], Any]], row: type, ms: Callable[[float], str], mib: Callable[[float], str]) -> None:
    """Register the cold rows into run.py's table."""

    def line(name: str, m: Measured, text: str, mine: float | None, theirs: float | None, their_text: str,
             target: float | None) -> Any:
        ratio = None if mine is None or not theirs else mine / theirs
        ok = None if ratio is None or target is None else ratio <= target
        return row(name, m.entries, text, their_text if theirs is not None else "pi: not run",
                   "" if ratio is None else f"{ratio:.2f}×", "" if target is None else f"≤ {target:g}× pi", ok,
                   m.file_bytes)

    def pi_figures(m: Measured) -> tuple[float | None, str, int | None]:
        best = m.runs.best(("pi", "resume"))
        if best is None:
            return None, "", None
        seconds, result = best
        text = f"pi whole process {ms(seconds)} (open + buildSessionContext {ms(result['open'] + result['context'])})"
        return seconds, text, m.runs.peak(("pi", "resume"))

    def command_rows(m: Measured, state: str) -> list[Any]:
        pi_seconds, pi_text, _ = pi_figures(m)
        rows = []
        for command in COMMANDS:
            best = m.runs.best((state, command))
            assert best is not None
            rows.append(line(f"{LABELS[state]}, `soba-nb {command}` (whole process)", m, ms(best[0]), best[0],
                             pi_seconds, pi_text, TARGET_PI))
        return rows

    def floor_row(m: Measured) -> Any:
        pi_seconds, pi_text, _ = pi_figures(m)
        best = m.runs.best(("floor", "python"))
        assert best is not None
        return line("the Python interpreter alone, no soba-nb (the floor of every command above)", m,
                    f"{ms(best[0])} (peak RSS {mib(m.runs.peak(('floor', 'python')) or 0)})", best[0], pi_seconds,
                    pi_text, None)

    def first_row(m: Measured, state: str, what: str = "first") -> Any:
        pi_seconds, pi_text, _ = pi_figures(m)
        best = m.runs.best((state, what), in_kernel)
        whole = m.runs.best((state, what), lambda seconds, result: seconds - result["pause"])
        assert best is not None and whole is not None
        seconds, result = best
        trigger = result["trigger"]
        then = (f" + model input {ms(result['model_input'])}" if trigger is None
                else f"; decision: {trigger}, so the compaction runs before a request is built")
        text = (f"{ms(seconds)} (open {ms(result['open'])} + preflight {ms(result['preflight'])}{then}; "
                f"whole process {ms(whole[0])}{' less the pause' if what != 'first' else ''})")
        name = f"{LABELS[state]}, first `%soba` in a new kernel"
        if what != "first":
            name = f"{LABELS[state]}, first `%soba` {PAUSE_S:g} s after `%load_ext` (the tokenizer loaded meanwhile)"
        return line(name, m, text, seconds, pi_seconds, pi_text, TARGET_PI)

    def rss_row(m: Measured, state: str) -> Any:
        _, _, pi_rss = pi_figures(m)
        peaks = {what: m.runs.peak((state, what)) or 0 for what in (*COMMANDS, "first")}
        mine = max(peaks.values())
        text = f"{mib(mine)} (" + ", ".join(f"{what} {mib(peak)}" for what, peak in peaks.items()) + ")"
        their_text = f"pi {mib(pi_rss)}" if pi_rss else ""
        ratio = None if not pi_rss else mine / pi_rss
        ok = None if ratio is None else ratio <= RSS_TARGET_PI
        return row(f"peak RSS, {LABELS[state]}", m.entries, text, their_text or "pi: not run",
                   "" if ratio is None else f"{ratio:.2f}×", f"≤ {RSS_TARGET_PI:g}× pi", ok, m.file_bytes)

    def plan_row(m: Measured, state: str) -> Any:
        cold, warm = m.plans[state], m.plans["warm"]
        what = ("the region before the last usage figure" if state == "bare"
                else "what the cut needs that the state does not hold") + ", the tokenizer loaded for it"
        text = (f"{ms(cold['plan'])} ({cold['plan_counted']:,} new counts: {what}; "
                f"open and preflight before it {ms(cold['open'] + cold['preflight'])})")
        return row(f"{LABELS[state]}, then the first compaction plan (1 run)", m.entries, text,
                   f"warm {ms(warm['plan'])} ({warm['plan_counted']:,} new counts)",
                   f"{cold['plan'] / warm['plan']:.0f}×" if warm["plan"] else "", "", None, m.file_bytes)

    def turn_row(m: Measured) -> list[Any]:
        if m.turn is None:
            return []
        text = (f"{ms(m.turn['turn'])} (median of {TURNS}: cells + request + preflight + model input; the first "
                f"{ms(m.turn['turn_first'])}, whose first count loads the tokenizer)")
        return [row("per turn before the request leaves, ends in a capsule", m.entries, text, "", "",
                    f"< {TURN_TARGET_S * 1000:g} ms", m.turn["turn"] < TURN_TARGET_S, m.file_bytes)]

    @benchmark("cold")
    def cold(workspace: Any) -> list[Any]:
        compile_package()
        keep_tokenizer_files()
        measured = [measure_size(workspace, size) for size in workspace.sizes]
        groups: list[Callable[[Measured], list[Any]]] = [
            lambda m: command_rows(m, "cold"), lambda m: command_rows(m, "bare"), lambda m: command_rows(m, "warm"),
            lambda m: [floor_row(m)],
            lambda m: [first_row(m, "cold")], lambda m: [first_row(m, "bare")],
            lambda m: [first_row(m, "bare", "first loaded")], lambda m: [first_row(m, "warm")],
            lambda m: [rss_row(m, "cold")], lambda m: [rss_row(m, "bare")], lambda m: [rss_row(m, "warm")],
            lambda m: [plan_row(m, "cold")], lambda m: [plan_row(m, "bare")], turn_row,
        ]
        return [item for group in groups for m in measured for item in group(m)]
