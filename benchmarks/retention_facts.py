"""Planted facts and how their survival is checked (the retention benchmark's scorer).

A fact is something a long session established that the agent still needs after a
compaction: a file it read, the last outcome of a command, the shape of a dataframe, the
request being worked on. Each fact carries a checkable form — key strings — and survives
when those strings are in the text the model receives after the compaction (capsule plus
kept tail), found with the rule of its kind:

- `all`: every group of alternatives occurs (case and spacing ignored), and when `window`
  is set, the other groups occur within `window` characters of an occurrence of the first
  (a dataframe's name near its shape, a decision near its reason);
- `outcome`: the command occurs, and the first run outcome written after its latest
  mention that states one (an exit status, a tool result header, "→ ok", an exception
  name) is the expected one — a capsule that says "exit status 1" for a command whose last
  run passed loses that fact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal


class Kind(str, Enum):
    """Fact kinds, in the order the table shows them."""

    GOAL = "goal"
    CONSTRAINTS = "constraints"
    FILES_READ = "files read"
    FILES_MODIFIED = "files modified"
    COMMANDS = "commands + outcome"
    DECISIONS = "decisions + reason"
    BLOCKERS = "blockers"
    DATAFRAMES = "dataframes"
    LATEST_REQUEST = "latest request"


TARGET_KINDS = (Kind.FILES_READ, Kind.FILES_MODIFIED, Kind.COMMANDS, Kind.DATAFRAMES, Kind.LATEST_REQUEST)
"""Kinds the deterministic capsule must keep whole (SPEC §4; issue 13 item 5)."""

Check = Literal["all", "outcome"]
Outcome = Literal["ok", "failed"]

OUTCOME_SCAN_CHARS = 400
"""How far after a command's mention its outcome is looked for (a capsule line, or the tool
result header that follows the call in the kept tail)."""
_SUCCESS = (
    r"exit status:? 0\b",
    r"→ ok\b",
    r"tool result \((?:python|shell), call [^,)]*\):",
    r"\b(?:passed|passes|succeeded|successful(?:ly)?|ok)\b",
)
_FAILURE = (
    r"exit status:? (?:[1-9]\d*|timeout|cancelled)",
    r"tool result \((?:python|shell), call [^,)]*, error\):",
    r"\b[a-z]+(?:error|exception)\b",
    r"\b(?:failed|fails|failing|failure)\b",
)
_OUTCOME = re.compile("|".join(f"(?P<ok{i}>{p})" for i, p in enumerate(_SUCCESS))
                      + "|" + "|".join(f"(?P<failed{i}>{p})" for i, p in enumerate(_FAILURE)))


@dataclass(frozen=True)
class Fact:
    """One planted fact and its checkable form."""

    kind: Kind
    label: str
    """What the fact is, for reports: `shell pytest -q → exit status 0`."""
    groups: tuple[tuple[str, ...], ...]
    """Key strings: each group is a set of alternatives; every group must be found."""
    check: Check = "all"
    window: int | None = None
    """`all` facts: the other groups must lie within this many characters of the first."""
    outcome: Outcome | None = None
    """`outcome` facts: the command's last outcome."""


def normalize(text: str) -> str:
    """Lower case, runs of whitespace as one space: what matching compares."""
    return " ".join(text.lower().split())


def _positions(text: str, needle: str) -> list[int]:
    found, start = [], text.find(needle)
    while start >= 0:
        found.append(start)
        start = text.find(needle, start + 1)
    return found


def _all_present(fact: Fact, text: str) -> bool:
    groups = [[normalize(option) for option in group] for group in fact.groups]
    if fact.window is None:
        return all(any(option in text for option in group) for group in groups)
    anchors = sorted(p for option in groups[0] for p in _positions(text, option))
    for anchor in anchors:
        nearby = text[max(anchor - fact.window, 0) : anchor + fact.window]
        if all(any(option in nearby for option in group) for group in groups[1:]):
            return True
    return False


def stated_outcome(segment: str) -> Outcome | None:
    """The first run outcome stated in `segment` (normalized text), if any."""
    match = _OUTCOME.search(segment)
    if match is None or match.lastgroup is None:
        return None
    return "ok" if match.lastgroup.startswith("ok") else "failed"


def _outcome_present(fact: Fact, text: str, others: Sequence[str]) -> bool:
    command = normalize(fact.groups[0][0])
    for position in reversed(_positions(text, command)):
        start = position + len(command)
        segment = text[start : start + OUTCOME_SCAN_CHARS]
        # The outcome written after another command's mention belongs to that command.
        ends = [at for other in others if (at := segment.find(other)) >= 0]
        segment = segment[: min(ends)] if ends else segment
        outcome = stated_outcome(segment)
        if outcome is not None:
            return outcome == fact.outcome
    return False


def survives(fact: Fact, text: str, commands: Iterable[str] = ()) -> bool:
    """Whether `fact` is in `text` (raw model-input text). `commands`: the other planted
    commands, whose mentions end the search for this one's outcome."""
    normalized = normalize(text)
    if fact.check == "outcome":
        own = normalize(fact.groups[0][0])
        others = [normalize(c) for c in commands if normalize(c) != own]
        return _outcome_present(fact, normalized, others)
    return _all_present(fact, normalized)


@dataclass(frozen=True)
class Score:
    """Facts kept and planted, per kind, for one method on one or more sessions."""

    kept: dict[Kind, int]
    planted: dict[Kind, int]
    lost: tuple[Fact, ...]

    def percent(self, kind: Kind) -> float | None:
        total = self.planted.get(kind, 0)
        return None if total == 0 else 100 * self.kept.get(kind, 0) / total

    def __add__(self, other: Score) -> Score:
        kinds = set(self.planted) | set(other.planted)
        return Score(
            {k: self.kept.get(k, 0) + other.kept.get(k, 0) for k in kinds},
            {k: self.planted.get(k, 0) + other.planted.get(k, 0) for k in kinds},
            self.lost + other.lost,
        )


EMPTY_SCORE = Score({}, {}, ())


def score(facts: Sequence[Fact], text: str) -> Score:
    """How many facts of each kind survive in `text`, and which were lost."""
    commands = [f.groups[0][0] for f in facts if f.check == "outcome"]
    kept: dict[Kind, int] = {}
    planted: dict[Kind, int] = {}
    lost: list[Fact] = []
    for fact in facts:
        planted[fact.kind] = planted.get(fact.kind, 0) + 1
        if survives(fact, text, commands):
            kept[fact.kind] = kept.get(fact.kind, 0) + 1
        else:
            lost.append(fact)
    return Score(kept, planted, tuple(lost))


def shape_forms(rows: int, columns: int) -> tuple[str, ...]:
    """The ways a shape is written: `3000×5` (kernel state), `(3000, 5)` (`.shape`),
    `[3000 rows x 5 columns]` (a DataFrame repr), and plain-text variants a model writes."""
    return (
        f"{rows}×{columns}", f"{rows} × {columns}", f"{rows}x{columns}", f"{rows} x {columns}",
        f"({rows}, {columns})", f"{rows} rows x {columns} columns", f"{rows} rows × {columns} columns",
        f"{rows:,}×{columns}", f"{rows:,} × {columns}", f"{rows:,} rows x {columns} columns",
        f"{rows:,} rows × {columns} columns",
    )  # fmt: skip
