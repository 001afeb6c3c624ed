"""Filler turns: the exploration between the planted steps that makes a session long.

Each filler turn is a user question about the raw tables and one to three model steps with
long outputs (`describe()` tables, value counts, samples, CSV heads, re-read documents), and
an answer that sometimes carries a sentence a decision extractor would pick up ("… because
…") or a next step, as real answers do. The first filler turns also carry the remaining
first reads of read-only files and, in a user message, one open blocker.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from benchmarks import retention_content as content
from benchmarks.retention_builder import SessionBuilder
from benchmarks.retention_facts import Kind
from benchmarks.retention_sessions import Frame, Step, Turn
from benchmarks.retention_themes import FILLER_REQUESTS, USER_VARIABLE_NAMES

NOISE_DECISION_SHARE = 0.3
"""Share of filler answers with an incidental "because" sentence (not a planted decision)."""
NEXT_STEP_SHARE = 0.25
USER_VARIABLES_RANGE = (6, 22)


def turn_chars(turn: Turn) -> int:
    """Characters of a turn (request, texts, tool arguments and results), to size filler."""
    tools = sum(len(t.result) + len(str(t.arguments)) for s in turn.steps for t in s.tools)
    return len(turn.request) + len(turn.answer) + sum(len(s.text) for s in turn.steps) + tools


class Filler:
    """Makes filler turns about the session's raw tables."""

    def __init__(self, b: SessionBuilder, *, reads: Sequence[str], blocker: tuple[str, Any]):
        self.b = b
        self.rng = b.rng
        self.raw = [b.frames[name] for name in b.theme.raw]
        self.reads = list(reads)
        """Read-only files not yet read: each filler turn reads one, until none is left."""
        self.blocker: tuple[str, Any] | None = blocker

    def turns(self, budget_chars: int, *, gaps: int) -> list[list[Turn]]:
        """Filler turns worth about `budget_chars`, spread over `gaps` places in order."""
        made: list[Turn] = []
        spent = 0
        while spent < budget_chars:
            made.append(self._turn(blocker_now=len(made) == 3))
            spent += turn_chars(made[-1])
        cuts = sorted(self.rng.randint(0, len(made)) for _ in range(gaps - 1))
        bounds = [0, *cuts, len(made)]
        return [made[bounds[i] : bounds[i + 1]] for i in range(gaps)]

    def leftover(self) -> list[Turn]:
        """Short turns for the first reads and the blocker not placed yet (a short session)."""
        extra: list[Turn] = []
        while self.reads or self.blocker is not None:
            extra.append(self._turn(blocker_now=True, steps=1))
        return extra

    # -- one turn ---------------------------------------------------------------------

    def _turn(self, *, blocker_now: bool, steps: int | None = None) -> Turn:
        rng = self.rng
        frame = rng.choice(self.raw)
        column, other = rng.sample(frame.columns, 2)
        request = rng.choice(FILLER_REQUESTS).format(
            frame=frame.name, column=column, other=other, segment=self.b.theme.segment
        )
        if blocker_now and self.blocker is not None:
            request = self._plant_blocker() + " " + request
        made = [self._step(frame, column) for _ in range(steps or rng.randint(1, 3))]
        if self.reads:
            path = self.reads.pop(0)
            made.insert(0, Step(f"Let me check {path} first.", [self.b.read(path, self._document(path))]))
        return Turn(request, made, self._answer(frame))

    def _plant_blocker(self) -> str:
        assert self.blocker is not None
        text, groups = self.blocker
        self.blocker = None
        n = self.rng.randint(1000, 9999)
        sentence = text.format(table=self.b.theme.raw[1], n=n)
        keys = tuple(tuple(option.format(n=n) for option in group) for group in groups)
        self.b.plant(Kind.BLOCKERS, sentence, *keys)
        return sentence

    def _document(self, path: str) -> str:
        title = content.title_of(path)
        if path.endswith(".py"):
            return content.source_module(self.rng, title, [], self.rng.randint(6, 16))
        if path.endswith((".md", ".txt", ".cfg")) or "." not in path.rsplit("/", 1)[-1]:
            return content.markdown_doc(self.rng, title, self.rng.randint(3, 7))
        return content.csv_sample(self.rng, self.raw[0].columns, self.rng.randint(40, 120))

    def _step(self, frame: Frame, column: str) -> Step:
        rng, b = self.rng, self.b
        choice = rng.randrange(5)
        if choice == 0:
            others = rng.sample(frame.columns, min(len(frame.columns), rng.randint(3, 6)))
            use = b.python(f"{frame.name}[{others!r}].describe()".replace('"', "'"),
                           "result: " + content.describe_table(rng, others, frame.rows))
        elif choice == 1:
            use = b.python(f"{frame.name}['{column}'].value_counts()",
                           "result: " + content.value_counts(rng, column, rng.randint(40, 160)))
        elif choice == 2:
            use = b.python(f"{frame.name}.sample(30, random_state=0)",
                           "result: " + content.frame_repr(rng, frame.columns, frame.rows, shown=rng.randint(8, 15)))
        elif choice == 3:
            rows = rng.randint(40, 150)
            use = b.shell(f"head -n {rows} data/raw/{frame.name}.csv", content.csv_sample(rng, frame.columns, rows), 0)
        else:
            path = f"figures/{column}_by_{self.b.theme.segment}.png"
            use = b.python(
                f"ax = {frame.name}.groupby('{self.b.theme.segment}')['{column}'].mean().plot.bar()\n"
                f"ax.figure.savefig('{path}')",
                "result: " + content.value_counts(rng, self.b.theme.segment, rng.randint(10, 30)),
            )
        text = content.remark(rng, frame.name, column, segment=self.b.theme.segment, templates=content.STEP_TEXTS)
        return Step(text, [use])

    def _answer(self, frame: Frame) -> str:
        rng = self.rng
        column, other = rng.sample(frame.columns, 2)
        parts = [content.remark(rng, frame.name, column, other, self.b.theme.segment) for _ in range(rng.randint(2, 4))]
        if rng.random() < NOISE_DECISION_SHARE:
            parts.append(f"The join drops {rng.randint(2, 90)} rows of {frame.name} because their ids are missing.")
        if rng.random() < NEXT_STEP_SHARE:
            parts.append(f"\nNext: {content.words(rng, 6)}.")
        return " ".join(parts)


def user_variables(rng: random.Random) -> list[tuple[str, object]]:
    """The user's own variables from earlier cells (a `Frame` becomes a real DataFrame)."""
    count = rng.randint(*USER_VARIABLES_RANGE)
    values: dict[str, object] = {
        "DATA_DIR": "data", "CUTOFF": "2024-06-30", "palette": ["#1b9e77", "#d95f02", "#7570b3"],
        "params": {"max_depth": 6, "eta": 0.1}, "months": list(range(1, 13)), "sample_ids": list(range(40)),
        "TARGET": "label", "trial_ids": [3, 7, 11], "test_size": 0.2, "n_jobs": 2, "notes": "check March",
        "query": "segment == 'pro'", "raw_cols": ["a", "b", "c"], "colors": ["red", "blue"],
        "thresholds": {"low": 0.2, "high": 0.8}, "region_lookup": Frame("region_lookup", 12, ("region", "name")),
        "holidays": Frame("holidays", 15, ("date", "name")), "tmp": Frame("tmp", 5, ("a", "b", "c")),
        "i": 9, "path": "data/raw", "title": "Overview", "fig_size": (10, 4), "bins": 30, "weights": [0.5, 0.5],
    }  # fmt: skip
    names = rng.sample(USER_VARIABLE_NAMES, count)
    return [(name, values[name]) for name in names]
