"""Making a forced compaction fit a small window (SPEC §12): the capsule gives way first.

A `hard_limit` or `context_overflow` compaction must bring the continuation under the hard
limit whenever the system prompt, the tool schemas and the request being worked on fit it
alone. Found against a real llama.cpp server with a 2,048-token window: the fallback
capsule quoted the session's first request and earlier lists whole, the kept tail was
sized for a capsule smaller than the one written, and even a one-line request was refused.
So, in this order, until the continuation fits:

1. the deterministic capsule's lists are shortened, newest kept (`LIST_ITEMS_MAX` down to
   one item each, the most that fit found by halving);
2. its quoted requests (the first, the earlier ones, a quote of a request the tail carries
   whole), its items and what earlier capsules carried are clipped to their head and tail,
   shorter and shorter (`REQUEST_CHARS_STEPS`), and at last the capsule is bare: its
   headings, a note that the earlier work is in the transcript, and the request being worked
   on when only the capsule carries it; then one line naming its checkpoint (SPEC §17,
   `soba_nb.compaction.given_way`: the same news without the 13 headings);
3. the cut moves later (`later_cuts`): less is kept in full, more is summarized, down to the
   last group; the request being worked on is then quoted whole in the capsule;
4. no capsule at all, with the most kept in full that fits (`generation.keep_less`).

Only a request that cannot fit even alone — the system prompt, the tool schemas, the request
and the calls it made since, with no capsule — is refused (`request_alone_reason` says so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from soba_nb.compaction.deterministic import LIST_ITEMS_MAX
from soba_nb.compaction.given_way import ONE_LINE
from soba_nb.compaction.model_input import entry_tokens
from soba_nb.compaction.planner import Cut, valid_cuts
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import CapsuleEntry

REQUEST_CHARS_STEPS = (160, 80, 40, 0, ONE_LINE)
"""Head-and-tail lengths the capsule's quoted requests are clipped to, in turn, once one item
per list is not short enough; 0 is the bare capsule (every section empty, a note and the
request being worked on when only the capsule carries it); `ONE_LINE` the capsule of one line
naming its checkpoint (and that request)."""

Measured = TypeVar("Measured")


def shortest_fitting(
    render: Callable[[int | None, int | None], tuple[Measured, int]], goal: int
) -> tuple[Measured, int]:
    """The longest shortened render of a fallback capsule that fits `goal` (the usual render
    did not), or the shortest of all when none does.

    `render(items_max, request_chars)` builds and measures one (None: the usual figure). One
    item per list is tried first: when lists are not what makes the capsule long, no halving
    is spent on them.
    """
    fewest = render(1, None)
    if fewest[1] <= goal:  # some lists are long: the most items that fit, by halving
        best, fits, over = fewest, 1, LIST_ITEMS_MAX
        while over - fits > 1:
            items_max = (fits + over) // 2
            shorter = render(items_max, None)
            if shorter[1] <= goal:
                fits, best = items_max, shorter
            else:
                over = items_max
        return best
    shortest = fewest
    for request_chars in REQUEST_CHARS_STEPS:  # one item each is not enough: requests clipped
        shortest = render(1, request_chars)
        if shortest[1] <= goal:
            return shortest
    return shortest


def later_cuts(cut: Cut, counter: TokenCounter) -> list[Cut]:
    """Cuts that keep less than `cut`, from the most kept to the least (the last group).

    Each is a valid cut of `cut.kept` (a message with every earlier call answered), so no
    tool call is ever separated from its result; what is no longer kept is summarized.
    """
    kept = cut.kept
    costs = [0 if isinstance(entry, CapsuleEntry) else entry_tokens(entry, counter) for entry in kept]
    found: list[Cut] = []
    for index in valid_cuts(kept):
        if index == 0:
            continue
        moved = sum(costs[:index])
        found.append(
            Cut(
                summarize=(*cut.summarize, *kept[:index]),
                kept=tuple(kept[index:]),
                first_kept_entry_id=kept[index].id,
                kept_tokens=cut.kept_tokens - moved,
                summarized_tokens=cut.summarized_tokens + moved,
                previous=cut.previous,
                request=cut.request,
            )
        )
    return found


def first_fitting(candidates: Sequence[Cut], fits: Callable[[Cut], bool]) -> Cut | None:
    """The candidate keeping the most that fits, found by halving (keeping less never makes
    the continuation larger: the capsule grows by far less than the tail it replaces)."""
    low, high = 0, len(candidates)
    found: Cut | None = None
    while low < high:
        middle = (low + high) // 2
        if fits(candidates[middle]):
            found, high = candidates[middle], middle
        else:
            low = middle + 1
    return found


def request_alone_reason(
    tokens: int, fixed: int, request: int, goal: int, calls: int = 0, fixed_name: str = "system prompt and tools"
) -> str:
    """Why a request is refused when nothing more can give way, in the words of SPEC §12 and
    §17: the continuation with no capsule at all. `calls`: what the calls the request made
    since cost (kept whole: a call is never split from its result, and no cut falls inside one
    step); what is left of `tokens` (entries kept beside them, the server's own count) is
    "the rest". `fixed_name`: what the fixed part is made of (`instructions.fixed_parts_name`)."""
    since = f", the calls it made since {calls:,}" if calls else ""
    rest = tokens - fixed - request - calls
    rest_text = f", the rest {rest:,}" if rest > 0 else ""
    return (
        f"the request being worked on cannot fit even alone: with no capsule at all the continuation is "
        f"{tokens:,} tokens ({fixed_name} {fixed:,}, the request {request:,}{since}{rest_text}), "
        f"above hardLimit {goal:,}"
    )
