"""Skills: Markdown instruction files the user keeps in `<project>/.soba/skills/<name>/SKILL.md`.

Activating a skill (`%soba --skill NAME`) records its content as a transcript entry, so the
instructions reach the model and survive compaction (SPEC §9). This module only finds and
reads them; names are restricted to letters, digits, `-` and `_`, so a name can never point
outside the skills folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from soba_nb.layout import SKILLS_FOLDER

SKILL_FILE = "SKILL.md"
SKILL_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]+")


class SkillError(Exception):
    """A skill that cannot be loaded; the message names the skill and where it was looked for."""


@dataclass(frozen=True)
class Skill:
    name: str
    path: Path
    """The SKILL.md file that was read."""
    content: str
    """The Markdown instructions, as written."""


def skills_folder(project_root: Path) -> Path:
    return project_root / SKILLS_FOLDER


def list_skills(project_root: Path) -> list[str]:
    """Names of the skills in the project, sorted; empty when there is no skills folder."""
    folder = skills_folder(project_root)
    if not folder.is_dir():
        return []
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if SKILL_NAME_PATTERN.fullmatch(entry.name) and (entry / SKILL_FILE).is_file()
    )


def load_skill(project_root: Path, name: str) -> Skill:
    """Read one skill; `SkillError` when the name is invalid or the file is missing or unreadable."""
    folder = skills_folder(project_root)
    if not SKILL_NAME_PATTERN.fullmatch(name):
        raise SkillError(f"skill name {name!r} is invalid: use only letters, digits, '-' and '_'")
    path = folder / name / SKILL_FILE
    if not path.is_file():
        available = list_skills(project_root)
        known = f"available: {', '.join(available)}" if available else "no skills are defined"
        raise SkillError(f"skill '{name}' not found: no {SKILL_FILE} in {folder / name} ({known})")
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise SkillError(f"skill '{name}' could not be read from {path}: {error}") from error
    return Skill(name=name, path=path, content=content)
