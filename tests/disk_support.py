"""A small real disk for tests of what a full disk does: a tmpfs mounted on a folder (root, as
in CI; the test is skipped otherwise, saying why), unmounted however the test ends."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(folder: Path, size: int, *, why_root: str = "mounting a tmpfs needs root (as in CI)") -> Iterator[Path]:
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(why_root)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def project_on(disk: Path, home: Path, server_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder on `disk` with a `soba.json` for the loopback server at `server_url`,
    made the working folder, in an environment of no `SOBA_*` variable and `home` as HOME."""
    from conftest import write_soba_json

    for var in list(os.environ):
        if var.startswith("SOBA_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SOBA_NB_TEST_API_KEY", "sk-test-FullDisk0123456789abcdef")
    project = disk / "project"
    project.mkdir()
    write_soba_json(project, server_url)
    monkeypatch.chdir(project)
    return project
