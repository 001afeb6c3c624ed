"""A repaired copy of a damaged transcript (`soba-nb verify --repair`), never in place.

Loading refuses a file with a bad line in the middle (anything but the torn lines a crash
leaves, which it tolerates). To get a session back, `repair` reads the file line by line,
keeps every entry that parses and hangs from a kept entry, and reports every line it leaves
out and why. An entry whose parent was on a line left out is kept, hung from the entry kept
just before it (so one bad line in the middle costs that line, not the rest of the session),
and reported as re-attached. The copy goes beside the original as `<stem>.repaired.jsonl`, written to a
temporary file first and then linked into place, so it is never half-written and never
replaces anything; the original is not touched.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from soba_nb.layout import SessionLayout
from soba_nb.redact import redact_entry_data
from soba_nb.transcript.entries import (
    Entry,
    LeafEntry,
    entry_from_dict,
    entry_from_json,
    entry_to_dict,
    entry_to_json,
)
from soba_nb.transcript.errors import describe_error, is_json_error
from soba_nb.transcript.store import TORN_MARKER


class RepairError(OSError):
    """The repaired copy could not be written (it exists already, or the folder is not writable)."""


@dataclass
class RepairReport:
    """What `repair` kept and what it left out."""

    source: Path
    output: Path
    kept: int = 0
    dropped: list[tuple[int, str]] = field(default_factory=list)
    """(line number, why) for each line left out."""
    reattached: list[tuple[int, str, int]] = field(default_factory=list)
    """(line number, its lost parent's id, the line of the entry it now hangs from) for each
    entry whose parent was on a line left out."""


def repaired_path(path: Path) -> Path:
    return SessionLayout(path).repaired


def _why_not(entry: Entry, kept: dict[str, Entry]) -> str | None:
    if entry.id in kept:
        return f"duplicate id {entry.id!r}"
    if entry.parent_id is not None and entry.parent_id not in kept:
        return f"its parent {entry.parent_id!r} was left out or never written"
    if isinstance(entry, LeafEntry):
        target = kept.get(entry.target_id)
        if target is None or isinstance(target, LeafEntry):
            return f"leaf targetId {entry.target_id!r} names no kept entry"
    return None


def _kept_lines(raw: bytes, report: RepairReport) -> list[bytes]:
    kept: dict[str, Entry] = {}
    out: list[bytes] = []
    last_kept: tuple[str, int] | None = None
    """(id, line) of the entry kept last: what an entry whose parent was lost hangs from."""
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            if line:
                report.dropped.append((number, "blank line"))
            continue
        try:
            entry = entry_from_json(line)
        except msgspec.DecodeError as exc:
            why = "not valid JSON (torn by a crash?)" if is_json_error(exc) else f"bad entry ({describe_error(exc)})"
            report.dropped.append((number, why))
            continue
        lost_parent = entry.parent_id is not None and entry.parent_id not in kept and entry.id not in kept
        if lost_parent and report.dropped and last_kept is not None and not isinstance(entry, LeafEntry):
            # Its parent was most likely on a line left out: the entries after a bad line are
            # kept, hung from the entry before it, rather than dropped with it.
            report.reattached.append((number, str(entry.parent_id), last_kept[1]))
            entry = msgspec.structs.replace(entry, parent_id=last_kept[0])
        problem = _why_not(entry, kept)
        if problem is not None:
            report.dropped.append((number, problem))
            continue
        kept[entry.id] = entry
        last_kept = (entry.id, number)
        data = redact_entry_data(entry_to_dict(entry))
        data.pop(TORN_MARKER, None)
        out.append(entry_to_json(entry_from_dict(data)).encode("utf-8", "replace"))
    report.kept = len(out)
    return out


def repair(path: Path) -> RepairReport:
    """Write the repaired copy of `path` beside it and say what was left out."""
    path = Path(path)
    report = RepairReport(path, repaired_path(path))
    lines = _kept_lines(path.read_bytes(), report)
    data = b"".join(line + b"\n" for line in lines)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temp_name, report.output)
        except FileExistsError:
            raise RepairError(f"{report.output}: already exists; move it away to repair again") from None
    finally:
        os.unlink(temp_name)
    return report
