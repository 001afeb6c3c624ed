"""The summary request (SPEC §4): what the summarizer model is asked, bounded in size.

Pure functions. The request must never overflow the summarizer's window, so the prompt is
fitted to `max_input_tokens` in steps:
1. tool outputs (and tool arguments) are clipped, then clipped harder;
2. the oldest entries are dropped from the rendered history and carried instead by a
   deterministic extract of them (`dropped` says how many); when the
   latest user request is among them it is still shown whole, in its own block;
3. the extract is clipped; then the previous capsule; then the latest request.
Each entry's rendering is counted exactly (once per clip limit it is tried at) while
searching; the assembled message is then bounded by those counts, an exact count of the rest
and a little for every join (`JOIN_SLACK`), and counted whole only when that bound is over the
budget (a size that was too low then tightens the target and fits again). So the text sent is
counted about once, whatever the length of the history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from soba_nb.compaction.capsule import SECTION_HEADINGS, Capsule, render_capsule
from soba_nb.compaction.cells_context import render_cells
from soba_nb.compaction.deterministic import EXTRACT_ITEMS_MAX, capsule_from_scan
from soba_nb.compaction.extract import Start, fresh_start
from soba_nb.compaction.requests import split_goal
from soba_nb.text import clip_middle
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CellsEntry,
    CheckpointEntry,
    Entry,
    MessageEntry,
    SkillEntry,
    ToolCallEntry,
    ToolResultEntry,
)

Count = Callable[[str], int]
ScanStarts = Callable[[Sequence[Entry], int], Start]
"""Where the extract's scan of the first N entries may start (`ExtractSnapshots.start`)."""

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
- soba adds the user's requests verbatim itself, marked done or in progress: do not list
  them. Under "Goal and constraints": the overall goal and every constraint the user stated.
- "Work done": what was done for each request, with its outcome. "In progress": only work
  still going on at the end of the history (none if the last request was answered).
- Results are state: keep the figures the work produced (counts, shapes, column names,
  thresholds, metrics) with their numbers.
- "Pending", "Blockers", "Next steps": short bullet lists. "Decisions": each with its reason.
- "Files read" and "Files modified": every real file path, one bullet each.
- "Verification": each command or code run that checked the work, with its last result.
- "Active skills": the skills in effect. "Artifacts": output files and figures.
- "Kernel state": just "(filled in by soba)".
- A section with nothing to say contains just "(none)".
- Roll the previous capsule (given in full) into the new one: keep what is still true.
- An extract of older history, when given, was built without a model: carry its files,
  commands and results over.
- Never include secrets (API keys, tokens, passwords) or raw data dumps (whole tables).
- Do not call tools. Write nothing before the first heading or after the last section.
"""
FOCUS_INSTRUCTIONS = "\nThe user asked this compaction to focus on: {focus}\n"
NO_PREVIOUS = "There is no previous capsule."
PREVIOUS_TEMPLATE = "<previous_capsule>\n{text}\n</previous_capsule>"
REQUEST_TEMPLATE = (
    "<request_being_worked_on>\n{text}\n</request_being_worked_on>\n"
    "(The user's latest request, older than the history shown below, which is work on it. "
    "soba quotes it in the capsule itself: describe what was done for it and what remains.)"
)
EXTRACT_TEMPLATE = (
    "<extract_of_older_history entries=\"{count}\">\n{text}\n</extract_of_older_history>"
)
HISTORY_TEMPLATE = "<history>\n{text}\n</history>"
NO_HISTORY = "(no entries)"
CLOSING = "Write the new capsule now: the 13 sections, in order, and nothing else."
CLIP_ATTEMPTS = 8
CLIP_AIM = 0.97
"""Aim a little under the budget: characters per token vary along a text."""
DROP_ATTEMPTS = 8
BLOCK_ENTRIES = 64
"""Entries counted together while walking back (one tokenizer call for a block)."""
JOIN_SLACK = 2
"""Tokens allowed for each join of an entry to the history: BPE may merge or split where two
pieces meet (a token at most on either side of the separator)."""
HISTORY_SLACK = 2 * JOIN_SLACK
"""The same for the history's two ends, where it joins the request's scaffolding."""
GENTLER_CLIP_MARGIN = 1.25
"""A gentler clip whose estimated size is over the room by more than this factor is not counted."""
"""Boundaries tried when the oldest entries must go to the extract (each builds one extract)."""


class Fitted(NamedTuple):
    """A user message fitted to a target."""

    user: str
    dropped: int
    bound: int | None
    """An upper bound on its tokens from exact counts of its parts, when known."""


class PromptBudgetTooSmall(ValueError):
    """`max_input_tokens` cannot hold even the instructions."""


class SummaryPrompt(BaseModel):
    """One summary request, ready to send."""

    model_config = ConfigDict(frozen=True)

    system: str
    """The instructions (the 13 headings, the rules, the focus when given)."""
    user: str
    """The previous capsule, any extract of old history, and the history to summarize."""
    dropped: int
    """How many of the oldest entries did not fit and reach the summarizer only through the
    extract (a count, not their ids: at 100k entries a list of ids would cost more than the
    rest of the request)."""


# --- rendering the history -------------------------------------------------------------


def render_entry(entry: Entry, *, tool_output_limit_chars: int) -> str:
    """One entry as a line of plain transcript; "" for entries the summarizer need not see."""
    if isinstance(entry, MessageEntry):
        if entry.typed is not None:  # a slash command: the user's words, then soba's expansion
            return f"[{entry.role}] {entry.typed}\n[soba sent it to the model as] {entry.content}"
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
        # Already rolled into the previous capsule, given in full; a capsule the user amended
        # (`%%capsule amend`) must not come back through the history either.
        return ""
    if isinstance(entry, CellsEntry):
        return f"[notebook] {clip_middle(render_cells(entry), tool_output_limit_chars)}"
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
    """`text` clipped in the middle to at most `budget` tokens ("" when not even the note fits).

    The cut is sized from the text's own characters per token and corrected a few times, so
    a long text is counted a handful of times, not once per step of a bisection."""
    tokens = count(text)
    if tokens <= budget:
        return text
    limit = len(text)
    for _ in range(CLIP_ATTEMPTS):
        limit = min(int(limit * budget / max(tokens, 1) * CLIP_AIM), limit - 1)
        if limit <= 0:
            break
        clipped = clip_middle(text, limit)
        tokens = count(clipped)
        if tokens <= budget:
            return clipped
    clipped = clip_middle(text, 0)
    return clipped if count(clipped) <= budget else ""


@dataclass
class _Fitter:
    """The prompt's parts, fitted against a token target from the newest entry back.

    Only the entries that can be sent are rendered and counted (walking back from the
    newest until the target is reached), so the cost follows what is sent, not the length
    of the history; what is dropped reaches the summarizer through one deterministic
    extract, built once per boundary tried (usually once).
    """

    entries: Sequence[Entry]
    previous: str | None
    count: Count
    limits: tuple[int, ...]
    _costs: dict[tuple[int, int], int] = field(default_factory=dict)
    _counted: dict[int, tuple[str, int]] = field(default_factory=dict)
    """The last rendering of each entry that was counted, with its cost."""
    _separator: int | None = None
    _blocks: dict[tuple[int, int], int] = field(default_factory=dict)
    _block_counted: dict[int, tuple[str, int]] = field(default_factory=dict)
    """The last text of each block that was counted, with its cost."""
    _rendered: dict[tuple[int, int], str] = field(default_factory=dict)
    _extracts: dict[int, str] = field(default_factory=dict)
    _latest_user: int | None = None
    scans: ScanStarts | None = None
    _start: Start | None = None
    _scanned: int = 0

    def rendered(self, limit: int, index: int) -> str:
        key = (limit, index)
        if key not in self._rendered:
            self._rendered[key] = render_entry(self.entries[index], tool_output_limit_chars=limit)
        return self._rendered[key]

    def cost(self, limit: int, index: int) -> int:
        """An entry's tokens plus a separator, plus `JOIN_SLACK` for what joining may add.

        Counted once per distinct rendering: an entry that no clip limit shortens (a message,
        a short output) renders the same at every limit and is not counted again."""
        key = (limit, index)
        if key not in self._costs:
            self._costs[key] = self._once(self._counted, index, self.rendered(limit, index))
        return self._costs[key]

    def _once(self, counted: dict[int, tuple[str, int]], slot: int, text: str) -> int:
        """`text`'s tokens plus a separator and `JOIN_SLACK`, counted only when it is not the
        text last counted in this slot (an entry or block that a clip limit leaves alone)."""
        last = counted.get(slot)
        if last is not None and last[0] == text:
            return last[1]
        cost = self.count(text) + self.separator() + JOIN_SLACK if text else 0
        counted[slot] = (text, cost)
        return cost

    def separator(self) -> int:
        if self._separator is None:
            self._separator = self.count(ENTRY_SEPARATOR)
        return self._separator

    def block(self, limit: int, end: int) -> int:
        """The entries of the block ending at `end` (blocks of `BLOCK_ENTRIES`, aligned from
        the newest entry) as they are joined in the history, counted in one call (a count per
        entry costs the tokenizer's overhead per call: three times the text's own count),
        plus a separator and `JOIN_SLACK`. A block no clip limit changes is counted once."""
        key = (limit, end)
        if key not in self._blocks:
            texts = (self.rendered(limit, index) for index in range(max(end - BLOCK_ENTRIES, 0), end))
            self._blocks[key] = self._once(self._block_counted, end, ENTRY_SEPARATOR.join(t for t in texts if t))
        return self._blocks[key]

    def fitting_start(self, limit: int, room: int) -> int:
        """The first index from which every later entry fits in `room` tokens: whole blocks
        while they fit, then entry by entry in the block where the room ends."""
        used, end = 0, len(self.entries)
        while end > 0:
            start = max(end - BLOCK_ENTRIES, 0)
            block = self.block(limit, end)
            if used + block <= room:
                used, end = used + block, start
                continue
            for index in range(end, start, -1):
                cost = self.cost(limit, index - 1)
                if used + cost > room:
                    return index
                used += cost
            end = start
        return 0

    def span(self, limit: int, start: int) -> int:
        """The tokens `fitting_start` counts for the entries from `start` on (whole blocks,
        then the entries of the block `start` falls in)."""
        total, end = 0, len(self.entries)
        while end > start:
            block_start = max(end - BLOCK_ENTRIES, 0)
            if block_start >= start:
                total += self.block(limit, end)
            else:
                total += sum(self.cost(limit, index) for index in range(start, end))
            end = block_start
        return total

    def history(self, limit: int, start: int) -> str:
        texts = (self.rendered(limit, index) for index in range(start, len(self.entries)))
        return ENTRY_SEPARATOR.join(text for text in texts if text)

    def extract(self, dropped: int) -> str:
        """The deterministic extract of the oldest `dropped` entries. One scan serves every
        boundary tried: it is extended, not restarted, as the boundary moves forward; it
        starts from the newest snapshot at or before the first boundary (`scans`), so only
        the entries after that are read."""
        if dropped not in self._extracts:
            if self._start is None or self._scanned > dropped:
                self._start = self.scans(self.entries, dropped) if self.scans else fresh_start(self.entries)
                self._scanned = self._start.covered
            self._start.scan.run(self.entries[self._scanned : dropped])
            self._scanned = dropped
            capsule = capsule_from_scan(self._start.scan, items_max=EXTRACT_ITEMS_MAX)
            self._extracts[dropped] = render_capsule(capsule).rstrip("\n")
        return self._extracts[dropped]

    def latest_request(self, dropped: int) -> str | None:
        """The latest user request, when it is among the dropped entries."""
        if self._latest_user is None:
            self._latest_user = next(
                (
                    i
                    for i in range(len(self.entries) - 1, -1, -1)
                    if isinstance(self.entries[i], MessageEntry) and getattr(self.entries[i], "role", "") == "user"
                ),
                -1,
            )
        if 0 <= self._latest_user < dropped:
            entry = self.entries[self._latest_user]
            assert isinstance(entry, MessageEntry)
            return entry.content
        return None

    def fit(self, target: int) -> Fitted | None:
        """The user message within about `target` tokens, or None."""
        skeleton = self.count(_assemble(self.previous, None, None, ""))
        room = target - skeleton - HISTORY_SLACK
        if room >= 0 and not self.entries:  # the previous capsule alone
            return Fitted(_assemble(self.previous, None, None, ""), 0, skeleton)
        if room < 0 or not self.entries:
            return self._drop_oldest(target) if self.entries else self._clip_everything(target)
        # The hardest clip first: when even that does not hold every entry, no gentler one does
        # (a longer clip renders more of the same text), and the walk back counted only about
        # what is sent. When it does, the gentlest clip that holds them all is used.
        hardest = self.limits[-1]
        if self.fitting_start(hardest, room) > 0:
            return self._drop_oldest(target)
        # A gentler clip is counted only when its characters, at the rate of tokens per
        # character the hardest clip just measured, could fit (with `GENTLER_CLIP_MARGIN` to
        # spare): one that plainly cannot costs a pass of string lengths, not of the tokenizer.
        rate = self.span(hardest, 0) / max(self.chars(hardest), 1)
        limit = next(
            limit
            for limit in self.limits
            if limit == hardest
            or (self.chars(limit) * rate <= room * GENTLER_CLIP_MARGIN and self.fitting_start(limit, room) == 0)
        )
        return self._with_history(self.previous, None, None, limit, 0, skeleton)

    def _with_history(
        self, previous: str | None, request: str | None, extract: tuple[int, str] | None, limit: int, start: int, scaffold: int
    ) -> Fitted:
        """The message with the entries from `start` on, and a bound on its tokens: the exact
        count of the rest (`scaffold`) plus the entries' costs (each counted exactly, with
        `JOIN_SLACK` for its joins) and `HISTORY_SLACK` for the history's own two joins."""
        bound = scaffold + self.span(limit, start) + HISTORY_SLACK
        return Fitted(_assemble(previous, request, extract, self.history(limit, start)), start, bound)

    def chars(self, limit: int) -> int:
        """Characters of every entry rendered at `limit`."""
        return sum(len(self.rendered(limit, index)) for index in range(len(self.entries)))

    def _size(self, previous: str | None, request: str | None, dropped: int, extract: str | None) -> int:
        kept_extract = None if extract is None else (dropped, extract)
        return self.count(_assemble(previous, request, kept_extract, ""))

    def _drop_oldest(self, target: int) -> Fitted | None:
        """Drop the oldest entries into the extract: the boundary moves forward until the
        extract, the request it may have to quote and the kept entries fit together."""
        limit, total = self.limits[-1], len(self.entries)
        skeleton = self.count(_assemble(self.previous, None, None, ""))
        dropped = max(self.fitting_start(limit, target - skeleton - HISTORY_SLACK), 1)
        for _ in range(DROP_ATTEMPTS):
            request = self.latest_request(dropped)
            scaffold = self._size(self.previous, request, dropped, self.extract(dropped))
            room = target - scaffold - HISTORY_SLACK
            if room < 0:
                break  # the extract alone is too big: clip it
            start = self.fitting_start(limit, room)
            if start <= dropped:
                return self._with_history(self.previous, request, (dropped, self.extract(dropped)), limit, dropped, scaffold)
            if dropped == total:
                break
            dropped = start  # the extract grew: keep fewer entries and try again
        return self._clip_everything(target)

    def _clip_everything(self, target: int) -> Fitted | None:
        """Every entry dropped; clip the extract, else also the previous capsule, else also
        the latest request (the order of what matters least)."""
        total = len(self.entries)
        previous, request = self.previous, self.latest_request(total)
        extract = self.extract(total) if total else None
        if extract is not None:
            room = target - self._size(previous, request, total, "")
            if room >= 0:
                extract = clip_to_tokens(extract, room, self.count)
                return Fitted(_assemble(previous, request, (total, extract), ""), total, None)
            extract = ""
        if previous is not None:
            room = target - self._size("", request, total, extract)
            if room >= 0:
                previous = clip_to_tokens(previous, room, self.count)
                return Fitted(_assemble(previous, request, None if extract is None else (total, extract), ""), total, None)
            previous = ""
        if request is not None:
            room = target - self._size(previous, "", total, extract)
            if room >= 0:
                request = clip_to_tokens(request, room, self.count)
                return Fitted(_assemble(previous, request, None if extract is None else (total, extract), ""), total, None)
        return None


def _without_requests(previous: Capsule) -> str:
    """The previous capsule as the summarizer sees it: without the requests soba quotes (soba
    rolls them up itself; a model shown them would copy them, in its own words)."""
    _, goal = split_goal(previous.goal_and_constraints)
    return render_capsule(previous.model_copy(update={"goal_and_constraints": goal})).rstrip("\n")


def build_summary_prompt(
    entries: Sequence[Entry],
    *,
    previous: Capsule | None,
    focus: str | None,
    max_input_tokens: int,
    count: Count,
    tool_output_limit_chars: int = DEFAULT_TOOL_OUTPUT_LIMIT_CHARS,
    scans: ScanStarts | None = None,
) -> SummaryPrompt:
    """The summary request for `entries`, whose system + user text fits `max_input_tokens`
    as measured by `count` (less `PROMPT_FRAMING_TOKENS` for the chat framing).

    `scans`: where the extract's scan may start (snapshots kept beside the transcript);
    without it the extract scans the dropped entries from the first.

    Raises `PromptBudgetTooSmall` when not even the instructions and the scaffolding fit.
    """
    system = build_system_prompt(focus)
    limits = tuple(
        dict.fromkeys(max(MIN_TOOL_OUTPUT_LIMIT_CHARS, tool_output_limit_chars // d) for d in HARDER_CLIP_DIVISORS)
    )
    fitter = _Fitter(entries, None if previous is None else _without_requests(previous), count, limits, scans=scans)
    budget = max_input_tokens - PROMPT_FRAMING_TOKENS - count(system)
    target = budget
    for attempt in range(FIT_ATTEMPTS):
        fitted = fitter.fit(target) if target > 0 else None
        if fitted is None:
            break
        user, dropped, bound = fitted
        # The bound spares counting the whole message again (it is made of exact counts);
        # only a message it cannot vouch for is counted.
        excess = (bound if bound is not None and bound <= budget else count(user)) - budget
        if excess <= 0:
            return SummaryPrompt(system=system, user=user, dropped=dropped)
        target -= excess << attempt  # the per-entry estimate was low: aim lower, faster each time
    raise PromptBudgetTooSmall(
        f"a summary request cannot fit max_input_tokens={max_input_tokens}: the instructions take "
        f"{count(system) + PROMPT_FRAMING_TOKENS} tokens and the smallest request scaffolding more "
        f"than the {max(budget, 0)} left"
    )
