"""The Context Capsule (SPEC §4): the model, its Markdown form, and summary validation.

A capsule is rendered as Markdown with exactly the 13 level-2 headings of
`SECTION_HEADINGS`, in order. Parsing is tolerant (spacing, case, `&`, numbering, bold
markers in headings) so a model's answer can be read; `validate_summary` decides whether a
model's answer may be committed at all.

Two details keep `render → parse → render` stable for any body text:
- a body line that would read as a level-2 heading is escaped with a backslash on render
  (`\\## x`), and the backslash is removed on parse; inside fenced code only lines that
  would read as one of the 13 headings need it, because parsing ignores other headings there;
- a body that leaves a code fence open gets a closing fence on render, so the fence cannot
  swallow the following sections.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

SECTION_HEADINGS: tuple[str, ...] = (
    "Goal and constraints",
    "Work done",
    "In progress",
    "Pending",
    "Decisions",
    "Blockers",
    "Next steps",
    "Files read",
    "Files modified",
    "Verification",
    "Active skills",
    "Kernel state",
    "Artifacts",
)
SECTION_FIELDS: tuple[str, ...] = (
    "goal_and_constraints",
    "work_done",
    "in_progress",
    "pending",
    "decisions",
    "blockers",
    "next_steps",
    "files_read",
    "files_modified",
    "verification",
    "active_skills",
    "kernel_state",
    "artifacts",
)
EMPTY_BODY = "(none)"
"""What an empty section says when rendered."""
EMPTY_MARKERS = frozenset({"(none)", "none", "none.", "n/a", "(n/a)", "-", "—", "(empty)", "nothing"})
"""Bodies (compared case-insensitively) that mean "this section is empty"."""
EMPTY_ITEMS = frozenset({"none yet", "nothing yet", "none so far", "nothing so far", "(none yet)", "(nothing)", "empty"})
"""Items, besides `EMPTY_MARKERS`, that only say a section is empty (`- none yet`)."""
ERROR_EXCERPT_CHARS = 120

_HEADING = re.compile(r"^ {0,3}##(?!#)[ \t]*(?P<title>\S.*?)[ \t]*$")
_HEADING_LIKE = re.compile(r"^(?P<indent> {0,3})(?P<slashes>\\*)(?P<rest>##(?!#)[ \t]*\S.*)$")
_FENCE_OPEN = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_FENCE_CLOSE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})[ \t]*$")
_ITEM_START = re.compile(r"^\s{0,3}(?:[-*+]|\d{1,3}[.)])\s+")


def _heading_key(title: str) -> str:
    """`"##   work DONE "`, `"**Work done:**"`, `"2. Work done"` all give `"work done"`."""
    return " ".join(re.sub(r"[^a-z]+", " ", title.lower().replace("&", " and ")).split())


_FIELD_BY_KEY: dict[str, str] = {
    _heading_key(heading): field for heading, field in zip(SECTION_HEADINGS, SECTION_FIELDS, strict=True)
}


class CapsuleFormatError(ValueError):
    """Text is not a capsule: one or more of the 13 headings is missing."""

    def __init__(self, missing: list[str]):
        self.missing = missing
        names = ", ".join(f"## {heading}" for heading in missing)
        super().__init__(f"capsule is missing {len(missing)} section heading(s): {names}")


class InvalidSummary(ValueError):
    """A model's summary must not be committed. `code` says why, for flight records."""

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(message)


def is_empty_marker(text: str) -> bool:
    """Whether `text` (a body, or one item of it: `- (none)`, `* none`, `- n/a`, `**None.**`)
    only says "empty"."""
    bare = _ITEM_START.sub("", text.strip(), count=1).strip().strip("*_`").strip().rstrip(".").strip()
    return text.strip().lower() in EMPTY_MARKERS or bare.lower() in EMPTY_MARKERS or bare.lower() in EMPTY_ITEMS


def _without_empty_items(body: str) -> str:
    """`body` without the items that only say "empty" (a model writes `- (none)`, and an
    earlier fallback capsule kept it beside real items); "" when nothing else is left.
    Fenced code is never touched; blank lines around a removed item do not pile up."""
    lines = body.split("\n")
    drop: set[int] = set()
    fence: tuple[str, int] | None = None
    for index, line in enumerate(lines):
        if fence is not None:
            if _fence_closed(line, fence):
                fence = None
            continue
        if (opened := _fence_opened(line)) is not None:
            fence = opened
            continue
        alone = (index == 0 or not lines[index - 1].strip() or _ITEM_START.match(line)) and (
            index + 1 == len(lines) or not lines[index + 1].strip() or _ITEM_START.match(lines[index + 1])
        )
        if line.strip() and alone and is_empty_marker(line):
            drop.add(index)
    if not drop:
        return body
    kept: list[str] = []
    for index, line in enumerate(lines):
        if index in drop:
            continue
        if not line.strip() and index - 1 in drop and (not kept or not kept[-1].strip()):
            continue  # the blank line after a removed item, when one is there already
        kept.append(line)
    return "\n".join(kept).strip()


def _normalize_body(text: str) -> str:
    body = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    if body.lower() in EMPTY_MARKERS:
        return ""
    while (lean := _without_empty_items(body)) != body:  # (a removal can leave another alone)
        body = lean
    return body


class Capsule(BaseModel):
    """The working state of a session, section by section (Markdown bodies, "" when empty).

    Bodies are normalized on construction: newlines to `\\n`, surrounding whitespace
    stripped, and "(none)"-like bodies to "".
    """

    model_config = ConfigDict(frozen=True)

    goal_and_constraints: str = ""
    """The goal, the latest user request quoted whole, and the constraints the user stated."""
    work_done: str = ""
    """What has been finished (milestones, completed steps)."""
    in_progress: str = ""
    """What was being worked on when the capsule was made."""
    pending: str = ""
    """What is known to remain, including unanswered tool calls."""
    decisions: str = ""
    """Decisions taken, each with its reason."""
    blockers: str = ""
    """Open problems: failing commands, errors not yet resolved."""
    next_steps: str = ""
    """What the agent planned to do next."""
    files_read: str = ""
    """Paths read or listed."""
    files_modified: str = ""
    """Paths written or edited."""
    verification: str = ""
    """Commands and code runs with their last result (exit status, ok, exception)."""
    active_skills: str = ""
    """Names of the skills in effect."""
    kernel_state: str = ""
    """User-namespace variables the work depends on, with type and shape, never values."""
    artifacts: str = ""
    """Paths of outputs the work produced."""
    extra_sections: list[tuple[str, str]] = Field(default_factory=list)
    """Unknown `## ` sections found when parsing, in their original order; rendered last."""

    @field_validator(*SECTION_FIELDS)
    @classmethod
    def _body(cls, value: str) -> str:
        return _normalize_body(value)

    @field_validator("extra_sections")
    @classmethod
    def _extras(cls, value: list[tuple[str, str]]) -> list[tuple[str, str]]:
        result = []
        for raw_title, body in value:
            title = raw_title.strip()
            if not title or "\n" in title or "\r" in title:
                raise ValueError(f"extra section title {raw_title!r} must be one non-empty line")
            if _heading_key(title) in _FIELD_BY_KEY:
                raise ValueError(f"extra section title {title!r} is one of the 13 capsule sections")
            result.append((title, _normalize_body(body)))
        return result

    def sections(self) -> list[tuple[str, str]]:
        """(heading, body) for the 13 sections in order, then the extra sections."""
        known = [(h, str(getattr(self, f))) for h, f in zip(SECTION_HEADINGS, SECTION_FIELDS, strict=True)]
        return known + list(self.extra_sections)

    def is_blank(self) -> bool:
        """True when every one of the 13 sections is empty."""
        return not any(getattr(self, field) for field in SECTION_FIELDS)


# --- fences and escaping -------------------------------------------------------------


def _fence_opened(line: str) -> tuple[str, int] | None:
    match = _FENCE_OPEN.match(line)
    if match is None:
        return None
    fence = match["fence"]
    if fence[0] == "`" and "`" in match["info"]:
        return None  # CommonMark: a backtick fence's info string has no backticks
    return fence[0], len(fence)


def _fence_closed(line: str, fence: tuple[str, int]) -> bool:
    match = _FENCE_CLOSE.match(line)
    return match is not None and match["fence"][0] == fence[0] and len(match["fence"]) >= fence[1]


def _is_known_heading(line: str) -> bool:
    match = _HEADING.match(line)
    return match is not None and _heading_key(match["title"]) in _FIELD_BY_KEY


def _escape_body(body: str) -> str:
    lines = []
    fence: tuple[str, int] | None = None
    for line in body.split("\n"):
        if fence is not None:
            if _fence_closed(line, fence):
                fence = None
            else:
                match = _HEADING_LIKE.match(line)
                if match and _is_known_heading(match["rest"]):
                    line = match["indent"] + "\\" + match["slashes"] + match["rest"]
        elif (opened := _fence_opened(line)) is not None:
            fence = opened
        elif (match := _HEADING_LIKE.match(line)) is not None:
            line = match["indent"] + "\\" + match["slashes"] + match["rest"]
        lines.append(line)
    if fence is not None:
        lines.append(fence[0] * fence[1])
    return "\n".join(lines)


def _unescape(line: str, *, known_only: bool) -> str:
    match = _HEADING_LIKE.match(line)
    if match is None or not match["slashes"]:
        return line
    if known_only and not _is_known_heading(match["rest"]):
        return line
    return match["indent"] + match["slashes"][1:] + match["rest"]


def split_sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(text before the first heading, [(title, body)]) of Markdown, bodies stripped.

    Headings inside fenced code are not headings, except one of the 13 capsule headings,
    which also ends a fence a model forgot to close.
    """
    preamble: list[str] = []
    sections: list[tuple[str, list[str]]] = []
    current = preamble
    fence: tuple[str, int] | None = None
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        heading = _HEADING.match(line)
        if fence is not None:
            if _fence_closed(line, fence):
                fence = None
            elif heading and _heading_key(heading["title"]) in _FIELD_BY_KEY:
                fence = None
                current = []
                sections.append((heading["title"].strip(), current))
                continue
            current.append(_unescape(line, known_only=True))
            continue
        if heading:
            current = []
            sections.append((heading["title"].strip(), current))
            continue
        fence = _fence_opened(line)
        current.append(_unescape(line, known_only=False))
    return "\n".join(preamble).strip(), [(t, "\n".join(b).strip()) for t, b in sections]


# --- render and parse ----------------------------------------------------------------


def render_capsule(capsule: Capsule) -> str:
    """The capsule as Markdown: `## Heading`, a blank line, the body; "(none)" when empty."""
    parts = [f"## {heading}\n\n{_escape_body(body) if body else EMPTY_BODY}" for heading, body in capsule.sections()]
    return "\n\n".join(parts) + "\n"


def capsule_token_text(capsule: Capsule) -> str:
    """The text whose token count is the capsule's size in model input."""
    return render_capsule(capsule)


def parse_capsule(text: str, *, require_all: bool = True) -> Capsule:
    """Read a capsule from Markdown; text before the first heading is ignored.

    Raises `CapsuleFormatError` naming the missing headings, unless `require_all` is
    False (then missing sections are empty: for carrying over a damaged capsule).
    A heading given twice has its bodies joined.
    """
    _, sections = split_sections(text)
    bodies: dict[str, list[str]] = {}
    extras: list[tuple[str, str]] = []
    for title, body in sections:
        field = _FIELD_BY_KEY.get(_heading_key(title))
        if field is None:
            extras.append((title, body))
        elif _normalize_body(body):
            bodies.setdefault(field, []).append(body)
        else:
            bodies.setdefault(field, [])
    missing = [h for h, f in zip(SECTION_HEADINGS, SECTION_FIELDS, strict=True) if f not in bodies]
    if missing and require_all:
        raise CapsuleFormatError(missing)
    values = {field: "\n\n".join(parts) for field, parts in bodies.items()}
    return Capsule(**values, extra_sections=extras)


def section_items(body: str) -> list[str]:
    """A section body split into items: each list item with its continuation lines, and
    each paragraph that is not a list item. Fenced code stays inside its item."""
    items: list[list[str]] = []
    fence: tuple[str, int] | None = None
    for line in body.split("\n"):
        if fence is not None:
            items[-1].append(line)
            if _fence_closed(line, fence):
                fence = None
            continue
        if not line.strip():
            if items and items[-1]:
                items.append([])
            continue
        if _ITEM_START.match(line) or not items:
            items.append([line])
        else:
            items[-1].append(line)
        fence = _fence_opened(line)
    joined = ("\n".join(item) for item in items if item)
    return [item for item in joined if not is_empty_marker(item)]


# --- validation of a model's summary ---------------------------------------------------

_ERROR_START = re.compile(
    r"""^\W{0,3}(?:
        error\b | errors?: | exception\b | fatal\b | traceback\ \(most\ recent\ call\ last\)
      | i['’]?m\ sorry | i\ am\ sorry | sorry\b | apologies | i\ apologi[sz]e
      | i\ cannot | i\ can\ ?not | i\ can['’]t | i\ won['’]t | i['’]?m\ unable | i\ am\ unable
      | i['’]?m\ not\ able | i\ am\ not\ able | unfortunately\b
      | as\ an\ ai\b | as\ a\ language\ model | as\ an\ assistant
      | (?:http/\d(?:\.\d)?\s+)?[45]\d\d\b | internal\ server\ error | bad\ gateway
      | service\ unavailable | gateway\ time-?out | too\ many\ requests | rate[\ _-]?limit
      | request\ (?:failed|timed\ out) | upstream\b | overloaded | <!doctype | <html
      | \{\s*"(?:error|detail|message)"
      | context[\ _]length[\ _]exceeded | maximum\ context\ length
    )""",
    re.IGNORECASE | re.VERBOSE,
)
_ERROR_ANYWHERE = re.compile(
    r"traceback \(most recent call last\)|rate[ _-]?limit|too many requests"
    r"|internal server error|context[ _]length[ _]exceeded|maximum context length"
    r"|\b(?:http|status(?: code)?)[/ ]?\d?(?:\.\d)?\s*[45]\d\d\b|\"error\"\s*:",
    re.IGNORECASE,
)
_TEXT_TOOL_CALL = re.compile(
    r"^\s*(?:<tool_call>|<\|tool_call\|>|<function_call>|<\|python_tag\|>|\[TOOL_CALLS\])",
    re.MULTILINE,
)


def _excerpt(text: str) -> str:
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if len(line) <= ERROR_EXCERPT_CHARS else line[:ERROR_EXCERPT_CHARS] + "…"


def validate_summary(text: str, *, finish_reason: str | None, has_tool_calls: bool) -> Capsule:
    """The capsule a model's answer holds, or `InvalidSummary` saying why it is refused.

    Refused: empty, cut short (`finish_reason == "length"`), containing a tool call,
    looking like an error message, missing headings, or with every section empty. Only the
    text before the first heading (or the whole text when headings are missing) is judged
    as a possible error message, so a Blockers section that quotes an error is fine.
    """
    if not text.strip():
        raise InvalidSummary("empty", "the summary is empty")
    if finish_reason == "length":
        raise InvalidSummary("cut_short", "the summary was cut short (finish reason 'length')")
    if has_tool_calls:
        raise InvalidSummary("tool_call", "the summary contains a tool call")
    if _TEXT_TOOL_CALL.search(text):
        raise InvalidSummary("tool_call", "the summary contains a tool call written as text")
    preamble, _ = split_sections(text)
    if _ERROR_START.match(preamble):
        raise InvalidSummary("error_message", f"the summary looks like an error message: {_excerpt(preamble)}")
    try:
        capsule = parse_capsule(text)
    except CapsuleFormatError as exc:
        if _ERROR_ANYWHERE.search(text):
            raise InvalidSummary(
                "error_message", f"the summary looks like an error message: {_excerpt(text)}"
            ) from exc
        raise InvalidSummary("missing_headings", f"the summary is not a capsule: {exc}") from exc
    if capsule.is_blank():
        raise InvalidSummary("blank", "every section of the summary is empty")
    return capsule
