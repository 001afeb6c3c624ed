"""Skills: `.soba/skills/<name>/SKILL.md` files are listed and loaded; bad names and missing files are clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from soba_nb.agent.skills import Skill, SkillError, list_skills, load_skill


def write_skill(project: Path, name: str, content: str) -> Path:
    path = project / ".soba" / "skills" / name / "SKILL.md"
    path.parent.mkdir(parents=True)
    path.write_text(content, encoding="utf-8")
    return path


def test_no_skills_folder_means_no_skills(tmp_path: Path) -> None:
    assert list_skills(tmp_path) == []


def test_list_skills_sorted_and_only_folders_with_skill_md(tmp_path: Path) -> None:
    write_skill(tmp_path, "plotting", "# Plotting")
    write_skill(tmp_path, "data-cleaning_v2", "# Cleaning")
    (tmp_path / ".soba" / "skills" / "empty").mkdir()
    (tmp_path / ".soba" / "skills" / "bad name").mkdir()
    (tmp_path / ".soba" / "skills" / "bad name" / "SKILL.md").write_text("x")
    (tmp_path / ".soba" / "skills" / "README.md").write_text("not a skill")
    assert list_skills(tmp_path) == ["data-cleaning_v2", "plotting"]


def test_load_skill_returns_name_path_and_content(tmp_path: Path) -> None:
    path = write_skill(tmp_path, "plotting", "# Plotting\n\nUse matplotlib, label axes. ✓\n")
    assert load_skill(tmp_path, "plotting") == Skill(
        name="plotting", path=path, content="# Plotting\n\nUse matplotlib, label axes. ✓\n"
    )


def test_missing_skill_names_the_skill_the_folder_and_the_alternatives(tmp_path: Path) -> None:
    write_skill(tmp_path, "plotting", "x")
    with pytest.raises(SkillError) as raised:
        load_skill(tmp_path, "sql")
    message = str(raised.value)
    assert "'sql'" in message
    assert str(tmp_path / ".soba" / "skills" / "sql") in message
    assert "available: plotting" in message


def test_missing_skill_when_none_exist(tmp_path: Path) -> None:
    with pytest.raises(SkillError, match="no skills are defined"):
        load_skill(tmp_path, "sql")


@pytest.mark.parametrize("name", ["../secret", "a/b", "", "with space", ".hidden", "skill.md"])
def test_invalid_names_are_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "SKILL.md").write_text("outside the skills folder")
    with pytest.raises(SkillError, match="invalid"):
        load_skill(tmp_path, name)


def test_unreadable_skill_is_a_skill_error(tmp_path: Path) -> None:
    path = write_skill(tmp_path, "binary", "")
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(SkillError, match="could not be read"):
        load_skill(tmp_path, "binary")
