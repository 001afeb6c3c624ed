"""The summary request (SPEC §4): what the summarizer model is asked, bounded in size.

Pure functions. The request must never overflow the summarizer's window, so the prompt is
fitted to `max_input_tokens` in steps:
1. tool outputs (and tool arguments) are clipped, then clipped harder;
2. the oldest entries are dropped from the rendered history and carried instead by a
   deterministic extract of them (their ids are listed in `deterministic_only`); when the
   latest user request is among them it is still shown whole, in its own block;
3. the extract is clipped; then the previous capsule; then the latest request.
Sizes are estimated per entry while searching and the assembled prompt is then measured
with `count` exactly; an estimate that was too low tightens the target and fits again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from soba_nb.compaction.capsule import SECTION_HEADINGS, Capsule, render_capsule
from soba_nb.compaction.deterministic import build_deterministic_capsule
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    Entry,
    MessageEntry,
    SkillEntry,
    ToolCallEntry,
    ToolResultEntry,
)

Count = Callable[[str], int]

DEFAULT_TOOL_OUTPUT_LIMIT_CHARS = 4000
MIN_TOOL_OUTPUT_LIMIT_CHARS = 200
HARDER_CLIP_DIVISORS = (1, 4, 16)
"""Tool outputs are clipped to the limit, then to a quarter of it, then to a sixteenth."""
PROMPT_FRAMING_TOKENS = 16
"""Kept free for the chat framing of the two messages and the reply priming."""
ENTRY_SEPARATOR = "\n\n"
FIT_ATTEMPTS = 6

SYSTEM_PROMPT = """\
You write the Context Capsule for a coding agent that works inside a Jupyter notebook.
The capsule replaces the older part of the session in the agent's context: the agent will
continue from the capsule and the recent messages after it alone, so the capsule must hold
everything needed to carry on the work.

Reply with the capsule only: Markdown with exactly these 13 level-2 headings, in this
order, each exactly once, and no other level-2 heading:

{headings}

Rules:
- Under "Goal and constraints", quote the latest user request whole, word for word; then
  the overall goal and every constraint the user stated.
- "Work done", "In progress", "Pending", "Blockers", "Next steps": short bullet lists.
- "Decisions": each decision with its reason.
- "Files read" and "Files modified": every path, one bullet each; leave none out.
- "Verification": every command or code run that checked the work, with its last result
  (exit status, ok, or the exception).
- "Active skills": the names of the skills in effect.
- "Kernel state": just "(filled in by soba)": soba describes the live kernel itself.
- "Artifacts": paths of the outputs the work produced.
- A section with nothing to say contains just "(none)".
- Roll the previous capsule (given in full) into the new one: keep everything it records
  that is still true; the new capsule replaces it.
- An extract of older history, when given, was built without a model from entries that
  did not fit here: carry its files, commands and results over.
- Never include secrets (API keys, tokens, passwords) or the values of variables.
- Do not call tools. Write nothing before the first heading or after the last section.
"""
FOCUS_INSTRUCTIONS = "\nThe user asked this compaction to focus on: {focus}\n"
NO_PREVIOUS = "There is no previous capsule."
PREVIOUS_TEMPLATE = "<previous_capsule>\n{text}\n</previous_capsule>"
REQUEST_TEMPLATE = (
    "<latest_user_request>\n{text}\n</latest_user_request>\n"
    "(This request is older than the history shown below; quote it whole.)"
)
EXTRACT_TEMPLATE = (
    "<extract_of_older_history entries=\"{count}\">\n{text}\n</extract_of_older_history>"
)
HISTORY_TEMPLATE = "<history>\n{text}\n</history>"
NO_HISTORY = "(no entries)"
CLOSING = "Write the new capsule now: the 13 sections, in order, and nothing else."


class PromptBudgetTooSmall(ValueError):
    """`max_input_tokens` cannot hold even the instructions."""


class SummaryPrompt(BaseModel):
    """One summary request, ready to send."""

    model_config = ConfigDict(frozen=True)

    system: str
    """The instructions (the 13 headings, the rules, the focus when given)."""
    user: str
    """The previous capsule, any extract of old history, and the history to summarize."""
    deterministic_only: list[str]
    """Ids of the entries that did not fit and reach the summarizer only through the extract."""


# --- rendering the history -------------------------------------------------------------


def clip_middle(text: str, limit_chars: int) -> str:
    """`text` if it fits `limit_chars`, else its head and tail around a note of the cut."""
    if len(text) <= limit_chars:
        return text
    head = limit_chars // 2
    tail = limit_chars - head
    clipped = len(text) - head - tail
    return f"{text[:head]}\n[… {clipped} characters clipped …]\n{text[len(text) - tail:] if tail else ''}"


def render_entry(entry: Entry, *, tool_output_limit_chars: int) -> str:
    """One entry as a line of plain transcript; "" for entries the summarizer need not see."""
    if isinstance(entry, MessageEntry):
        return f"[{entry.role}] {entry.content}"
    if isinstance(entry, ToolCallEntry):
        return f"[tool call {entry.name}] {clip_middle(entry.arguments, tool_output_limit_chars)}"
    if isinstance(entry, ToolResultEntry):
        status = ", error" if entry.is_error else ""
        return f"[tool result {entry.name}{status}] {clip_middle(entry.content, tool_output_limit_chars)}"
    if isinstance(entry, CheckpointEntry):
        return f"[checkpoint {entry.kind}] {entry.note}".rstrip()
    if isinstance(entry, SkillEntry):
        return f"[skill activated] {entry.name} ({entry.path})"
    if isinstance(entry, CapsuleEntry):
        return f"[earlier capsule {entry.checkpoint_id}]\n{entry.content}"
    return ""


def render_entries_for_summary(entries: Sequence[Entry], *, tool_output_limit_chars: int) -> str:
    """The entries as a plain transcript, long tool outputs clipped head and tail."""
    rendered = (render_entry(e, tool_output_limit_chars=tool_output_limit_chars) for e in entries)
    return ENTRY_SEPARATOR.join(text for text in rendered if text)


# --- fitting -----------------------------------------------------------------------------


def build_system_prompt(focus: str | None) -> str:
    """The instructions, with the focus of `%compact focus…` appended when given."""
    headings = "\n".join(f"## {heading}" for heading in SECTION_HEADINGS)
    system = SYSTEM_PROMPT.format(headings=headings)
    if focus and focus.strip():
        system += FOCUS_INSTRUCTIONS.format(focus=focus.strip())
    return system


def _assemble(previous: str | None, request: str | None, extract: tuple[int, str] | None, history: str) -> str:
    parts = [NO_PREVIOUS if previous is None else PREVIOUS_TEMPLATE.format(text=previous)]
    if request is not None:
        parts.append(REQUEST_TEMPLATE.format(text=request))
    if extract is not None:
        parts.append(EXTRACT_TEMPLATE.format(count=extract[0], text=extract[1]))
    parts.append(HISTORY_TEMPLATE.format(text=history or NO_HISTORY))
    parts.append(CLOSING)
    return "\n\n".join(parts)


def clip_to_tokens(text: str, budget: int, count: Count) -> str:
    """`text` clipped in the middle to at most `budget` tokens ("" when not even the note fits)."""
    if count(text) <= budget:
        return text
    low, high = 0, len(text) - 1
    while low < high:  # the longest clip that fits
        middle = (low + high + 1) // 2
        if count(clip_middle(text, middle)) <= budget:
            low = middle
        else:
            high = middle - 1
    clipped = clip_middle(text, low)
    return clipped if count(clipped) <= budget else ""


@dataclass
class _Fitter:
    """The prompt's parts and cached per-entry costs, fitted against a token target."""

    entries: Sequence[Entry]
    previous: str | None
    count: Count
    limits: tuple[int, ...]
    _rendered: dict[int, list[str]] = field(default_factory=dict)
    _costs: dict[int, list[int]] = field(default_factory=dict)
    _extracts: dict[int, str] = field(default_factory=dict)
    _latest_user: int | None = None

    def rendered(self, limit: int) -> list[str]:
        if limit not in self._rendered:
            self._rendered[limit] = [render_entry(e, tool_output_limit_chars=limit) for e in self.entries]
        return self._rendered[limit]

    def costs(self, limit: int) -> list[int]:
        """Per entry: its tokens plus a separator, plus one for rounding across the joins."""
        if limit not in self._costs:
            separator = self.count(ENTRY_SEPARATOR) + 1
            self._costs[limit] = [self.count(t) + separator if t else 0 for t in self.rendered(limit)]
        return self._costs[limit]

    def history(self, limit: int, start: int) -> str:
        return ENTRY_SEPARATOR.join(t for t in self.rendered(limit)[start:] if t)

    def extract(self, dropped: int) -> str:
        if dropped not in self._extracts:
            capsule = build_deterministic_capsule(self.entries[:dropped], latest_request_whole=False)
            self._extracts[dropped] = render_capsule(capsule).rstrip("\n")
        return self._extracts[dropped]

    def latest_request(self, dropped: int) -> str | None:
        """The latest user request, when it is among the dropped entries."""
        if self._latest_user is None:
            users = [i for i, e in enumerate(self.entries) if isinstance(e, MessageEntry) and e.role == "user"]
            self._latest_user = users[-1] if users else -1
        if 0 <= self._latest_user < dropped:
            entry = self.entries[self._latest_user]
            assert isinstance(entry, MessageEntry)
            return entry.content
        return None

    def fit(self, target: int) -> tuple[str, int] | None:
        """(user message, number of dropped entries) within about `target` tokens, or None."""
        skeleton = self.count(_assemble(self.previous, None, None, ""))
        for limit in self.limits:
            if skeleton + sum(self.costs(limit)) <= target:
                return _assemble(self.previous, None, None, self.history(limit, 0)), 0
        return self._drop_oldest(target) if self.entries else self._clip_everything(target)

    def _size(self, previous: str | None, request: str | None, dropped: int, extract: str | None) -> int:
        kept_extract = None if extract is None else (dropped, extract)
        return self.count(_assemble(previous, request, kept_extract, ""))

    def _drop_oldest(self, target: int) -> tuple[str, int] | None:
        limit, total = self.limits[-1], len(self.entries)
        costs = self.costs(limit)
        suffix = [0] * (total + 1)
        for index in range(total - 1, -1, -1):
            suffix[index] = suffix[index + 1] + costs[index]

        def size(dropped: int) -> int:
            request = self.latest_request(dropped)
            return self._size(self.previous, request, dropped, self.extract(dropped)) + suffix[dropped]

        if size(total) > target:
            return self._clip_everything(target)
        low, high = 1, total  # the fewest dropped entries that fit (`high` always fits)
        while low < high:
            middle = (low + high) // 2
            if size(middle) <= target:
                high = middle
            else:
                low = middle + 1
        user = _assemble(
            self.previous, self.latest_request(high), (high, self.extract(high)), self.history(limit, high)
        )
        return user, high

    def _clip_everything(self, target: int) -> tuple[str, int] | None:
        """Every entry dropped; clip the extract, else also the previous capsule, else also
        the latest request (the order of what matters least)."""
        total = len(self.entries)
        previous, request = self.previous, self.latest_request(total)
        extract = self.extract(total) if total else None
        if extract is not None:
            room = target - self._size(previous, request, total, "")
            if room >= 0:
                extract = clip_to_tokens(extract, room, self.count)
                return _assemble(previous, request, (total, extract), ""), total
            extract = ""
        if previous is not None:
            room = target - self._size("", request, total, extract)
            if room >= 0:
                previous = clip_to_tokens(previous, room, self.count)
                return _assemble(previous, request, None if extract is None else (total, extract), ""), total
            previous = ""
        if request is not None:
            room = target - self._size(previous, "", total, extract)
            if room >= 0:
                request = clip_to_tokens(request, room, self.count)
                return _assemble(previous, request, None if extract is None else (total, extract), ""), total
        return None


def build_summary_prompt(
    entries: Sequence[Entry],
    *,
    previous: Capsule | None,
    focus: str | None,
    max_input_tokens: int,
    count: Count,
    tool_output_limit_chars: int = DEFAULT_TOOL_OUTPUT_LIMIT_CHARS,
) -> SummaryPrompt:
    """The summary request for `entries`, whose system + user text fits `max_input_tokens`
    as measured by `count` (less `PROMPT_FRAMING_TOKENS` for the chat framing).

    Raises `PromptBudgetTooSmall` when not even the instructions and the scaffolding fit.
    """
    system = build_system_prompt(focus)
    limits = tuple(
        dict.fromkeys(max(MIN_TOOL_OUTPUT_LIMIT_CHARS, tool_output_limit_chars // d) for d in HARDER_CLIP_DIVISORS)
    )
    fitter = _Fitter(
        entries, None if previous is None else render_capsule(previous).rstrip("\n"), count, limits
    )
    budget = max_input_tokens - PROMPT_FRAMING_TOKENS - count(system)
    target = budget
    for attempt in range(FIT_ATTEMPTS):
        fitted = fitter.fit(target) if target > 0 else None
        if fitted is None:
            break
        user, dropped = fitted
        excess = count(user) - budget
        if excess <= 0:
            return SummaryPrompt(
                system=system, user=user, deterministic_only=[e.id for e in entries[:dropped]]
            )
        target -= excess << attempt  # the per-entry estimate was low: aim lower, faster each time
    raise PromptBudgetTooSmall(
        f"a summary request cannot fit max_input_tokens={max_input_tokens}: the instructions take "
        f"{count(system) + PROMPT_FRAMING_TOKENS} tokens and the smallest request scaffolding more "
        f"than the {max(budget, 0)} left"
    )
