"""Confinement of the file tools under attack: static escapes, and a symlink swapped in a race.

The race: a second process exchanges a folder of the project with a symlink out of it, as
fast as it can (`renameat2(RENAME_EXCHANGE)`), while `read_file` and `write_file` use a path
through that folder. Before the tools checked what they had opened, 52 of 5,936 writes and
11 reads escaped in 30 s. Now: none may, however the race falls.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from soba_nb.agent.tools import ToolContext, run_tool

RACE_SECONDS = 20
OUTSIDE_TEXT = "OUTSIDE: must never be read"
INSIDE_TEXT = "inside the project"
SWAPPER = textwrap.dedent(
    """
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    a, b = (p.encode() for p in sys.argv[1:3])
    while True:
        libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
    """
)


def call(tool: str, ctx: ToolContext, **arguments: object):
    import json

    return run_tool(tool, json.dumps(arguments), ctx)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, ToolContext]:
    project, outside = tmp_path / "project", tmp_path / "outside"
    (project / "data").mkdir(parents=True)
    outside.mkdir()
    (project / "data" / "f.txt").write_text(INSIDE_TEXT)
    (outside / "f.txt").write_text(OUTSIDE_TEXT)
    (project / "alt").symlink_to(outside, target_is_directory=True)
    return project, outside, ToolContext(project_root=project, namespace={})


STATIC_ESCAPES = [
    "../outside/f.txt",
    "data/../../outside/f.txt",
    "./../outside/f.txt",
    "alt/f.txt",
    "alt/../outside/f.txt",
    "alt/./f.txt",
    "data/../alt/f.txt",
    "/etc/passwd",
    "/proc/self/root/etc/passwd",
    "/proc/self/cwd/../outside/f.txt",
    "//etc/passwd",
    "data/../../../../../../etc/passwd",
    "link_to_file",
    "link_to_etc/passwd",
    "link_to_root/etc/passwd",
    "loop/x",
    "dangling",
    "data/link_up/outside/f.txt",
]


def _plant_links(project: Path, outside: Path) -> None:
    (project / "link_to_file").symlink_to(outside / "f.txt")
    (project / "link_to_etc").symlink_to("/etc", target_is_directory=True)
    (project / "link_to_root").symlink_to("/", target_is_directory=True)
    (project / "loop").symlink_to(project / "loop")
    (project / "dangling").symlink_to(outside / "not-yet.txt")
    (project / "data" / "link_up").symlink_to(project.parent, target_is_directory=True)


def test_static_escapes_are_all_refused(layout, figures):
    project, outside, ctx = layout
    _plant_links(project, outside)
    attempts = escapes = 0
    for path in STATIC_ESCAPES:
        for tool, arguments in (
            ("read_file", {}),
            ("write_file", {"content": "pwned"}),
            ("edit_file", {"old": "OUTSIDE", "new": "pwned"}),
            ("list_files", {}),
        ):
            attempts += 1
            outcome = call(tool, ctx, path=path, **arguments)
            # Out means: something outside was read, listed or changed. (`alt/../x` is read
            # lexically as `x`, inside the project: a write there is no escape.)
            content = outcome.content
            leaked = OUTSIDE_TEXT in content or "root:x:" in content or ("usr/" in content and "etc/" in content)
            changed = (outside / "f.txt").read_text() != OUTSIDE_TEXT or sorted(p.name for p in outside.iterdir()) != ["f.txt"]
            escapes += leaked or changed
    figures.add("confinement (static)", f"escape attempts {attempts} · escapes {escapes}")
    assert escapes == 0


def test_regular_files_only_and_sizes_from_the_descriptor(layout):
    project, _, ctx = layout
    os.mkfifo(project / "pipe")
    started = time.monotonic()
    outcome = call("read_file", ctx, path="pipe")
    assert outcome.is_error and "not a regular file" in outcome.content
    assert time.monotonic() - started < 2  # not blocked on the FIFO
    assert "not a regular file" in call("write_file", ctx, path="pipe", content="x").content
    with (project / "big.txt").open("wb") as big:
        big.truncate(20 * 1024 * 1024)
    outcome = call("read_file", ctx, path="big.txt")
    assert outcome.is_error and "more than read_file takes" in outcome.content


def test_a_file_with_another_hard_link_is_not_written(layout):
    project, outside, ctx = layout
    os.link(outside / "f.txt", project / "hard.txt")
    outcome = call("write_file", ctx, path="hard.txt", content="pwned")
    assert outcome.is_error and "hard links" in outcome.content
    assert (outside / "f.txt").read_text() == OUTSIDE_TEXT


@pytest.mark.timeout(RACE_SECONDS + 60)
def test_a_symlink_swapped_in_a_race_never_lets_a_tool_out(layout, figures):
    project, outside, ctx = layout
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(project / "data"), str(project / "alt")])
    reads = writes = read_escapes = write_escapes = 0
    try:
        ends = time.monotonic() + RACE_SECONDS
        while time.monotonic() < ends:
            if OUTSIDE_TEXT in call("read_file", ctx, path="data/f.txt").content:
                read_escapes += 1
            reads += 1
            call("write_file", ctx, path="data/new.txt", content="written through the race")
            writes += 1
            if (outside / "new.txt").exists():
                write_escapes += 1
                (outside / "new.txt").unlink()
    finally:
        swapper.kill()
        swapper.wait()
    assert (outside / "f.txt").read_text() == OUTSIDE_TEXT
    figures.add(
        "confinement (symlink-swap race)",
        f"{RACE_SECONDS} s · reads {reads}, escaped {read_escapes} · writes {writes}, escaped {write_escapes}",
    )
    assert (read_escapes, write_escapes) == (0, 0)
