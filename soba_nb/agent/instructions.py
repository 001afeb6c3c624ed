"""The project's `AGENTS.md` (SPEC §19): found, read untrusted, bounded.

The file is the project folder's (`session.project_root`: the notebook's folder or the nearest
parent holding `soba.json` or `.git`), read again as every turn starts, so an edit is sent from
the next turn on. It is data: the model reads it as the project's conventions, and nothing in
it changes a setting or what needs approval. What is refused is one line and nothing is sent:
anything but a regular file (a folder, a FIFO, never waited on), a link to a file outside the
project, text that is not UTF-8, a file over `MAX_INSTRUCTIONS_BYTES`. Its size is bounded: at
most `MAX_INSTRUCTIONS_TOKENS` tokens are sent, and at most `WINDOW_SHARE` of the hard limit
(a small window must still hold the work and its capsule), with one line saying so.

How the message travels and is counted is the compaction core's
(`soba_nb.compaction.instructions`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from soba_nb.compaction.instructions import instructions_message
from soba_nb.paths import shown
from soba_nb.tokens import TokenCounter

AGENTS_FILE = "AGENTS.md"
"""The file terminal agents (Codex, opencode, pi) read as project instructions."""
MAX_INSTRUCTIONS_TOKENS = 4_000
"""The most of the file a request carries: instructions are a page or two, and every request
pays for them."""
WINDOW_SHARE = 0.25
"""The most of the hard limit they may take (a 6,000-token window: 1,250 tokens)."""
MAX_INSTRUCTIONS_BYTES = 1024 * 1024
"""Larger is no page of instructions (and `/dev/zero` behind a link must not be read forever)."""
CUT_AT_LINE_SHARE = 0.8
"""A clip ends at a line's end when one is in the last fifth of what fits."""


@dataclass(frozen=True)
class ProjectInstructions:
    """What a turn sends of the project's `AGENTS.md`."""

    path: Path
    message: str
    """The message the model reads (`instructions_message`): a frame, then the text."""
    tokens: int
    """Tokens of the whole file."""
    sent_tokens: int
    """Tokens of the text sent (less than `tokens` when clipped)."""

    @property
    def clipped(self) -> bool:
        return self.sent_tokens < self.tokens


@dataclass(frozen=True)
class InstructionsFound:
    """The instructions to send (None: none), and the line to show the user (None: nothing
    to say)."""

    instructions: ProjectInstructions | None
    line: str | None = None


def instructions_limit(hard_limit: int) -> int:
    """The most tokens of the file a request carries under `hard_limit`."""
    return max(0, min(MAX_INSTRUCTIONS_TOKENS, int(hard_limit * WINDOW_SHARE)))


def read_instructions(project_root: Path, counter: TokenCounter, *, limit: int = MAX_INSTRUCTIONS_TOKENS) -> InstructionsFound:
    """The project's `AGENTS.md` as a request carries it: at most `limit` tokens of it."""
    path = project_root / AGENTS_FILE
    if not os.path.lexists(path):
        return InstructionsFound(None)
    data = _read(path, project_root)
    if isinstance(data, str):
        return InstructionsFound(None, f"{shown(path)}: {data}; not sent")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return InstructionsFound(None, f"{shown(path)}: not UTF-8 text (byte {exc.start}); not sent")
    if not text.strip():
        return InstructionsFound(None)
    tokens = counter.count_text(text)
    sent_text, sent = (text, tokens) if tokens <= limit else _clip(text, limit, counter)
    line = None
    if sent < tokens:
        line = f"{AGENTS_FILE} is {tokens:,} tokens; the first {sent:,} are sent"
        if limit < MAX_INSTRUCTIONS_TOKENS:
            line += f" (at most {WINDOW_SHARE:.0%} of this model's hard limit)"
    folder = project_root.name or str(project_root)
    message = instructions_message(sent_text, name=AGENTS_FILE, folder=folder, tokens=tokens, sent=sent)
    return InstructionsFound(ProjectInstructions(path, message, tokens, sent), line)


def _read(path: Path, project_root: Path) -> bytes | str:
    """The file's bytes, or why it is refused (in words). `stat` first, so a FIFO is never
    opened; the open is non-blocking and checked again, as the name may be replaced."""
    try:
        if path.is_symlink():
            target, root = path.resolve(), project_root.resolve()
            if not target.is_relative_to(root):
                return f"a link to {shown(target)}, outside the project"
        refusal = _not_a_file(os.stat(path).st_mode)
        if refusal is not None:
            return refusal
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        refusal = _not_a_file(info.st_mode)
        if refusal is not None:
            return refusal
        data = file.read(MAX_INSTRUCTIONS_BYTES + 1)
    if len(data) > MAX_INSTRUCTIONS_BYTES:
        return f"larger than {MAX_INSTRUCTIONS_BYTES:,} bytes, no page of instructions"
    return data


def _not_a_file(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    return "a folder, not a file" if stat.S_ISDIR(mode) else "not a regular file"


def _clip(text: str, limit: int, counter: TokenCounter) -> tuple[str, int]:
    """The longest head of `text` of at most `limit` tokens (ending at a line's end when one
    is near), and its tokens."""
    low, high = 0, len(text)
    while low < high:  # the longest prefix that fits, by halving
        middle = (low + high + 1) // 2
        if counter.count_text(text[:middle]) <= limit:
            low = middle
        else:
            high = middle - 1
    head = text[:low]
    line_end = head.rfind("\n")
    if line_end >= low * CUT_AT_LINE_SHARE:
        head = head[: line_end + 1]
    return head, counter.count_text(head)
