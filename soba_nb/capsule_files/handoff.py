"""Plain Markdown handoffs between coding agents (issue 13, item 6).

Out: `--format agents-md` renders a capsule as a Markdown file another agent reads as
project instructions (written as `AGENTS.md`, say): a top heading and a short intro naming
the source notebook, session, checkpoint and creation time, then the capsule's sections
(the 13 `## ` headings of SPEC §4, and any extra ones) verbatim. No front matter and no
hash: the reader is a person or an agent, not soba-nb. Secrets are redacted with
`soba_nb.redact`, like every file we write.

In: `%capsule load PATH --untrusted` reads a Markdown handoff written anywhere (an
`AGENTS.md`, another agent's notes, one of our own exports) tolerantly: a front matter, if
any, is skipped; the `## ` sections are read with the capsule parser, so the 13 known
headings fill their sections (missing ones stay empty) and other sections are kept as
extra sections, in order; text before the first section is kept as a "Preamble" section,
except the intro soba-nb writes itself. The result is a `degraded` capsule: nothing in the
file is verified, and model input frames it as data, not instructions (every loaded
capsule is). A file that is not Markdown text with at least one non-empty `## ` section
is refused with one line naming the file and the problem.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from soba_nb.capsule_files.file import CapsuleFileError, read_text_file
from soba_nb.compaction.capsule import Capsule, parse_capsule, render_capsule, split_sections
from soba_nb.paths import shown
from soba_nb.redact import redact
from soba_nb.transcript.entries import CapsuleEntry, utc_now

AGENTS_MD = "AGENTS.md"
"""The file name an exported handoff gets in a folder: what terminal agents read."""
HANDOFF_SUFFIX = ".md"
MAX_HANDOFF_BYTES = 1024 * 1024
"""A handoff goes into model input whole: a megabyte (~250k tokens) is already too much, so
anything larger is certainly not one."""
HANDOFF_HEADING = "# Handoff from a soba-nb session"
PREAMBLE_SECTION = "Preamble"
"""The extra section that keeps a loaded file's text from before its first `## ` heading."""
HANDOFF_KIND = "a Markdown handoff"

HANDOFF_INTRO = """\
This file hands over work done by soba-nb, a coding agent working in a Jupyter notebook. It
is the session's Context Capsule: the goal and constraints, what was done, decided and left
open, the files read and modified, and the commands that verify the work. Read it as the
state of the project when it was written, check what you rely on against the files
themselves, and continue from "Next steps". "Kernel state" lists variables of the
notebook's Python kernel; they do not exist outside it."""

_TITLE = re.compile(r"^ {0,3}#(?!#)[ \t]+(?P<title>\S.*?)[ \t#]*$")
_DELIMITER = "---"
_OUR_TITLE = re.compile(r"^- Title: (?P<title>.+)$", re.MULTILINE)


# --- out ----------------------------------------------------------------------------------


def render_handoff(
    entry: CapsuleEntry,
    *,
    notebook: str | None,
    session_id: str | None,
    base: Path | None = None,
    created: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> str:
    """The handoff Markdown of a capsule entry, secrets redacted.

    `base`: the folder the file is written to (the source notebook is named relative to it
    when inside it).
    """
    quality = "full (a validated model summary)" if entry.quality == "full" else (
        "degraded (built from the transcript without a model)"
    )
    facts = [
        ("Source notebook", shown(notebook, base) if notebook else "unknown"),
        ("Session", session_id or "unknown"),
        ("Checkpoint", entry.checkpoint_id),
        ("Created", created or utc_now()),
        ("Quality", quality),
    ]
    if entry.title:
        facts.insert(0, ("Title", entry.title))
    listed = "\n".join(f"- {name}: {value}" for name, value in facts)
    text = f"{HANDOFF_HEADING}\n\n{HANDOFF_INTRO}\n\n{listed}\n\n{entry.content.strip()}\n"
    return redact(text, environ)


# --- in -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Handoff:
    """A Markdown handoff read as a capsule."""

    title: str
    """The file's `# ` heading, or its name."""
    capsule: Capsule


def _without_front_matter(text: str) -> str:
    """The text after a leading `---` … `---` block (YAML metadata, a capsule front matter);
    the text itself when there is none or it is never closed."""
    lines = text.split("\n")
    if lines[0].rstrip() != _DELIMITER:
        return text
    for index in range(1, len(lines)):
        if lines[index].rstrip() == _DELIMITER:
            return "\n".join(lines[index + 1 :])
    return text


def _title_and_preamble(preamble: str) -> tuple[str | None, str]:
    """The first `# ` heading of the text before the sections, and the rest of that text."""
    lines = preamble.split("\n")
    for index, line in enumerate(lines):
        match = _TITLE.match(line)
        if match:
            rest = "\n".join(lines[:index] + lines[index + 1 :]).strip()
            return match["title"], rest
    return None, preamble.strip()


def parse_handoff(text: str, *, source: str, name: str) -> Handoff:
    """Read Markdown text as a handoff. `source` names the file in errors, `name` is the
    title when the text has no `# ` heading. Raises `CapsuleFileError`."""
    text = text.removeprefix("\ufeff").replace("\r\n", "\n")
    if not text.strip():
        raise CapsuleFileError(source, "empty file")
    nul = text.find("\x00")
    if nul != -1:
        raise CapsuleFileError(source, f"binary data (a NUL byte at offset {nul:,}), not Markdown text")
    body = _without_front_matter(text)
    preamble, sections = split_sections(body)
    if not sections:
        raise CapsuleFileError(
            source, "no `## ` sections; a handoff is Markdown with level-2 headings such as `## Goal and constraints`"
        )
    capsule = parse_capsule(body, require_all=False)
    title, intro = _title_and_preamble(preamble)
    if preamble.lstrip().startswith(HANDOFF_HEADING):  # our own intro: keep only the title
        named = _OUR_TITLE.search(intro)
        title, intro = (named["title"] if named else title), ""
    if intro:
        # Validated, not copied: the preamble's body is normalized like every section's (a lone
        # "-" is an empty section, so the handoff reads back and renders the same).
        capsule = Capsule.model_validate(
            {**dict(capsule), "extra_sections": [(PREAMBLE_SECTION, intro), *capsule.extra_sections]}
        )
    if capsule.is_blank() and not any(extra for _, extra in capsule.extra_sections):
        raise CapsuleFileError(source, "every `## ` section is empty; nothing to hand over")
    return Handoff(title=title or name, capsule=capsule)


def read_handoff(path: str | os.PathLike[str]) -> Handoff:
    """Read a Markdown handoff file (regular file, at most `MAX_HANDOFF_BYTES`, UTF-8 text)."""
    path = Path(path)
    text = read_text_file(path, max_bytes=MAX_HANDOFF_BYTES, kind=HANDOFF_KIND)
    return parse_handoff(text, source=str(path), name=path.name)


def handoff_body(handoff: Handoff) -> str:
    """The capsule Markdown of a handoff: all 13 headings (empty ones say so), extras last."""
    return render_capsule(handoff.capsule)
