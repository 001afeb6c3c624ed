"""Which files are soba's own (`soba_nb.own_files`): the rule the file tools apply."""

from __future__ import annotations

from pathlib import Path

import pytest

from soba_nb.own_files import soba_file_rule


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    project = tmp_path / "project"
    project.mkdir()
    return project.resolve()


@pytest.mark.parametrize(
    "relative",
    [
        "analysis.soba/20261204T000000Z-1a2b.jsonl",
        "analysis.soba/flight.jsonl",
        "sub/analysis.soba/x.tokens",
        ".soba/memory/a.capsule.md",
        ".soba/skills/plot/SKILL.md",
        "soba.json",
        "deep/down/soba.json",
        "SOBA.JSON",
        "Analysis.SOBA/x",
    ],
)
def test_soba_files_are_named_by_a_rule(root: Path, relative: str) -> None:
    assert soba_file_rule(root / relative, root) is not None


@pytest.mark.parametrize("relative", ["notes.md", "soba.json.bak", "mysoba/x.py", "soba/x.py", "data/sobaresults.csv"])
def test_other_files_are_not(root: Path, relative: str) -> None:
    assert soba_file_rule(root / relative, root) is None


def test_a_project_inside_a_folder_named_like_a_session_folder_is_usable(tmp_path: Path) -> None:
    root = (tmp_path / "old.soba" / "project").resolve()
    assert soba_file_rule(root / "notes.md", root) is None


def test_the_user_folder_and_the_open_session(root: Path, tmp_path: Path) -> None:
    assert soba_file_rule(tmp_path / "home" / ".soba" / "config.json", root) is not None
    session = root / "work" / "mine.jsonl"
    assert soba_file_rule(session, root) is None
    assert "open session" in (soba_file_rule(session, root, frozenset({session})) or "")
