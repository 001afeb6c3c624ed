"""Crash safety: SIGKILL a writer at random points, multi-MB appends included, twice in a row.

A child process opens the transcript and appends entries (small ones and multi-MB tool
results), printing each entry's id once `append` has returned (acknowledged). The test kills
it at a random moment, or right after it reopens (in its first big append), or as soon as the
file starts growing (inside the multi-MB write itself, which tears it) twice in a row, and
then checks that the session opens, and that no acknowledged entry is lost.
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


WRITE_WAIT_S = 5.0
"""How long a kill "in the write" waits for the file to start growing."""


def _run_and_kill(path: Path, rng: random.Random, *, when: str) -> tuple[set[str], bool]:
    """(acknowledged ids, whether the writer could open the file).

    `when`: "later" (0.005-0.15 s after the open), "at_once" (0-0.03 s: in the first big
    append, before or during its write), or "in_write": as soon as the file starts to grow,
    so the kill lands inside the multi-MB `write` itself and tears it (the kernel stops a
    write to a regular file short when a fatal signal arrives).
    """
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(rng.randrange(1 << 30))],
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline().decode()
        if not first.startswith("ready"):
            return set(), False
        if when == "in_write":
            size = path.stat().st_size
            ends = time.monotonic() + WRITE_WAIT_S
            while path.stat().st_size == size and time.monotonic() < ends:
                pass
        else:
            time.sleep(rng.uniform(0, 0.03) if when == "at_once" else rng.uniform(0.005, 0.15))
    finally:
        process.kill()
        rest = process.stdout.read().decode() if process.stdout else ""
        process.wait()
    return {line.strip() for line in rest.splitlines() if line.strip()}, True


KILL_TIMING = ("later", "at_once", "in_write", "in_write")
"""Kill `k` uses `KILL_TIMING[k % 4]`: the two "in_write" kills come one after the other, so
the second tears the append that follows the first torn line (two crashes in a row)."""


@pytest.mark.timeout(900)
def test_sigkill_at_random_points_loses_no_acknowledged_entry(tmp_path, figures):
    rng = random.Random(SEED)
    survived = unopenable = lost = torn = twice = written = acknowledged_count = 0
    started = time.monotonic()
    warnings.simplefilter("ignore", TornLineWarning)
    for kill in range(KILLS):
        path = tmp_path / f"s{kill // KILLS_PER_FILE}.jsonl"
        if kill % KILLS_PER_FILE == 0:
            Transcript.open(path, create_header=SessionEntry()).close()
            acknowledged: set[str] = set()
        ids, opened = _run_and_kill(path, rng, when=KILL_TIMING[kill % len(KILL_TIMING)])
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
            # Adjacent torn lines: an append torn, then the append after the reopen torn too.
            twice += sum(b == a + 1 for a, b in zip(view.torn_lines, view.torn_lines[1:], strict=False))
            written += path.stat().st_size
    figures.add(
        "crash safety",
        f"SIGKILLs survived {survived}/{KILLS} · acknowledged entries {acknowledged_count}, lost {lost} · "
        f"sessions unopenable {unopenable} · appends torn by a kill {torn} (torn twice in a row {twice}) · "
        f"{written / 1e6:.0f} MB written · "
        f"{time.monotonic() - started:.0f} s",
    )
    assert (survived, lost, unopenable) == (KILLS, 0, 0)
