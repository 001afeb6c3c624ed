"""The notebook's cells as the model reads them (SPEC §10): a `cells` entry rendered as text,
and the choice of which cells fit `notebook.contextTokens`.

The cells run since the previous turn go ahead of the user's request, newest last, as

    Notebook cells run since the last request (newest last):

    In [4]:
    ```python
    df["revenue"].sum()
    ```
    raised KeyError: 'revenue'
    Traceback (most recent call last):
      ...

A cell's parts are labelled apart (SPEC §15): what it printed under `printed:`, its result
under `Out[n]:` (with the kinds of other rich output it displayed), and each image it
displayed on a line of its own, `[displayed image/png 640×480]` — so a cell that only drew a
plot still says so. An entry written before printed text was recorded apart has it ahead of
the result in `output`, and renders as it always did (`Out[n]:` holding both).

When they do not fit the budget, the oldest go first, but the newest error always stays
(its traceback clipped to its last `TRACEBACK_LINES` lines): "why does the cell above fail?"
must reach the model with the cell it is about.

`notebook.contextTokens` bounds the block's *text* (the image lines included); the images
themselves are not counted against it. A model that takes images gets them beside the block
(model input makes each an `ImagePart`): they count in the session's budget with the entry
(`entry_tokens`, as a tool result's images do), and a request carries at most
`notebook.maxImagesPerRequest` of all its images, the newest — so the cells budget stays a
budget of what the block says, whichever model reads it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from soba_nb.text import clip_middle
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import Artifact, CellRecord, CellsEntry

HEADING = "Notebook cells run since the last request (newest last):"
LEFT_OUT = "({count} earlier cells left out to fit the notebook context budget)"
TRACEBACK_LINES = 40
"""The newest error keeps its traceback's last this many lines (the frames nearest the raise)."""
SOURCE_CHARS = 4000
OUTPUT_CHARS = 2000
ERROR_CHARS = 6000
"""A cell's source, output and error are clipped to these sizes (head and tail)."""
FIRST_TURN_CELLS = 5
"""A session's first turn carries the last this many cells."""


def clip_record(record: CellRecord) -> CellRecord:
    """A cell with its texts clipped to the sizes above, its traceback to its last lines."""
    error = record.error
    if error is not None:
        lines = error.splitlines()
        if len(lines) > TRACEBACK_LINES + 1:
            # The first line is `Type: message`; the traceback's last lines are the ones that matter.
            lines = [lines[0], f"[… {len(lines) - 1 - TRACEBACK_LINES} traceback lines left out …]", *lines[-TRACEBACK_LINES:]]
        error = clip_middle("\n".join(lines), ERROR_CHARS)
    return msgspec.structs.replace(
        record,
        source=clip_middle(record.source, SOURCE_CHARS),
        error=error,
        output=None if record.output is None else clip_middle(record.output, OUTPUT_CHARS),
        printed=record.printed if not record.printed else clip_middle(record.printed, OUTPUT_CHARS),
    )


_BACKTICKS = re.compile("`{3,}")


def fence_for(text: str) -> str:
    """A Markdown code fence longer than any run of backticks in `text` (a cell that prints a
    fence of its own must not end the block early)."""
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=2)
    return "`" * (longest + 1)


def cell_label(record: CellRecord) -> str:
    """`In [4]` (`In [ ]` when the kernel gave no execution count)."""
    return f"In [{record.execution_count}]" if record.execution_count is not None else "In [ ]"


def render_cell(record: CellRecord) -> str:
    label = cell_label(record)
    fence = fence_for(record.source)
    parts = [f"{label}:\n{fence}python\n{record.source}\n{fence}"]
    if record.printed:
        parts.append(f"{PRINTED}\n{record.printed}")
    if record.output:
        out = f"Out[{record.execution_count}]" if record.execution_count is not None else "Output"
        parts.append(f"{out}:\n{record.output}")
    parts.extend(image_line(image) for image in record.images or ())
    parts.extend(f"[displayed {why}]" for why in record.images_not_kept or ())
    if record.outcome == "error":
        parts.append(f"raised {record.error or 'an error'}")
    return "\n".join(parts)


PRINTED = "printed:"


def image_line(image: Artifact) -> str:
    """How the block names an image a cell displayed (SPEC §15)."""
    return f"[displayed {image.mime} {image.width}×{image.height}]"


def cell_images(entry: CellsEntry) -> list[tuple[CellRecord, Artifact]]:
    """The images the entry's cells displayed, in order (oldest cell first), each with its cell."""
    return [(record, image) for record in entry.cells for image in record.images or ()]


def render_cells(entry: CellsEntry) -> str:
    """The entry as the model reads it (a user message ahead of the request)."""
    parts = [HEADING]
    if entry.omitted:
        parts.append(LEFT_OUT.format(count=entry.omitted))
    parts.extend(render_cell(record) for record in entry.cells)
    return "\n\n".join(parts)


def fit_cells(records: Sequence[CellRecord], budget_tokens: int, counter: TokenCounter) -> CellsEntry | None:
    """The entry for `records` (newest last) within `budget_tokens`, oldest left out first and
    the newest error always kept (clipped harder if it alone is over the budget); None when
    there is nothing to say or the budget is 0."""
    if budget_tokens <= 0 or not records:
        return None
    cells = [clip_record(record) for record in records]
    newest_error = next((i for i in range(len(cells) - 1, -1, -1) if cells[i].outcome == "error"), None)
    # Each cell counted once (a join costs a token or two); the whole block is counted exactly
    # before it is taken, and one more cell goes while it is over.
    costs = [counter.count_text(render_cell(cell)) + JOIN_TOKENS for cell in cells]
    room = budget_tokens - counter.count_message("user", HEADING + "\n\n" + LEFT_OUT.format(count=len(cells)))
    keep = list(range(len(cells)))
    total = sum(costs)
    while keep and total > room:
        drop = next((i for i in keep if i != newest_error), None)
        if drop is None:
            break
        keep.remove(drop)
        total -= costs[drop]

    def entry(indices: list[int]) -> CellsEntry:
        return CellsEntry(cells=[cells[i] for i in indices], omitted=len(cells) - len(indices))

    while keep and counter.count_message("user", render_cells(entry(keep))) > budget_tokens:
        drop = next((i for i in keep if i != newest_error), None)
        if drop is None:
            return _clipped_to_fit(cells[keep[0]], len(cells) - 1, budget_tokens, counter)
        keep.remove(drop)
    return entry(keep) if keep else None


JOIN_TOKENS = 2


def _clipped_to_fit(cell: CellRecord, omitted: int, budget_tokens: int, counter: TokenCounter) -> CellsEntry | None:
    """The newest error alone over the budget: its texts halved until it fits (the first line
    of the error, `Type: message`, is clipped last: to twice the others, never below
    `MIN_CLIP_CHARS`), or None when not even that fits."""
    error = cell.error or ""
    head, _, rest = error.partition("\n")
    limit = max(len(cell.source), len(rest), len(cell.output or ""), len(cell.printed or ""), len(head) // 2)
    while limit >= MIN_CLIP_CHARS:
        limit //= 2
        shorter = msgspec.structs.replace(
            cell,
            source=clip_middle(cell.source, limit),
            error=clip_middle(head, max(2 * limit, MIN_CLIP_CHARS)) + ("\n" + clip_middle(rest, limit) if rest else ""),
            output=None if cell.output is None else clip_middle(cell.output, limit),
            printed=cell.printed if not cell.printed else clip_middle(cell.printed, limit),
        )
        candidate = CellsEntry(cells=[shorter], omitted=omitted)
        if counter.count_message("user", render_cells(candidate)) <= budget_tokens:
            return candidate
    return None


MIN_CLIP_CHARS = 16
