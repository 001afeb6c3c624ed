"""What a capsule replaced, and what of it the capsule does not mention (SPEC §14, `%capsule diff`).

A capsule replaces the entries of its path from the previous capsule's `firstKeptEntryId`
(the session's start when there is none) up to its own `firstKeptEntryId`: the part the
model no longer sees whole. `capsule_diff` lists that span's user requests (what the user
typed: a slash command as `/fix`, never soba's expansion), its tool calls (name and key
argument), and the files it read and wrote, and marks each item the capsule's text does not
mention, so the user can check the capsule before the next request carries it and correct it
(`%capsule edit`, `%%capsule amend`).

"Mentioned" is read generously, the way a person checks a summary, never by meaning:

- a request, when the capsule quotes it, or a run of `QUOTE_WORDS` of its words in order
  (a clear part of it; punctuation, case and Markdown around the words do not matter);
- a file, when its path appears;
- a tool call, when its key argument appears: the path of a file tool, the first line of
  python code or a shell command (its first `KEY_CHARS` characters), a checkpoint's note;
  a call with no such argument, when its tool's name does.

An amended capsule (`amends`) replaced what the capsule it corrects replaced: the span is
found from the first capsule of the chain, and the text checked is the amendment's. Pure
logic over entries: no IPython, no file, no model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Literal

from msgspec import Struct

from soba_nb.compaction.extract import Scan
from soba_nb.compaction.model_input import VISIBLE_TYPES
from soba_nb.text import one_line
from soba_nb.transcript.entries import (
    CapsuleEntry,
    Entry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
)

QUOTE_WORDS = 5
"""A request counts as quoted when this many of its words appear in order in the capsule (or
all of them, for a shorter request of at least `MIN_MATCHED_WORDS`)."""
MIN_MATCHED_WORDS = 3
"""A request shorter than this (`/fix`, `go on`) counts only when quoted as typed."""
KEY_CHARS = 80
"""The start of a key argument (code's first line, a command) that must appear."""
REQUEST_CHARS = 120
"""A request as the listing shows it (one line, clipped)."""
ARGUMENT_CHARS = 80
"""A tool call's key argument as the listing shows it."""
KEY_ARGUMENTS = ("path", "code", "command", "note", "source")
"""The argument that says what a call did, by the first of these it has."""
READING_TOOLS = frozenset({"read_file", "read_notebook"})

ItemKind = Literal["request", "tool call", "file read", "file written"]
_WORD = re.compile(r"\w+")


class DiffItem(Struct, frozen=True):
    """One thing the capsule replaced."""

    kind: ItemKind
    text: str
    """As the listing shows it (raw: the caller escapes it)."""
    mentioned: bool


class CapsuleDiff(Struct, frozen=True):
    """`capsule_diff`'s answer: the capsule and the items of the span it replaced, in order."""

    capsule: CapsuleEntry
    replaced: int
    """Entries of the span the model saw (messages, tool calls and results, cells)."""
    items: tuple[DiffItem, ...]

    def of_kind(self, kind: ItemKind) -> list[DiffItem]:
        return [item for item in self.items if item.kind == kind]

    @property
    def missing(self) -> list[DiffItem]:
        """The items the capsule does not mention."""
        return [item for item in self.items if not item.mentioned]


def original_index(path: Sequence[Entry], capsule_at: int) -> int:
    """The index of the first capsule of `path[capsule_at]`'s amendment chain (itself when it
    amends nothing): where the compaction that made it cut the path."""
    index = capsule_at
    amends = _capsule_at(path, capsule_at).amends
    while amends is not None:
        found = next((i for i in range(index - 1, -1, -1) if _checkpoint_of(path[i]) == amends), None)
        if found is None:
            break
        index, amends = found, _capsule_at(path, found).amends
    return index


def _capsule_at(path: Sequence[Entry], index: int) -> CapsuleEntry:
    entry = path[index]
    assert isinstance(entry, CapsuleEntry)
    return entry


def _checkpoint_of(entry: Entry) -> str | None:
    return entry.checkpoint_id if isinstance(entry, CapsuleEntry) else None


def replaced_span(path: Sequence[Entry], capsule_at: int) -> list[Entry]:
    """The entries of `path` that the capsule at `capsule_at` replaced (see the module)."""
    original_at = original_index(path, capsule_at)
    original = _capsule_at(path, original_at)
    end = _index_before(path, original.first_kept_entry_id, original_at)
    if end is None:
        end = original_at
    previous_at = next((i for i in range(original_at - 1, -1, -1) if isinstance(path[i], CapsuleEntry)), None)
    start = 0
    if previous_at is not None:
        previous = _capsule_at(path, previous_at)
        kept = _index_before(path, previous.first_kept_entry_id, previous_at)
        start = kept if kept is not None else previous_at + 1
    return list(path[start:end])


def _index_before(path: Sequence[Entry], entry_id: str | None, before: int) -> int | None:
    if entry_id is None:
        return None
    return next((i for i in range(before - 1, -1, -1) if path[i].id == entry_id), None)


def capsule_diff(path: Sequence[Entry], capsule_at: int) -> CapsuleDiff:
    """What the capsule at `capsule_at` of `path` replaced, each item marked mentioned or not."""
    capsule = _capsule_at(path, capsule_at)
    span = replaced_span(path, capsule_at)
    text = capsule.content
    words = _words(text)
    items: list[DiffItem] = []
    read: dict[str, None] = {}
    written: dict[str, None] = {}
    for entry in span:
        if isinstance(entry, MessageEntry) and entry.role == "user":
            said = entry.typed if entry.typed is not None else entry.content
            items.append(DiffItem("request", one_line(said, REQUEST_CHARS), request_mentioned(said, text, words)))
        elif isinstance(entry, ToolCallEntry):
            arguments = _arguments(entry.arguments)
            key = next((value for name in KEY_ARGUMENTS if isinstance(value := arguments.get(name), str) and value.strip()), "")
            shown = f"{entry.name} {one_line(_first_line(key), ARGUMENT_CHARS)}".rstrip()
            items.append(DiffItem("tool call", shown, _key_mentioned(entry.name, key, text)))
            path_argument = arguments.get("path")
            if entry.name in READING_TOOLS and isinstance(path_argument, str) and path_argument:
                read[path_argument] = None
        elif isinstance(entry, ToolResultEntry) and entry.files:
            written.update((change.path, None) for change in entry.files)
    scan = Scan({e.call_id: e for e in span if isinstance(e, ToolResultEntry)})
    scan.run(e for e in span if isinstance(e, ToolCallEntry))
    written.update(dict.fromkeys(scan.files_modified))
    items += [DiffItem("file read", path, _path_mentioned(path, text)) for path in read]
    items += [DiffItem("file written", path, _path_mentioned(path, text)) for path in written]
    visible = sum(1 for entry in span if isinstance(entry, VISIBLE_TYPES))
    return CapsuleDiff(capsule, visible, tuple(items))


def _arguments(raw: str) -> dict[str, object]:
    """A call's arguments from their JSON text; {} when it is not a JSON object (a model's
    malformed arguments: the call is still listed, by its name)."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _words(text: str) -> str:
    """The words of `text`, lower-cased, one space between, with a space at each end (so a
    run of words is found whole, never inside a longer word)."""
    return " " + " ".join(_WORD.findall(text.lower())) + " "


def _squeezed(text: str) -> str:
    return " ".join(text.lower().split())


def request_mentioned(request: str, capsule: str, capsule_words: str | None = None) -> bool:
    """True when `capsule` quotes `request`, or a clear part of it (see the module)."""
    if not request.strip():
        return True
    if _squeezed(request) in _squeezed(capsule):
        return True
    words = _WORD.findall(request.lower())
    if len(words) < MIN_MATCHED_WORDS:
        return False
    haystack = capsule_words if capsule_words is not None else _words(capsule)
    run = min(QUOTE_WORDS, len(words))
    return any(f" {' '.join(words[i : i + run])} " in haystack for i in range(len(words) - run + 1))


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _key_mentioned(name: str, key: str, capsule: str) -> bool:
    first = _first_line(key)
    if not first:
        return name in capsule
    return _squeezed(first[:KEY_CHARS]) in _squeezed(capsule)


def _path_mentioned(path: str, capsule: str) -> bool:
    bare = path.removeprefix("./")
    return bool(bare) and bare in capsule
