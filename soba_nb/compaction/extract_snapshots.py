"""Snapshots of the extract's scan, kept beside the transcript (`<session-id>.extract`).

A summary request carries the history too old to be shown as a deterministic extract
(`soba_nb.compaction.extract.Scan` over every dropped entry). Scanning a long region when the
summary is built would cost in proportion to the whole history (half a second at 100k
entries); instead the scan follows the session: at a preflight, once the region has grown by
`SPACING` entries past the newest snapshot, the scan is carried forward and saved, one JSON line
per snapshot. A summary then starts from the newest snapshot at or before its boundary and scans
only the entries after it, about what it sends.

A snapshot holds only what the extract reads (`trim`: the first and latest user requests, the
newest work and decisions, every run, file, name and stated constraint), so restoring it and
scanning on gives the very extract a scan from the start would: the tests check it. It is keyed
by the region (its first entry id and the capsule it follows), the number of region entries it
covers and the id of the last one, so a snapshot from another branch or region is never used.
Calls that had no result when it was taken are listed: a result appearing later voids it.

Like the token index it is a cache, never the truth: a file written by other extract rules
(the hash of this code), a torn or malformed line, a symlink or FIFO in its place: ignored or
replaced; every line goes through `redact_data`; deleting the file costs one scan.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from soba_nb.compaction import deterministic, extract
from soba_nb.compaction.deterministic import (
    DECISIONS_NEW_MAX,
    WORK_DONE_NEW_LINES,
    item_key,
    run_key,
)
from soba_nb.compaction.extract import Run, Scan, Start, fresh_start
from soba_nb.compaction.planner import region_start
from soba_nb.layout import SessionLayout
from soba_nb.redact import redact_data
from soba_nb.transcript.entries import Entry, ToolCallEntry, ToolResultEntry
from soba_nb.transcript.sidecar import open_for_append, read_regular, replace_with

SPACING = 1024
"""Region entries between snapshots (at least; more when snapshots are big)."""
CATCH_UP_ENTRIES = 4096
"""The most region entries one `follow` scans. A live session adds a few between preflights; a
transcript opened without its `.extract` (copied, restored) has no snapshot of a long region:
that is not caught up at a preflight (a summary of it scans, as it would have to anyway, and
the region after the next capsule gets snapshots as it grows)."""
BYTES_PER_ENTRY = 128
"""A snapshot of N bytes waits N / this many entries for the next: the file grows more slowly
than the transcript (~670 bytes an entry) however much the scan holds."""
STALE_CALL_ENTRIES = 64
"""A call still unanswered this many entries later is taken as never answered; a newer one
stops the scan (its result is most likely on the way)."""
KEEP_NEWEST = 4
MAX_LINES = 24
"""Above this many snapshots the file is rewritten: the newest `KEEP_NEWEST`, then one per
doubling of the distance back from the newest (a boundary far back is rare and still served)."""
MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_FILE_BYTES = 256 * 1024 * 1024
REQUESTS_KEPT = 5
"""The latest user requests a snapshot keeps (the first is kept too): capsules quote the requests
from the entries themselves (`soba_nb.compaction.requests`), not from a scan."""


# --- what a snapshot holds -----------------------------------------------------------


def trim(scan: Scan) -> None:
    """Drop, in place, what `capsule_from_scan` never reads, so a scan's size follows what it
    found (distinct runs, files, names, constraints), not how many entries it read."""
    if len(scan.user_messages) > REQUESTS_KEPT + 1:
        del scan.user_messages[1 : len(scan.user_messages) - REQUESTS_KEPT]
    # One more than a capsule shows: the newest item may be the narration of a step that a tool
    # call after the snapshot takes back (`Scan._step_not_answer`), and the one before it then
    # shows, as it does in a scan of the whole region.
    scan.work[:] = _newest_unflagged(scan.work, WORK_DONE_NEW_LINES + 1)
    scan.decisions[:] = _newest_unflagged(scan.decisions, DECISIONS_NEW_MAX)
    scan.constraints[:] = _last_by_key(scan.constraints, item_key)
    scan.stated_blockers[:] = _last_by_key(scan.stated_blockers, run_key)
    limit = deterministic.LIST_ITEMS_MAX  # (read now: tests lower it)
    for name in ("runs", "files_read", "files_modified", "assigned", "artifacts"):
        mapping = getattr(scan, name)
        if len(mapping) > limit:
            setattr(scan, name, dict(list(mapping.items())[-limit:]))
            if name not in scan.older_left_out:
                scan.older_left_out.append(name)


def _newest_unflagged(pairs: list[tuple[bool, str]], newest: int) -> list[tuple[bool, str]]:
    """Flagged items and the newest `newest` others, in order (what `_select` picks)."""
    others = sum(1 for flagged, _ in pairs if not flagged)
    skip = others - newest
    kept = []
    for flagged, item in pairs:
        if not flagged and skip > 0:
            skip -= 1
            continue
        kept.append((flagged, item))
    return kept


def _last_by_key(items: list[str], key: Callable[[str], str]) -> list[str]:
    """Each key's last item, in the order of last occurrence (what merging them gives)."""
    merged: dict[str, str] = {}
    for item in items:
        item_id = key(item)
        merged.pop(item_id, None)
        merged[item_id] = item
    return list(merged.values())


class ScanState(msgspec.Struct, forbid_unknown_fields=True):
    """A trimmed `Scan` without its results, with text only in values (redactable)."""

    user_messages: list[str]
    work: list[tuple[bool, str]]
    decisions: list[tuple[bool, str]]
    last_assistant: str | None
    answered_latest_request: bool
    files_read: list[tuple[str, str]]
    files_modified: list[tuple[str, str]]
    runs: list[tuple[str, str, str, str, bool]]
    """(key, kind, display, outcome, failed) in order."""
    last_python: str | None
    assigned: list[str]
    skills: list[tuple[str, str]]
    pending: list[str]
    stated_blockers: list[str]
    constraints: list[str]
    tool_counts: list[tuple[str, int]]
    capsule_text: str | None
    older_left_out: list[str]
    artifacts: list[tuple[str, str]] = []


def state_of(scan: Scan) -> ScanState:
    return ScanState(
        user_messages=list(scan.user_messages),
        work=list(scan.work),
        decisions=list(scan.decisions),
        last_assistant=scan.last_assistant,
        answered_latest_request=scan.answered_latest_request,
        files_read=list(scan.files_read.items()),
        files_modified=list(scan.files_modified.items()),
        runs=[(key, r.kind, r.display, r.outcome, r.failed) for key, r in scan.runs.items()],
        last_python=scan.last_python,
        assigned=list(scan.assigned),
        skills=list(scan.skills.items()),
        pending=list(scan.pending),
        stated_blockers=list(scan.stated_blockers),
        constraints=list(scan.constraints),
        tool_counts=list(scan.tool_counts.items()),
        capsule_text=scan.capsule_text,
        older_left_out=list(scan.older_left_out),
        artifacts=list(scan.artifacts.items()),
    )


def scan_of(state: ScanState, results: dict[str, ToolResultEntry]) -> Scan:
    return Scan(
        results,
        user_messages=list(state.user_messages),
        work=list(state.work),
        decisions=list(state.decisions),
        last_assistant=state.last_assistant,
        answered_latest_request=state.answered_latest_request,
        files_read=dict(state.files_read),
        files_modified=dict(state.files_modified),
        runs={key: Run(kind, display, outcome, failed) for key, kind, display, outcome, failed in state.runs},
        last_python=state.last_python,
        assigned=dict.fromkeys(state.assigned),
        skills=dict(state.skills),
        pending=list(state.pending),
        stated_blockers=list(state.stated_blockers),
        constraints=list(state.constraints),
        tool_counts=dict(state.tool_counts),
        capsule_text=state.capsule_text,
        older_left_out=list(state.older_left_out),
        artifacts=dict(state.artifacts),
    )


class Snapshot(msgspec.Struct, forbid_unknown_fields=True):
    """One line of the file."""

    region: str
    """Id of the region's first entry."""
    capsule: str | None
    """Id of the capsule the region follows (None: the region starts at the root)."""
    covers: int
    """How many region entries the scan read."""
    last: str
    """Id of the last of them."""
    unanswered: list[str]
    """Calls the scan read with no result (a later result voids the snapshot)."""
    scan: ScanState


_decode = msgspec.json.Decoder(Snapshot).decode


# --- the file --------------------------------------------------------------------------


def snapshots_path(transcript: Path) -> Path:
    return SessionLayout(transcript).extract


class ExtractSnapshots:
    """The snapshots of one transcript's extract scan: `follow` at preflights, `start` when a
    summary request is built."""

    def __init__(self, transcript: Path):
        self.path = snapshots_path(transcript)
        self._lines: list[Snapshot] | None = None
        self._raw: dict[tuple[str, str | None, int, str], bytes] = {}
        """Each snapshot's line as written (a rewrite copies it; its length sets the spacing)."""
        """The file's snapshots, oldest first (read on first use)."""
        self._spacing = SPACING
        self._idle: tuple[tuple[str, str | None], int] | None = None
        """(region, length): a try that took no snapshot is not repeated before the region
        reaches that length (each try reads the region once more)."""
        self.written = 0
        """Snapshots this process wrote (tests and benchmarks read it)."""

    @property
    def spacing(self) -> int:
        """Region entries from the newest snapshot to the next (more for a bigger snapshot)."""
        return self._spacing

    # -- reading ------------------------------------------------------------------------

    def lines(self) -> list[Snapshot]:
        if self._lines is None:
            read = _read(self.path)
            self._lines = [line for line, _ in read]
            self._raw = {_key(line): raw for line, raw in read}
            if read:
                self._spacing = max(SPACING, len(read[-1][1]) // BYTES_PER_ENTRY)
        return self._lines

    def start(self, entries: Sequence[Entry], upto: int, *, capsule_id: str | None) -> Start:
        """The newest usable snapshot of `entries` (a region) covering at most `upto` of them,
        ready to scan on (its results are those after it); else a scan from the first entry."""
        if not entries or upto <= 0:
            return fresh_start(entries)
        for line in reversed(self.lines()):
            if line.covers > upto or not _on(line, entries, capsule_id):
                continue
            results = {e.call_id: e for e in entries[line.covers :] if type(e) is ToolResultEntry}
            if any(call_id in results for call_id in line.unanswered):
                continue  # a call it read unanswered has its result now
            return Start(line.covers, scan_of(line.scan, results), tuple(line.unanswered))
        return fresh_start(entries)

    # -- following the session ----------------------------------------------------------

    def follow(self, path: Sequence[Entry], capsule_at: int | None) -> None:
        """Carry the scan forward when the region has grown by the spacing since the newest
        snapshot (called at each preflight; otherwise a few comparisons)."""
        start = region_start(path, capsule_at)
        length = len(path) - start - (capsule_at is not None)
        if length < SPACING:
            return
        capsule_id = None if capsule_at is None else path[capsule_at].id
        lines = self.lines()
        if lines and self._current(lines[-1], path, start, capsule_at, capsule_id) and length - lines[-1].covers < self._spacing:
            return
        region = (path[start].id, capsule_id)
        if self._idle is not None and self._idle[0] == region and length < self._idle[1]:
            return  # the last try found nothing to take (a call waiting, a snapshot too big)
        if not lines and length > CATCH_UP_ENTRIES:
            self._idle = (region, length + SPACING)  # a long region opened cold: left to its summary
            return
        entries = [*path[start:capsule_at], *path[capsule_at + 1 :]] if capsule_at is not None else path
        written = self.written
        self._advance(entries, capsule_id)
        self._idle = (region, length + SPACING) if self.written == written else None

    @staticmethod
    def _current(line: Snapshot, path: Sequence[Entry], start: int, capsule_at: int | None, capsule_id: str | None) -> bool:
        if line.region != path[start].id or line.capsule != capsule_id:
            return False
        index = start + line.covers - 1
        if capsule_at is not None and index >= capsule_at:
            index += 1
        return index < len(path) and path[index].id == line.last

    def _advance(self, entries: Sequence[Entry], capsule_id: str | None) -> None:
        begun = self.start(entries, len(entries), capsule_id=capsule_id)
        covered, scan, unanswered = begun.covered, begun.scan, list(begun.unanswered)
        stop = _stop(entries, covered, scan.results)
        kept = [
            line
            for line in self.lines()
            if line.covers <= covered and _on(line, entries, capsule_id)
        ]
        stop = min(stop, covered + max(CATCH_UP_ENTRIES, self._spacing))  # at most this much per preflight
        while stop - covered >= self._spacing:
            upto = covered + self._spacing
            chunk = entries[covered:upto]
            unanswered += [
                e.call_id for e in chunk if isinstance(e, ToolCallEntry) and e.call_id not in scan.results
            ]
            scan.run(chunk)
            trim(scan)
            covered = upto
            line = Snapshot(entries[0].id, capsule_id, covered, entries[covered - 1].id, list(unanswered), state_of(scan))
            encoded = _encode(line)
            self._spacing = max(SPACING, len(encoded) // BYTES_PER_ENTRY)
            if len(encoded) > MAX_LINE_BYTES:
                continue  # too big to be worth keeping (the next try waits longer)
            line = _decode(encoded)  # what a reader will get, redaction included: go on from it
            scan = scan_of(line.scan, scan.results)
            self._raw[_key(line)] = encoded
            with contextlib.suppress(OSError):  # a read-only folder: summaries only scan more
                self._write(kept, line, rewrite=len(kept) != len(self.lines()))
            kept.append(line)
            self._keep(_retained(kept))
            kept = self.lines()
        if len(kept) != len(self.lines()):  # nothing new, but snapshots of another branch or region go
            with contextlib.suppress(OSError):
                replace_with(self.path, _header() + b"".join(self._raw[_key(line)] for line in kept))
            self._keep(kept)

    def _keep(self, lines: list[Snapshot]) -> None:
        self._lines = lines
        self._raw = {key: self._raw[key] for key in map(_key, lines)}

    def _write(self, kept: list[Snapshot], line: Snapshot, *, rewrite: bool) -> None:
        header = _header()
        if rewrite or len(kept) + 1 > MAX_LINES:
            retained = _retained([*kept, line])
            replace_with(self.path, header + b"".join(self._raw[_key(old)] for old in retained))
        else:
            fd = open_for_append(self.path, header, fresh=not kept and not self._has_header(header))
            try:
                os.write(fd, self._raw[_key(line)])
            finally:
                os.close(fd)
        self.written += 1

    def _has_header(self, header: bytes) -> bool:
        raw = read_regular(self.path, MAX_FILE_BYTES)
        return raw is not None and raw.startswith(header)


def _stop(entries: Sequence[Entry], covered: int, results: dict[str, ToolResultEntry]) -> int:
    """How far a scan that has read `covered` entries may read on: up to the oldest recent call
    still waiting for its result (`results`: those after `covered`)."""
    stop = len(entries)
    for index in range(len(entries) - 1, max(len(entries) - STALE_CALL_ENTRIES, covered) - 1, -1):
        entry = entries[index]
        if type(entry) is ToolCallEntry and entry.call_id not in results:
            stop = index
    return stop


def _on(line: Snapshot, entries: Sequence[Entry], capsule_id: str | None) -> bool:
    """Whether `line` is a snapshot of the first entries of this region (not of another region,
    capsule or branch)."""
    return (
        line.region == entries[0].id
        and line.capsule == capsule_id
        and 0 < line.covers <= len(entries)
        and entries[line.covers - 1].id == line.last
    )


def _key(line: Snapshot) -> tuple[str, str | None, int, str]:
    return line.region, line.capsule, line.covers, line.last


def _retained(lines: list[Snapshot]) -> list[Snapshot]:
    """At most about `MAX_LINES`: the newest few, then the newest in each doubling of the
    distance back from the newest."""
    if len(lines) <= MAX_LINES:
        return lines
    newest = lines[-1].covers
    kept = lines[-KEEP_NEWEST:]
    buckets: set[int] = set()
    older: list[Snapshot] = []
    for line in reversed(lines[:-KEEP_NEWEST]):
        bucket = max(newest - line.covers, 1).bit_length()
        if bucket not in buckets:
            buckets.add(bucket)
            older.append(line)
    return [*reversed(older), *kept]


def _encode(line: Snapshot) -> bytes:
    data = redact_data(msgspec.to_builtins(line))  # the one place its text passes to disk
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace") + b"\n"


def _read(path: Path) -> list[tuple[Snapshot, bytes]]:
    """The file's snapshots with their lines as written, oldest first."""
    raw = read_regular(path, MAX_FILE_BYTES)
    header = _header()
    if raw is None or not raw.startswith(header):
        return []
    lines: list[tuple[Snapshot, bytes]] = []
    for text in raw[len(header) :].split(b"\n"):
        if text:
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):  # torn or foreign: skipped
                line = _decode(text)
                if line.covers > 0:
                    lines.append((line, text + b"\n"))
    return lines


_HEADER: bytes | None = None


def _header() -> bytes:
    """Names the rules: the hash of the code that scans and trims (a change voids old files)."""
    global _HEADER
    if _HEADER is None:
        digest = hashlib.sha256()
        for module in (extract, deterministic):
            source = module.__file__
            try:
                digest.update(Path(source).read_bytes() if source else b"")
            except OSError:
                digest.update(repr(module).encode())
        with contextlib.suppress(OSError):
            digest.update(Path(__file__).read_bytes())
        _HEADER = json.dumps({"extractSnapshots": 1, "rules": digest.hexdigest()[:16]}).encode() + b"\n"
    return _HEADER
