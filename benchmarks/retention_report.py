"""The retention table: one row per method, the share of planted facts kept per kind."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from benchmarks.retention_facts import EMPTY_SCORE, TARGET_KINDS, Fact, Kind, Score, score
from benchmarks.retention_methods import Run


@dataclass
class Row:
    """One method under one profile, over the sessions it ran on."""

    method: str
    profile: str
    score: Score = EMPTY_SCORE
    runs: list[Run] = field(default_factory=list)

    def add(self, facts: list[Fact], text: str, run: Run) -> None:
        self.score = self.score + score(facts, text)
        self.runs.append(run)

    def cell(self, kind: Kind) -> str:
        percent = self.score.percent(kind)
        if percent is None:
            return "–"
        return f"{percent:.0f}% ({self.score.kept.get(kind, 0)}/{self.score.planted[kind]})"

    def tokens(self) -> str:
        before = statistics.mean(r.tokens_before for r in self.runs)
        after = statistics.mean(r.tokens_after for r in self.runs)
        return f"{before:,.0f} → {after:,.0f}"

    def seconds(self) -> str:
        return f"{statistics.mean(r.seconds for r in self.runs):.1f} s"


def table(rows: list[Row]) -> str:
    """The Markdown table: methods × fact kinds, tokens before → after, time, sessions."""
    kinds = list(Kind)
    head = ["method", "profile", *(k.value for k in kinds), "tokens before → after (mean)", "time / session", "sessions"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.method, row.profile, *(row.cell(k) for k in kinds), row.tokens(), row.seconds(), str(len(row.runs))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lost_targets(row: Row) -> list[str]:
    """Facts of the target kinds this row lost, each with how often."""
    lost = Counter(f"{fact.kind.value}: {fact.label}" for fact in row.score.lost if fact.kind in TARGET_KINDS)
    return [f"{label} (×{count})" if count > 1 else label for label, count in sorted(lost.items())]


def outcomes(row: Row) -> str:
    """How the row's compactions ended (committed quality, fallback reasons), counted."""
    counts: Counter[str] = Counter()
    for run in row.runs:
        for result in run.results:
            if result.outcome.value != "completed":
                counts[f"{result.outcome.value}: {result.code.value}"] += 1
            elif result.quality == "full":
                counts["model capsule committed"] += 1
            else:
                counts[f"deterministic fallback: {result.code.value}"] += 1
    return ", ".join(f"{what} ×{n}" for what, n in counts.most_common())


def notes(row: Row) -> list[str]:
    """What a reader needs besides the percentages: how compactions ended, which target
    facts were lost, how large the capsule grew, what a live session would have hit."""
    lines = []
    if row.runs and any(run.results for run in row.runs):
        lines.append(outcomes(row))
        if row.method.startswith(("deterministic", "model capsule as committed")):
            lines.append(f"target kinds lost: {'; '.join(lost_targets(row)) or 'none'}")
    if "along the way" in row.method:
        per_session = statistics.mean(run.compactions for run in row.runs)
        capsules = [run.capsule_tokens for run in row.runs if run.capsule_tokens is not None]
        size = f", the last capsule {statistics.mean(capsules):,.0f} tokens (mean)" if capsules else ""
        lines.append(f"{per_session:.0f} capsules committed per session{size}")
        lines += sorted({note for run in row.runs for note in run.notes if "refused" in note})
    lines += sorted({note for run in row.runs for note in run.notes if note.startswith("finish reason")})
    return lines
