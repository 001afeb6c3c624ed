"""SPEC §8: project memory receives only explicit, full-quality `%compact` capsules."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from soba_nb.capsule_files.file import read_capsule_file
from soba_nb.capsule_files.memory import (
    MEMORY_FOLDER,
    list_memory,
    memory_dir,
    mirror,
    project_root_for,
    should_mirror,
)
from soba_nb.compaction.capsule import Capsule, render_capsule
from soba_nb.transcript.entries import CapsuleEntry, Quality, TriggerName

BODY = render_capsule(
    Capsule(
        goal_and_constraints="Forecast weekly demand.",
        decisions="- Prophet, because the seasonality is yearly",
        kernel_state="- sales: DataFrame 5200×6",
    )
)
FAKE_HF_TOKEN = "hf_" + "Zx8Cv7Bn6Mq5Wr4Et3Yu2Io1Pa9Sd0Fg" + "Hj"


def capsule(
    trigger: TriggerName = "user",
    quality: Quality = "full",
    *,
    source: str | None = None,
    checkpoint: str = "ck_0a0b0c0d",
    content: str = BODY,
) -> CapsuleEntry:
    return CapsuleEntry(
        operation_id="op_1",
        checkpoint_id=checkpoint,
        trigger=trigger,
        quality=quality,
        tokens_before=50000,
        tokens_after=12000,
        first_kept_entry_id=None,
        content=content,
        source=source,
    )


# --- the project root -----------------------------------------------------------------------


def _no_marker_above(folder: Path) -> bool:
    return not any(
        (p / m).exists() for p in folder.resolve().parents for m in ("soba.json", ".git")
    )


def test_the_notebook_folder_is_the_project_when_nothing_marks_one(tmp_path: Path) -> None:
    if not _no_marker_above(tmp_path):
        pytest.skip("the temporary folder sits inside a project")
    notebooks = tmp_path / "work" / "notebooks"
    notebooks.mkdir(parents=True)
    assert project_root_for(notebooks) == notebooks.resolve()


@pytest.mark.parametrize("marker", ["soba.json", ".git"])
def test_the_nearest_parent_with_a_marker_is_the_project(tmp_path: Path, marker: str) -> None:
    project = tmp_path / "repo"
    notebooks = project / "analysis" / "notebooks"
    notebooks.mkdir(parents=True)
    if marker == ".git":
        (project / ".git").mkdir()
    else:
        (project / marker).write_text("{}", encoding="utf-8")
    assert project_root_for(notebooks) == project.resolve()
    assert project_root_for(project) == project.resolve()


def test_the_nearest_marker_wins(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    inner = tmp_path / "sub"
    (inner / "nb").mkdir(parents=True)
    (inner / "soba.json").write_text("{}", encoding="utf-8")
    assert project_root_for(inner / "nb") == inner.resolve()


def test_a_git_worktree_file_marks_a_project(tmp_path: Path) -> None:
    (tmp_path / ".git").write_text("gitdir: /elsewhere\n", encoding="utf-8")
    (tmp_path / "nb").mkdir()
    assert project_root_for(tmp_path / "nb") == tmp_path.resolve()


def test_the_memory_folder(tmp_path: Path) -> None:
    assert memory_dir(tmp_path) == tmp_path / ".soba" / "memory"
    assert Path(".soba", "memory") == MEMORY_FOLDER


# --- the mirroring rules --------------------------------------------------------------------

ALL_TRIGGERS: tuple[TriggerName, ...] = get_args(TriggerName)
ALL_QUALITIES: tuple[Quality, ...] = get_args(Quality)


def test_every_trigger_is_covered() -> None:
    assert set(ALL_TRIGGERS) == {
        "hard_limit",
        "auto_threshold",
        "turn_complete",
        "milestone",
        "plan_pivot",
        "user",
        "context_overflow",
    }
    assert set(ALL_QUALITIES) == {"full", "degraded"}


@pytest.mark.parametrize("explicit_compact", [True, False])
@pytest.mark.parametrize("quality", ALL_QUALITIES)
@pytest.mark.parametrize("trigger", ALL_TRIGGERS)
def test_only_an_explicit_full_compact_is_mirrored(
    trigger: TriggerName, quality: Quality, explicit_compact: bool
) -> None:
    expected = trigger == "user" and quality == "full" and explicit_compact
    assert should_mirror(capsule(trigger, quality), explicit_compact=explicit_compact) is expected


@pytest.mark.parametrize("quality", ALL_QUALITIES)
def test_a_loaded_capsule_is_never_mirrored(quality: Quality) -> None:
    loaded = capsule("user", quality, source="/shared/handoff.capsule.md")
    assert should_mirror(loaded, explicit_compact=True) is False


def test_a_capsule_missing_sections_is_never_mirrored() -> None:
    damaged = capsule(content="## Goal and constraints\n\nForecast.\n")
    assert should_mirror(damaged, explicit_compact=True) is False


# --- writing and listing --------------------------------------------------------------------


def test_mirror_writes_a_valid_redacted_capsule_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORECAST_DB_PASSWORD", "pa55-forecast-db")
    leaky = render_capsule(
        Capsule(
            goal_and_constraints="Forecast weekly demand.",
            work_done=f"- logged in with {FAKE_HF_TOKEN}; db password pa55-forecast-db",
        )
    )
    path = mirror(capsule(content=leaky), tmp_path, notebook="/w/forecast.ipynb", session_id="s1")
    assert path == tmp_path / ".soba" / "memory" / "ck_0a0b0c0d.capsule.md"
    raw = path.read_text(encoding="utf-8")
    assert FAKE_HF_TOKEN not in raw and "pa55-forecast-db" not in raw
    cf = read_capsule_file(path)
    assert cf.metadata.source_notebook == "/w/forecast.ipynb" and cf.metadata.source_session == "s1"
    assert cf.metadata.trigger == "user" and cf.metadata.quality == "full"
    assert "- logged in with [redacted]; db password [redacted]" in cf.body


def test_mirroring_the_same_checkpoint_again_replaces_its_file(tmp_path: Path) -> None:
    mirror(capsule(), tmp_path, notebook=None, session_id="s1")
    newer = render_capsule(Capsule(goal_and_constraints="Forecast monthly demand."))
    path = mirror(capsule(content=newer), tmp_path, notebook=None, session_id="s1")
    assert read_capsule_file(path).body == newer
    assert [p.name for p in memory_dir(tmp_path).iterdir()] == ["ck_0a0b0c0d.capsule.md"]


def test_list_memory(tmp_path: Path) -> None:
    assert list_memory(tmp_path) == []
    mirror(capsule(checkpoint="ck_11111111"), tmp_path, notebook="/w/a.ipynb", session_id="s1")
    mirror(capsule(checkpoint="ck_22222222"), tmp_path, notebook="/w/b.ipynb", session_id="s2")
    (memory_dir(tmp_path) / "ck_33333333.capsule.md").write_text(
        "not a capsule\n", encoding="utf-8"
    )
    (memory_dir(tmp_path) / "README.txt").write_text("ignored\n", encoding="utf-8")

    listed = list_memory(tmp_path)
    assert [item.path.name for item in listed] == [
        "ck_33333333.capsule.md",
        "ck_11111111.capsule.md",
        "ck_22222222.capsule.md",
    ]
    damaged, first, second = listed
    assert (
        damaged.metadata is None
        and damaged.error is not None
        and "no front matter" in damaged.error
    )
    assert (
        first.metadata is not None
        and first.metadata.checkpoint == "ck_11111111"
        and first.error is None
    )
    assert second.metadata is not None and second.metadata.source_notebook == "/w/b.ipynb"
