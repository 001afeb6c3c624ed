"""Crash safety: SIGKILL a writer at random points, multi-MB appends included, twice in a row.

A child process opens the transcript and appends entries (small ones and multi-MB tool
results), printing each entry's id once `append` has returned (acknowledged). The test kills
it at a random moment — half the time right after it reopens, in the middle of its first
big append, so two crashes come in a row — and then checks that the session opens, and that
no acknowledged entry is lost.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from soba_nb.transcript.entries import SessionEntry
from soba_nb.transcript.store import TornLineWarning, Transcript, TranscriptError

KILLS = 200
KILLS_PER_FILE = 25
"""A fresh transcript every so many kills keeps each reopen's parse short."""
SEED = 20261203
WRITER = textwrap.dedent(
    """
    import random, sys, warnings
    warnings.simplefilter("ignore")
    from soba_nb.transcript.entries import MessageEntry, SessionEntry, ToolResultEntry
    from soba_nb.transcript.store import Transcript

    path, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    try:
        store = Transcript.open(path, create_header=SessionEntry())
    except Exception as exc:
        print("error", type(exc).__name__, exc, flush=True)
        sys.exit(1)
    print("ready", flush=True)
    big = True  # the first append after a (re)open is a large one: a kill lands in it
    while True:
        if big or rng.random() < 0.2:
            size = rng.randrange(1_000_000, 4_000_000)
            entry = ToolResultEntry(call_id="c", name="shell", content="y" * size)
        else:
            entry = MessageEntry(role="user", content="step " * rng.randrange(1, 200))
        big = False
        written = store.append(entry)
        print(written.id, flush=True)
    """
)


def _run_and_kill(path: Path, rng: random.Random, *, at_once: bool) -> tuple[set[str], bool]:
    """(acknowledged ids, whether the writer could open the file)."""
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(rng.randrange(1 << 30))],
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline().decode()
        if not first.startswith("ready"):
            return set(), False
        time.sleep(rng.uniform(0, 0.03) if at_once else rng.uniform(0.005, 0.15))
    finally:
        process.kill()
        rest = process.stdout.read().decode() if process.stdout else ""
        process.wait()
    return {line.strip() for line in rest.splitlines() if line.strip()}, True


@pytest.mark.timeout(900)
def test_sigkill_at_random_points_loses_no_acknowledged_entry(tmp_path, figures):
    rng = random.Random(SEED)
    survived = unopenable = lost = torn = written = acknowledged_count = 0
    started = time.monotonic()
    warnings.simplefilter("ignore", TornLineWarning)
    for kill in range(KILLS):
        path = tmp_path / f"s{kill // KILLS_PER_FILE}.jsonl"
        if kill % KILLS_PER_FILE == 0:
            Transcript.open(path, create_header=SessionEntry()).close()
            acknowledged: set[str] = set()
        ids, opened = _run_and_kill(path, rng, at_once=kill % 2 == 1)
        acknowledged |= ids
        acknowledged_count += len(ids)
        try:
            view = Transcript.load(path)
        except TranscriptError:
            view = None
        if view is None or not opened:
            unopenable += 1
            break
        lost = len(acknowledged - {entry.id for entry in view})
        if lost:
            break
        survived += 1
        if kill % KILLS_PER_FILE == KILLS_PER_FILE - 1:
            torn += len(view.torn_lines)
            written += path.stat().st_size
    figures.add(
        "crash safety",
        f"SIGKILLs survived {survived}/{KILLS} · acknowledged entries {acknowledged_count}, lost {lost} · "
        f"sessions unopenable {unopenable} · torn lines tolerated {torn} · {written / 1e6:.0f} MB written · "
        f"{time.monotonic() - started:.0f} s",
    )
    assert (survived, lost, unopenable) == (KILLS, 0, 0)
