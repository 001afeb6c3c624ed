"""The user's requests a capsule quotes verbatim (SPEC §14), written by soba, not the model.

A capsule replaces part of a session; the requests the user made in that part are what the
next model must not misread. Every capsule, model or deterministic, carries them at the top of
its `## Goal and constraints` section, newest first, each marked:

- `done`: a turn after it completed with an answer;
- `in progress`: the newest request, not answered yet (the work goes on after the capsule);
- `not answered`: a newer request came before any answer (a failed or cancelled turn).

A slash command is quoted as the user typed it (`MessageEntry.typed`: `/fix`), never as
soba's expansion. A message the user sent into the running turn from the sidebar (`steer:
true`, SPEC §18) is no new request: it is part of the request being worked on, quoted after it
(`[steered during the turn] ...`) inside the same item, whose status it does not change; the
message telling the model of an edit decision (`edit`) is soba's words, no request at all. The requests fit `compaction.userRequestTokens`: the newest are quoted whole
while they fit; older ones are clipped to their head and tail, with a note; older still are
counted in a last line. A request `in progress` is always whole (SPEC §5). Across repeated
compactions the list rolls up: the previous capsule's requests come after (older than) the
new ones, and one it left `in progress` becomes `done` when the span that follows answers it.

    User requests in the part of the session this capsule replaces, newest first (verbatim, recorded by soba):

    1. in progress:

    ```text
    and now the refunds by month?
    ```

    2. done:

    ```text
    /fix
    ```
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import chain

from soba_nb.text import ELLIPSIS, head_and_tail
from soba_nb.transcript.entries import CheckpointEntry, Entry, MessageEntry, ToolCallEntry

Count = Callable[[str], int]
Status = str

DONE: Status = "done"
IN_PROGRESS: Status = "in progress"
NOT_ANSWERED: Status = "not answered"
STATUSES = (DONE, IN_PROGRESS, NOT_ANSWERED)

REQUESTS_LABEL = (
    "User requests in the part of the session this capsule replaces, newest first "
    "(verbatim, recorded by soba):"
)
CLIPPED_NOTE = "clipped: its head and tail"
OLDER_NOTE = "{count} older request(s) left out here; the transcript holds them"
EXPANDED_LABEL = "which soba sent to the model as:"
STEER_MARK = "[steered during the turn] "
"""Before each steer message quoted with the request it steered."""
OPENING_NOTE = "the session's first request"
OPENING_CLIP_CHARS = 600
"""The session's first request (its goal, most often) is kept through every capsule, at least
its head and tail this long, before newer requests fill the rest of the budget."""
CLIP_CHARS = 300
NEWEST_CLIP_FACTOR = 4
"""An older request beyond the budget is quoted this long (its head and tail)."""
DEFAULT_REQUEST_TOKENS = 4000
CHARS_PER_TOKEN_ESTIMATE = 3
"""Without a tokenizer at hand, a request's size is estimated at this many characters a token
(fewer than most text has: the estimate errs on the side of a smaller capsule)."""

_ITEM = re.compile(
    r"^(?P<number>\d+)\. (?P<status>done|in progress|not answered)(?: \((?P<notes>[^()\n]*)\))?:"
    r"\n\n(?P<fence>`{3,})text\n(?P<text>.*?)\n(?P=fence)[ \t]*$"
    r"(?:\n\n" + re.escape(EXPANDED_LABEL) + r"\n\n(?P<efence>`{3,})text\n(?P<expanded>.*?)\n(?P=efence)[ \t]*$)?",
    re.MULTILINE | re.DOTALL,
)
_OLDER = re.compile(r"^\(?(?P<count>\d+) older request\(s\) left out here[^\n]*$", re.MULTILINE)


@dataclass(frozen=True)
class Request:
    """One user request as a capsule quotes it."""

    text: str
    status: Status
    clipped: bool = False
    expanded: str | None = None
    opening: bool = False
    """The session's first request: kept (clipped if need be) when older ones are left out."""
    """What soba sent for it (a `/fix` turned into a request with the cell and its error), kept
    only while the request is `in progress`: the work on it needs what the model was sent."""


@dataclass(frozen=True)
class Requests:
    """The requests of a capsule, newest first, and how many older ones were left out."""

    items: tuple[Request, ...] = ()
    older_left_out: int = 0

    def __bool__(self) -> bool:
        return bool(self.items) or self.older_left_out > 0


NONE = Requests()
"""No requests (an extract: soba quotes the requests in the capsule itself)."""


def said(entry: MessageEntry) -> str:
    """A user message as the user typed it (`/fix`), not as soba expanded it."""
    return entry.typed if entry.typed is not None else entry.content


def is_request(entry: Entry) -> bool:
    """A user message that is a request: not a steer into the running one, nor the message
    telling the model of an edit decision."""
    return type(entry) is MessageEntry and entry.role == "user" and entry.steer is not True and not entry.edit


def _with_steers(text: str, steers: Sequence[str]) -> str:
    return text + "".join(f"\n\n{STEER_MARK}{steer}" for steer in steers)


def _statuses(entries: Iterable[Entry]) -> list[tuple[MessageEntry | None, Status, tuple[str, ...]]]:
    """Each request with its status and the steers sent into it, oldest first. The first item
    (`None`) stands for a request made before these entries: whether the entries answer it
    before any user message (and what steered it)."""
    found: list[tuple[MessageEntry | None, Status, tuple[str, ...]]] = [(None, IN_PROGRESS, ())]
    answered = False
    for entry in entries:
        if isinstance(entry, MessageEntry):
            if entry.role == "user" and not is_request(entry):
                if entry.steer is True:
                    message, status, steers = found[-1]
                    found[-1] = (message, status, (*steers, entry.content))
            elif entry.role == "user":
                message, _, steers = found[-1]
                found[-1] = (message, DONE if answered else NOT_ANSWERED, steers)
                found.append((entry, IN_PROGRESS, ()))
                answered = False
            elif entry.role == "assistant" and entry.content.strip():
                answered = True  # an answer, unless a tool call follows (then it was a step)
        elif isinstance(entry, ToolCallEntry):
            answered = False
        elif isinstance(entry, CheckpointEntry) and entry.kind == "turn":
            answered = True  # soba records a `turn` checkpoint when a turn completed
    message, _, steers = found[-1]
    found[-1] = (message, DONE if answered else IN_PROGRESS, steers)
    return found


def _request(message: MessageEntry, status: Status, steers: Sequence[str] = ()) -> Request:
    expanded = message.content if message.typed is not None and status == IN_PROGRESS else None
    return Request(_with_steers(said(message), steers), status, expanded=expanded)


def _quotes(request: Request, text: str) -> bool:
    """Whether `request` quotes `text`: the same, or its head and tail (`head_and_tail`)."""
    if request.text == text:
        return True
    if not request.clipped or f" {ELLIPSIS} " not in request.text:
        return False
    head, tail = request.text.split(f" {ELLIPSIS} ", 1)
    whole = " ".join(text.split())
    return whole.startswith(head) and whole.endswith(tail)


def collect(
    summarized: Sequence[Entry],
    kept: Sequence[Entry] = (),
    previous: Requests | None = None,
    current: MessageEntry | None = None,
    from_start: bool = False,
) -> Requests:
    """The requests of a capsule that replaces `summarized` (followed by `kept`), newest first,
    rolled up with `previous` (the requests of the capsule it replaces). Statuses are read over
    both spans: a request answered in the kept tail is `done`. `current`: the request being
    worked on (the latest user message on the path); when it lies before `summarized` and the
    previous capsule does not list it (a capsule of another version), it is listed all the same.
    `from_start`: `summarized` starts the session (no capsule before it): its first request is
    the session's opening one, kept through every later capsule."""
    statuses = _statuses(chain(summarized, kept))
    in_span = sum(1 for entry in summarized if is_request(entry))
    new = [_request(m, status, steers) for m, status, steers in statuses[1 : in_span + 1] if m is not None]
    previous = previous or NONE
    if from_start and new and not previous:  # no capsule before: the first request opened the session
        new[0] = replace(new[0], opening=True)
    older = list(previous.items)
    on_path = any(m is current for m, _, _ in statuses[1:])
    if current is not None and not on_path:
        if older and older[0].text.startswith(f"{said(current)}\n\n{STEER_MARK}"):
            pass  # quoted whole already, with the steers sent into it
        elif older and _quotes(older[0], said(current)):
            older[0] = replace(older[0], text=said(current), clipped=False)  # the newest: whole again
        else:
            older.insert(0, _request(current, IN_PROGRESS))
    if older and older[0].status == IN_PROGRESS:
        # The newest request of the previous capsule was still being worked on: what follows
        # it now says whether it was answered (or left for a newer one), and what steered it.
        _, status, steers = statuses[0]
        status = status if status != IN_PROGRESS or not new else NOT_ANSWERED
        expanded = older[0].expanded if status == IN_PROGRESS else None
        older[0] = replace(older[0], text=_with_steers(older[0].text, steers), status=status, expanded=expanded)
    return Requests((*reversed(new), *older), previous.older_left_out)


def fenced(text: str) -> str:
    """`text` in a ```text fence no line of it can close."""
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _item(number: int, request: Request) -> str:
    notes = [note for note, on in ((OPENING_NOTE, request.opening), (CLIPPED_NOTE, request.clipped)) if on]
    label = f" ({'; '.join(notes)})" if notes else ""
    item = f"{number}. {request.status}{label}:\n\n{fenced(request.text)}"
    if request.expanded is not None:
        item += f"\n\n{EXPANDED_LABEL}\n\n{fenced(request.expanded)}"
    return item


def _estimate(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN_ESTIMATE + 1


def fit(
    requests: Requests, budget: int, count: Count | None = None, clip_chars: int = CLIP_CHARS, *, clip_all: bool = False
) -> Requests:
    """The requests within `budget` tokens: whole while they fit (the newest always), then clipped to `clip_chars`, their head and tail, then left out (counted) once
    not even that fits; the session's first request is kept first, clipped to
    `OPENING_CLIP_CHARS` at most. `count` measures (an estimate without it). `clip_all` (a
    small window): every request is clipped but the one in progress, the newest to
    `NEWEST_CLIP_FACTOR` times the others' length."""
    measure = count or _estimate
    items = list(requests.items)
    opening: Request | None = None
    used = 0
    whole: Request | None = None
    if len(items) > 1 and items[-1].opening:
        opening = whole = items.pop()
        text = head_and_tail(opening.text, min(OPENING_CLIP_CHARS, 2 * clip_chars) if clip_all else OPENING_CLIP_CHARS)
        if text != opening.text:
            opening = replace(opening, text=text, clipped=True)
        used = measure(_item(len(requests.items), opening))
    kept: list[Request] = []
    left_out = requests.older_left_out
    for index, request in enumerate(items):
        if index == 0 and not request.clipped:  # the newest is quoted whole: a follow-up needs it
            if clip_all and request.status != IN_PROGRESS:  # (a small window: its head and tail, longer)
                text = head_and_tail(request.text, NEWEST_CLIP_FACTOR * clip_chars)
                request = request if text == request.text else replace(request, text=text, clipped=True)
            kept.append(request)
            used += measure(_item(index + 1, request))
            continue
        cost = measure(_item(index + 1, request))
        if used + cost <= budget and not clip_all:
            kept.append(request)
            used += cost
            continue
        short = replace(request, text=head_and_tail(request.text, clip_chars), clipped=True)
        if short.text == request.text:
            short = request
        cost = measure(_item(index + 1, short))
        if used + cost <= budget:
            kept.append(short)
            used += cost
            continue
        left_out += len(items) - index
        break
    # Every other request fitted: the opening one whole, if the rest of the budget holds it.
    number = len(requests.items)
    if (
        whole is not None
        and opening is not None
        and opening is not whole
        and not clip_all
        and left_out == requests.older_left_out
        and used - measure(_item(number, opening)) + measure(_item(number, whole)) <= budget
    ):
        opening = whole
    return Requests((*kept, *([opening] if opening else [])), left_out)


def render(requests: Requests) -> str:
    """The block at the top of the Goal section ("" when there are none)."""
    if not requests:
        return ""
    items = list(requests.items)
    opening = items.pop() if len(items) > 1 and items[-1].opening else None
    parts = [REQUESTS_LABEL, *(_item(number, request) for number, request in enumerate(items, 1))]
    if requests.older_left_out:
        parts.append(f"({OLDER_NOTE.format(count=requests.older_left_out)})")
    if opening is not None:
        parts.append(_item(len(items) + requests.older_left_out + 1, opening))
    return "\n\n".join(parts)


def split_goal(goal: str) -> tuple[Requests, str]:
    """(the requests block soba wrote at the top of a Goal section, the rest of the section).
    A goal without the block gives no requests and itself."""
    at = goal.find(REQUESTS_LABEL)
    if at < 0:
        return Requests(), goal
    end = at + len(REQUESTS_LABEL)
    items: list[Request] = []
    left_out = 0
    while True:
        rest = goal[end:]
        stripped = rest.lstrip("\n")
        if (match := _ITEM.match(stripped)) is not None:
            notes = (match["notes"] or "").split("; ")
            items.append(
                Request(match["text"], match["status"], CLIPPED_NOTE in notes, match["expanded"], OPENING_NOTE in notes)
            )
        elif (match := _OLDER.match(stripped)) is not None and not left_out:
            left_out = int(match["count"])
        else:
            break
        end += len(rest) - len(stripped) + match.end()
    remainder = (goal[:at] + goal[end:]).strip()
    return Requests(tuple(items), left_out), remainder


def with_block(goal: str, block: str) -> str:
    """`goal` with `block` at its top, instead of any requests block it had."""
    _, rest = split_goal(goal)
    return "\n\n".join(part for part in (block, rest) if part)
