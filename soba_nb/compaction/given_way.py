"""A capsule that gives way entirely (SPEC §17): one line naming its checkpoint, or none.

In a window that takes little more than the system prompt, the tool schemas and the request
being worked on, even the bare capsule (13 headings, a note) can be what does not fit. Then,
before a request is refused, the capsule becomes:

- `ONE_LINE`: a single line naming its checkpoint, saying that the earlier part of the
  session is left out and which request to work on;
- `NO_CAPSULE`: nothing at all reaches the model (the entry stays in the transcript: it marks
  the cut and says, in one line, why nothing was sent).

Either form is followed by the request being worked on, whole, when only the capsule carries
it (SPEC §5): under the line as the usual requests block, or — with no capsule — alone, as the
user's message the model was sent.

The entry's `content` is that line (and the block): not the 13 sections of SPEC §4. Readers of
capsule content tell it apart with `given_way_form` (project memory never mirrors it, export
refuses it in one line, `%capsule show` shows the line) and read it as a capsule with
`as_capsule` (its Goal section holds the request, so the next compaction rolls it up).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from soba_nb.compaction.requests import IN_PROGRESS, Requests, split_goal
from soba_nb.compaction.requests import render as render_requests

if TYPE_CHECKING:
    from soba_nb.compaction.capsule import Capsule

Form = Literal["one line", "none"]

ONE_LINE = -1
"""The `request_chars` step of a fallback render (`soba_nb.compaction.fitting`) that gives a
one-line capsule."""
NO_CAPSULE = -2
"""The `request_chars` step that gives no capsule at all."""
FORMS: dict[int, Form] = {ONE_LINE: "one line", NO_CAPSULE: "none"}

ONE_LINE_TEXT = (
    "Context Capsule {checkpoint}: the earlier part of this session is left out, the model's window "
    "being too small to summarize it; what it defined may still be in the kernel. Work on the newest "
    "user request."
)
NO_CAPSULE_TEXT = (
    "No capsule {checkpoint}: the model's window is too small even for a one-line capsule, so nothing "
    "of the earlier part of this session is sent; the transcript holds it."
)
_LINE = re.compile(
    r"\A(?:Context Capsule (?P<one>ck_[0-9a-f]+): the earlier part of this session is left out"
    r"|No capsule (?P<none>ck_[0-9a-f]+): the model's window is too small even for a one-line capsule)"
)


@dataclass(frozen=True)
class GivenWay:
    """A capsule that gave way entirely, before its checkpoint id is known: its form and the
    requests block it carries ("" when the request being worked on is in the kept tail)."""

    form: Form
    block: str = ""

    def content(self, checkpoint: str) -> str:
        """The entry's content: the line naming `checkpoint`, then the block, if any."""
        line = (ONE_LINE_TEXT if self.form == "one line" else NO_CAPSULE_TEXT).format(checkpoint=checkpoint)
        return f"{line}\n\n{self.block}\n" if self.block else f"{line}\n"


def given_way(requests: Requests, step: int) -> GivenWay:
    """The capsule of `step` (`ONE_LINE` or `NO_CAPSULE`) for `requests`: only the request
    being worked on, and only when the capsule carries it (its status `in progress`)."""
    working = requests.items[:1] if requests.items and requests.items[0].status == IN_PROGRESS else ()
    return GivenWay(FORMS[step], render_requests(Requests(working)) if working else "")


def given_way_form(content: str) -> Form | None:
    """"one line" or "none" for the content of a capsule that gave way entirely, else None."""
    match = _LINE.match(content)
    if match is None:
        return None
    return "one line" if match["one"] else "none"


def _block(content: str) -> str:
    _, _, rest = content.partition("\n")
    return rest.strip()


def as_capsule(content: str) -> Capsule:
    """A capsule that gave way, as a capsule: the request it carries in its Goal section, every
    other section empty (what the next compaction rolls up)."""
    # Imported here: model input reads this module, and `soba-nb budget` imports no pydantic.
    from soba_nb.compaction.capsule import Capsule

    return Capsule(goal_and_constraints=_block(content))


def model_text(content: str) -> str:
    """What the model reads of a capsule that gave way: the one line and the request it carries;
    with no capsule, only that request as the user sent it ("" when the tail holds it)."""
    if given_way_form(content) == "one line":
        return content.strip()
    requests, _ = split_goal(_block(content))
    if not requests.items:
        return ""
    request = requests.items[0]
    return request.expanded if request.expanded is not None else request.text
