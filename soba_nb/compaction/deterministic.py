"""The deterministic capsule (SPEC §4): built locally from the entries, with no model.

Used when the model summary fails or times out (`quality: degraded`), and as the extract of
history too old to fit in a summary request. It must be good on its own: every file touched,
every command run with its last outcome, and the latest user request (quoted whole) survive
it, and so does everything the previous capsule held (its items come first, deduplicated).

The entries are read in one pass by `soba_nb.compaction.extract.Scan`; this module turns
what it found into the capsule's sections, merged with the previous capsule's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import TypeVar

from soba_nb.compaction.capsule import Capsule, parse_capsule, section_items
from soba_nb.compaction.extract import (
    DECISION_SCAN_CHARS,
    ITEM_CLIP_CHARS,
    Scan,
    Start,
    bullet,
    fresh_start,
)
from soba_nb.compaction.requests import (
    CLIP_CHARS,
    DEFAULT_REQUEST_TOKENS,
    IN_PROGRESS,
    Count,
    Requests,
    collect,
    fit,
    split_goal,
    with_block,
)
from soba_nb.compaction.requests import (
    NONE as NO_REQUESTS,
)
from soba_nb.compaction.requests import render as render_requests
from soba_nb.text import clip, first_line, head_and_tail, one_line
from soba_nb.transcript.entries import Entry, MessageEntry, ToolResultEntry

CONSTRAINTS_MAX = 20
WORK_DONE_NEW_LINES = 12
"""Assistant first lines kept from the summarized part (milestones are always kept)."""
NARRATIVE_MAX_ITEMS = 40
"""Cap on work done / decisions / in progress / pending / next steps after merging."""
DECISIONS_NEW_MAX = 8
NEXT_STEPS_NEW_MAX = 6
BLOCKERS_MAX = 10
LIST_ITEMS_MAX = 400
"""Runs, files and names a capsule takes from the entries it summarizes: the newest this many
(a session of ten thousand distinct runs would make a capsule that could never be sent; the
older ones are in the transcript, and a note says so)."""
EXTRACT_ITEMS_MAX = 100
"""The same for the extract of history too old to fit a summary request."""
OLDER_LEFT_OUT = "… older ones are left out (see the transcript)"
ASSIGNED_NAMES_MAX = 60
KERNEL_LINE_GIVING_WAY_CHARS = 120
KERNEL_LINES_GIVING_WAY = 10
GIVING_WAY_REQUEST_SHARE = 4
"""A capsule giving way quotes requests within this fraction (1/4) of their usual budget…"""
GIVING_WAY_REQUEST_CHARS = CLIP_CHARS // 2
"""…and older ones clipped to this length."""
"""A Kernel state line's length when the capsule gives way (its first columns stay)."""
OUTPUT_EXTENSIONS = frozenset(
    {
        "png", "jpg", "jpeg", "gif", "svg", "pdf", "html", "htm", "csv", "tsv", "parquet",
        "json", "jsonl", "xlsx", "xls", "feather", "arrow", "pkl", "pickle", "joblib", "npy",
        "npz", "h5", "hdf5", "zip", "onnx", "pt", "pth", "mp4",
    }
)
"""Extensions of files that count as artifacts (outputs the work produced)."""

CONSTRAINTS_LABEL = "Constraints the user stated:"
CARRIED_LABEL = "Carried over from the previous capsule:"
ASSIGNED_NAMES_PREFIX = "Names assigned by the agent's python code (type and shape not recorded):"

T = TypeVar("T")

_NEXT_STEP = re.compile(
    r"^\s*(?:(?:[-*]|\d{1,2}[.)])\s+|(?:next|then|todo|i will|i'll|we will|we'll|remaining)\b)",
    re.IGNORECASE,
)
_ITEM_MARKER = re.compile(r"^\s*(?:[-*+]|\d{1,3}[.)])\s+")
_BACKTICK_NAME = re.compile(r"`([A-Za-z_]\w*)`")


# --- section items: fencing, keys, merging, capping -------------------------------------


def _fenced(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def _strip_marker(item: str) -> str:
    return _ITEM_MARKER.sub("", item, count=1).strip()


def item_key(item: str) -> str:
    return " ".join(_strip_marker(item).replace("`", "").lower().split())


def _path_key(item: str) -> str:
    text = _strip_marker(item).replace("`", "")
    for cut in (" (", " — ", " - "):
        text = text.split(cut, 1)[0]
    return text.strip()


def _kernel_key(item: str) -> str:
    text = _strip_marker(item).replace("`", "")
    return text.split(":", 1)[0].strip() if ":" in text else text


def _merge(previous: Iterable[str], new: Iterable[str], key: Callable[[str], str] = item_key) -> list[str]:
    """Previous items first; an item whose key comes again is replaced and moves last."""
    merged: dict[str, str] = {}
    for item in (*previous, *new):
        item_key = key(item)
        merged.pop(item_key, None)
        merged[item_key] = item
    return list(merged.values())


def _cap(items: list[str], limit: int) -> list[str]:
    """The newest `limit` items, with a note for the older ones left out."""
    if len(items) <= limit:
        return items
    kept = items[-max(limit - 1, 1) :]
    return [bullet(f"… and {len(items) - len(kept)} more, older (see the transcript)"), *kept]


def _newest_listed(items: list[str], limit: int) -> list[str]:
    """The newest `limit` items of a merged list (runs, files), after one note when older ones
    are left out (now, or by an earlier capsule or snapshot: its note is not an item)."""
    listed = [item for item in items if _strip_marker(item) != OLDER_LEFT_OUT]
    if len(listed) == len(items) and len(listed) <= limit:
        return items
    return [bullet(OLDER_LEFT_OUT), *listed[-limit:]]


def _body(items: Sequence[str]) -> str:
    """Items joined as a Markdown list; a paragraph item is set off by blank lines."""
    parts: list[str] = []
    for index, item in enumerate(items):
        if index:
            tight = _ITEM_MARKER.match(item) and _ITEM_MARKER.match(items[index - 1])
            parts.append("\n" if tight else "\n\n")
        parts.append(item)
    return "".join(parts)


def _select(pairs: list[tuple[bool, str]], newest: int) -> list[str]:
    """Items flagged True always, plus the newest `newest` of the others, in order."""
    others = [index for index, (always, _) in enumerate(pairs) if not always]
    keep = set(others[-newest:]) if newest else set()
    return [item for index, (always, item) in enumerate(pairs) if always or index in keep]


_PRINTED = re.compile(r" → (ok|exit status -?\d+): ")


def without_output(item: str) -> str:
    """A run's item with its outcome alone: `python `len(df)` → ok: 1722` → `… → ok`. A failure
    keeps its message (`KeyError: 'region'`): it says what went wrong."""
    found = _PRINTED.search(item)
    return item if found is None else item[: found.start()] + f" → {found[1]}"


def run_key(item: str) -> str:
    text = _strip_marker(item)
    match = re.match(r"^(?:shell|python) (?:`` .*? ``|`[^`]*`)", text)
    return match[0] if match else " ".join(text.rsplit(" → ", 1)[0].split())


# --- sections ----------------------------------------------------------------------------

def _constraints_and_carried(rest: str) -> tuple[list[str], str]:
    """(constraints, carried text) of a goal section's text after its requests block: the
    constraints this module listed, and everything else carried over whole (a model's goal,
    or a goal in an earlier version's layout)."""
    marker = CONSTRAINTS_LABEL + "\n"
    if not rest.startswith(marker):
        return [], rest
    constraints: list[str] = []
    lines = rest[len(marker) :].split("\n")
    for index, line in enumerate(lines):
        if _ITEM_MARKER.match(line):
            constraints.append(line)
            continue
        carried = "\n".join(lines[index:]).strip()
        if carried.startswith(CARRIED_LABEL + "\n"):
            carried = carried[len(CARRIED_LABEL) + 1 :].strip()
        return constraints, carried
    return constraints, ""


def _goal(
    scan: Scan,
    requests_block: str,
    previous_body: str,
    limit: int,
    request_chars: int | None = None,
) -> str:
    """The requests soba recorded (`requests.render`), then the constraints the user stated,
    then what an earlier capsule's goal said that is neither (carried over whole)."""
    _, rest = split_goal(previous_body)
    if rest.startswith(CARRIED_LABEL + "\n"):
        rest = rest[len(CARRIED_LABEL) + 1 :].strip()
    constraints, carried = _constraints_and_carried(rest)
    if request_chars is not None:  # a small window: what earlier capsules carried gives way too
        carried = head_and_tail(carried, 2 * request_chars) if carried and request_chars else ""
    constraints = _cap(_merge(constraints, scan.constraints), min(CONSTRAINTS_MAX, limit))
    parts = [requests_block] if requests_block else []
    if constraints:
        parts.append(CONSTRAINTS_LABEL + "\n" + "\n".join(constraints))
    if carried:
        parts.append(f"{CARRIED_LABEL}\n{carried}")
    return "\n\n".join(parts)


def _kernel_state(scan: Scan, given: Sequence[str], previous: list[str], limit: int) -> list[str]:
    if given:  # the live kernel described itself (`soba_nb.agent.kernel_state`): the truth now
        return [bullet(line.strip()) for line in given if line.strip()]
    # No kernel to ask (a transcript read offline): carry what earlier capsules said.
    names: list[str] = []
    others: list[str] = []
    for item in previous:
        if _strip_marker(item).startswith(ASSIGNED_NAMES_PREFIX):
            names.extend(_BACKTICK_NAME.findall(item))
        else:
            others.append(item)
    items = _merge(others, [bullet(line.strip()) for line in given if line.strip()], _kernel_key)
    described = {_kernel_key(item) for item in items}
    assigned = [name for name, _ in _newest(scan.assigned, limit)]
    names = [n for n in _merge(names, assigned, lambda n: n) if n not in described]
    names = names[-ASSIGNED_NAMES_MAX:]
    if names:
        items.append(bullet(f"{ASSIGNED_NAMES_PREFIX} " + ", ".join(f"`{n}`" for n in names)))
    return items


def _newest(mapping: dict[str, T], limit: int) -> list[tuple[str, T]]:
    """The newest `limit` items of an insertion-ordered mapping, oldest first."""
    if len(mapping) <= limit:
        return list(mapping.items())
    return list(islice(reversed(mapping.items()), limit))[::-1]


def _noting_older(scan: Scan, name: str, limit: int, items: list[str]) -> list[str]:
    """`items` after a note when the scan found more than `limit` (or a snapshot dropped some)."""
    if len(getattr(scan, name)) > limit or name in scan.older_left_out:
        return [bullet(OLDER_LEFT_OUT), *items]
    return items


def _blockers(scan: Scan, previous: list[str], limit: int) -> list[str]:
    runs = _newest(scan.runs, limit)
    resolved = {run_key(run.display) for _, run in runs if not run.failed}
    failing = [
        bullet(f"{run.display} last failed: {run.outcome}")
        for key, run in runs
        if run.failed and (run.kind == "shell" or key == scan.last_python)
    ]
    # Held up by something outside the work (stated in a message): kept until the cap pushes
    # it out, since no run can say it was resolved.
    merged = _merge(_merge(previous, failing, run_key), scan.stated_blockers, run_key)
    return _cap([item for item in merged if run_key(item) not in resolved], min(BLOCKERS_MAX, limit))


def _in_progress(scan: Scan, requests: Requests) -> list[str]:
    """The request being worked on when this capsule replaces it (a long tool loop): it is
    quoted whole under Goal and constraints, marked `in progress`; and the latest step."""
    if not requests.items or requests.items[0].status != IN_PROGRESS:
        return []
    items = [bullet("The user request marked in progress under Goal and constraints: the work on it goes on")]
    if scan.last_assistant is not None:
        items.append(bullet(f"Latest step: {first_line(scan.last_assistant, ITEM_CLIP_CHARS)}"))
    return items


def _next_steps(scan: Scan) -> list[str]:
    if scan.last_assistant is None:
        return []
    lines = [s for s in scan.last_assistant[:DECISION_SCAN_CHARS].splitlines() if _NEXT_STEP.match(s)]
    return [bullet(one_line(_strip_marker(s), ITEM_CLIP_CHARS)) for s in lines[-NEXT_STEPS_NEW_MAX:]]


def _tool_summary(scan: Scan) -> list[str]:
    if not scan.tool_counts:
        return []
    counts = ", ".join(f"{name} ×{n}" for name, n in sorted(scan.tool_counts.items()))
    return [bullet(f"Tool calls in this stretch: {sum(scan.tool_counts.values())} ({counts})")]


def build_deterministic_capsule(
    entries: Sequence[Entry],
    *,
    previous: Capsule | None = None,
    kept: Sequence[Entry] = (),
    kernel_state: Sequence[str] = (),
    current: MessageEntry | None = None,
    request_tokens: int = DEFAULT_REQUEST_TOKENS,
    count: Count | None = None,
    scans: Callable[[Sequence[Entry], int], Start] | None = None,
) -> Capsule:
    """A capsule of `entries` built without a model.

    `previous`: the capsule being rolled up (when None, the last capsule entry among
    `entries` is used); its items come first in every section. `kept`: the kept tail that
    follows, read for tool results and for whether a request was answered. `kernel_state`:
    lines such as `df: DataFrame 120000×14`. `current`: the request being worked on (the
    latest user message on the path), quoted whole when the capsule replaces it (SPEC §5);
    the user's requests are quoted within `request_tokens` as `count` measures them
    (`soba_nb.compaction.requests`). `scans`: where the scan may start
    (`ExtractSnapshots.start`: a snapshot of the first entries, so only the rest are read).
    """
    scan = scan_for_capsule(entries, kept=kept, scans=scans)
    if previous is None and scan.capsule_text is not None:
        previous = parse_capsule(scan.capsule_text, require_all=False)
    return capsule_from_scan(
        scan,
        previous=previous,
        kept=kept,
        kernel_state=kernel_state,
        requests=requests_of(entries, kept, previous, current),
        request_tokens=request_tokens,
        count=count,
    )


def requests_of(
    entries: Sequence[Entry],
    kept: Sequence[Entry],
    previous: Capsule | None,
    current: MessageEntry | None,
    from_start: bool | None = None,
) -> Requests:
    """The user's requests a capsule replacing `entries` quotes, rolled up with `previous`'s.
    `from_start`: `entries` start the session (default: when there is no previous capsule)."""
    earlier, _ = split_goal(previous.goal_and_constraints) if previous is not None else (Requests(), "")
    return collect(entries, kept, earlier, current, from_start=previous is None if from_start is None else from_start)


def with_images_named(capsule: Capsule, scan: Scan) -> Capsule:
    """`capsule` (a model's) with every image the summarized calls displayed in its Artifacts
    section: a summary may leave a plot out, but the capsule must name it (SPEC §10), since
    the image itself is never sent again."""
    missing = [bullet(shown) for path, shown in _newest(scan.artifacts, LIST_ITEMS_MAX) if path not in capsule.artifacts]
    if not missing:
        return capsule
    return capsule.model_copy(update={"artifacts": "\n".join(filter(None, [capsule.artifacts.strip(), *missing]))})


def scan_for_capsule(
    entries: Sequence[Entry],
    *,
    kept: Sequence[Entry] = (),
    scans: Callable[[Sequence[Entry], int], Start] | None = None,
) -> Scan:
    """The scan `build_deterministic_capsule` renders (see there), to render it again with
    fewer items (`capsule_from_scan` does not change it)."""
    if scans is None:
        scan = Scan({e.call_id: e for e in kept if isinstance(e, ToolResultEntry)})  # (in the region: by order)
        scan.run(entries)
        return scan
    begun = scans(entries, len(entries))
    # Results in the kept tail count too (a snapshot that read one of their calls
    # unanswered is of no use: from the first entry then).
    later = {e.call_id: e for e in kept if isinstance(e, ToolResultEntry)}
    if any(call_id in later for call_id in begun.unanswered):
        begun = fresh_start([*entries, *kept])
    scan = begun.scan
    scan.results.update(later)
    scan.run(entries[begun.covered :])
    return scan


def capsule_from_scan(
    scan: Scan,
    *,
    previous: Capsule | None = None,
    kept: Sequence[Entry] = (),
    kernel_state: Sequence[str] = (),
    requests: Requests = NO_REQUESTS,
    request_tokens: int = DEFAULT_REQUEST_TOKENS,
    count: Count | None = None,
    items_max: int | None = None,
    request_chars: int | None = None,
    giving_way: bool = False,
) -> Capsule:
    """`build_deterministic_capsule` from a scan already run (a scan can be extended with
    more entries and read again, so an extract that grows costs one pass in all).
    `requests`: the user's requests to quote (`requests_of`; none for an extract, whose
    requests soba quotes itself in the capsule), fitted to `request_tokens` by `count`.
    `items_max`: the items of each list, newest first — runs, files and names (`LIST_ITEMS_MAX`
    when None), also after merging with the previous capsule's, so lists do not grow with every
    compaction of a long session; at most `NARRATIVE_MAX_ITEMS` of work, decisions and steps,
    and at most the usual constraints. `request_chars` (a small window): the quoted requests,
    and what earlier capsules carried, are clipped to their head and tail at this length; the
    request being worked on, when only the capsule carries it, never is.
    `request_chars=0`: the bare capsule (`BARE_NOTE`), the last thing that gives way.
    `giving_way` (a capsule too large for its window, rendered shorter): runs are listed with
    their outcome alone, not what they printed; Kernel state lines are fewer and shorter; older
    requests are quoted shorter, within a quarter of their budget — all before list items go."""
    if request_chars == 0:
        return _bare(requests)
    if giving_way and request_chars is None:  # older requests shorter and fewer, before any list item
        block = requests_block(requests, request_tokens // GIVING_WAY_REQUEST_SHARE, count, GIVING_WAY_REQUEST_CHARS)
    else:
        block = requests_block(requests, request_tokens, count, request_chars)
    limit = LIST_ITEMS_MAX if items_max is None else max(min(items_max, LIST_ITEMS_MAX), 1)
    narrative = min(NARRATIVE_MAX_ITEMS, limit)
    # When a small window makes the capsule give way, the story of the work (what was said,
    # what is in progress, what comes next) goes first and fastest: the files, commands and
    # outcomes are what SPEC §4 wants every capsule to keep.
    story = max(1, NARRATIVE_MAX_ITEMS * limit // LIST_ITEMS_MAX)
    if previous is None and scan.capsule_text is not None:
        previous = parse_capsule(scan.capsule_text, require_all=False)
    prior = previous or Capsule()

    def items(field_name: str) -> list[str]:
        return section_items(str(getattr(prior, field_name)))

    written = _newest(scan.files_modified, limit)
    modified = _noting_older(
        scan, "files_modified", limit, [bullet(f"{p} ({failure})" if failure else p) for p, failure in written]
    )
    outputs = [bullet(p) for p, failure in written if not failure and p.rsplit(".", 1)[-1].lower() in OUTPUT_EXTENSIONS]
    outputs += _noting_older(scan, "artifacts", limit, [bullet(shown) for _, shown in _newest(scan.artifacts, limit)])
    read = _noting_older(scan, "files_read", limit, [bullet(shown) for _, shown in _newest(scan.files_read, limit)])
    runs = _noting_older(scan, "runs", limit, [bullet(f"{r.display} → {r.outcome}") for _, r in _newest(scan.runs, limit)])
    verified = items("verification")
    if giving_way:  # the runs stay, what they printed goes first; so do long column lists
        runs, verified = [without_output(item) for item in runs], [without_output(item) for item in verified]
        kernel_state = [clip(line, KERNEL_LINE_GIVING_WAY_CHARS) for line in kernel_state[:KERNEL_LINES_GIVING_WAY]]
    work = [*_select(scan.work, WORK_DONE_NEW_LINES), *_tool_summary(scan)]

    def narrative_of(items: list[str], most: int | None = None) -> str:
        items = _cap(items, narrative if most is None else min(narrative, most))
        if request_chars is not None:  # a small window: each item gives way like the requests
            items = [bullet(head_and_tail(_strip_marker(item), request_chars)) for item in items]
        return _body(items)

    return Capsule(
        goal_and_constraints=_goal(scan, block, prior.goal_and_constraints, limit, request_chars),
        work_done=narrative_of(_merge(items("work_done"), work), story),
        in_progress=narrative_of(_merge(items("in_progress"), _in_progress(scan, requests)), story),
        pending=narrative_of(_merge(items("pending"), scan.pending)),
        decisions=narrative_of(_merge(items("decisions"), _select(scan.decisions, DECISIONS_NEW_MAX))),
        blockers=_body(_blockers(scan, items("blockers"), limit)),
        next_steps=narrative_of(_merge(items("next_steps"), _next_steps(scan)), story),
        files_read=_body(_newest_listed(_merge(items("files_read"), read, _path_key), limit)),
        files_modified=_body(_newest_listed(_merge(items("files_modified"), modified, _path_key), limit)),
        verification=_body(_newest_listed(_merge(verified, runs, run_key), limit)),
        active_skills=_body(_merge(items("active_skills"), [bullet(f"{n} ({p})") for n, p in scan.skills.items()], _path_key)),
        kernel_state=_body(_kernel_state(scan, kernel_state, items("kernel_state"), limit)),
        artifacts=_body(_newest_listed(_merge(items("artifacts"), outputs, _path_key), limit)),
        extra_sections=list(prior.extra_sections),
    )


BARE_NOTE = (
    "The earlier work of this session is in its transcript: the model's window is too small to "
    "summarize it here."
)


def requests_block(
    requests: Requests, request_tokens: int, count: Count | None = None, request_chars: int | None = None
) -> str:
    """The requests as the Goal section quotes them, fitted (`requests.fit`); in a small window
    (`request_chars`) each one but the request in progress is clipped to that length."""
    if request_chars is None:
        return render_requests(fit(requests, request_tokens, count))
    return render_requests(fit(requests, request_tokens, count, clip_chars=max(request_chars, 1), clip_all=True))


def _bare(requests: Requests) -> Capsule:
    """Every section empty but the goal: a note, and the request being worked on whole when
    only the capsule carries it (SPEC §5). For a window that can take little more than the
    request itself (SPEC §12: only a request that cannot fit even alone is refused)."""
    working = requests.items[:1] if requests.items and requests.items[0].status == IN_PROGRESS else ()
    block = render_requests(Requests(working)) if working else ""
    return Capsule(goal_and_constraints="\n\n".join(part for part in (block, BARE_NOTE) if part))


def with_requests(capsule: Capsule, requests: Requests, request_tokens: int, count: Count | None = None) -> Capsule:
    """`capsule` (a model's) with the user's requests soba recorded at the top of its Goal
    section, instead of any a model wrote there in soba's layout (SPEC §14: the summarizer is
    not trusted with them)."""
    goal = with_block(capsule.goal_and_constraints, requests_block(requests, request_tokens, count))
    return capsule.model_copy(update={"goal_and_constraints": goal})
