"""The deterministic capsule (SPEC §4): built locally from the entries, with no model.

Used when the model summary fails or times out (`quality: degraded`), and as the extract of
history too old to fit in a summary request. It must be good on its own: every file touched,
every command run with its last outcome, and the latest user request (quoted whole) survive
it, and so does everything the previous capsule held (its items come first, deduplicated).

One pass over the entries, regular expressions only (no tokenizing, no parsing of code), so
a 200k-token history builds in milliseconds. Best effort where it reads code: paths written
by `df.to_csv("x")`, `open("x", "w")`, `savefig("x")`, shell redirections; names assigned
at the top level of python code.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from soba_nb.compaction.capsule import Capsule, parse_capsule, section_items
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    Entry,
    MessageEntry,
    SkillEntry,
    ToolCallEntry,
    ToolResultEntry,
)

EARLIER_REQUESTS_KEPT = 3
"""User messages before the latest one that are quoted (clipped) as context."""
EARLIER_REQUESTS_MAX = 8
REQUEST_CLIP_CHARS = 300
KEPT_REQUEST_QUOTE_LIMIT_CHARS = 2000
"""A latest request that is also in the kept tail is quoted whole only up to this size."""
CONSTRAINTS_MAX = 20
CONSTRAINT_SCAN_CHARS = 20_000
ITEM_CLIP_CHARS = 200
WORK_DONE_NEW_LINES = 12
"""Assistant first lines kept from the summarized part (milestones are always kept)."""
NARRATIVE_MAX_ITEMS = 40
"""Cap on work done / decisions / in progress / pending / next steps after merging."""
DECISIONS_NEW_MAX = 8
DECISION_SCAN_CHARS = 4000
NEXT_STEPS_NEW_MAX = 6
BLOCKERS_MAX = 10
SHELL_COMMAND_CLIP_CHARS = 300
PYTHON_CODE_CLIP_CHARS = 120
OUTCOME_CLIP_CHARS = 160
EXCEPTION_SCAN_CHARS = 4000
ASSIGNED_NAMES_MAX = 60
OUTPUT_EXTENSIONS = frozenset(
    {
        "png", "jpg", "jpeg", "gif", "svg", "pdf", "html", "htm", "csv", "tsv", "parquet",
        "json", "jsonl", "xlsx", "xls", "feather", "arrow", "pkl", "pickle", "joblib", "npy",
        "npz", "h5", "hdf5", "zip", "onnx", "pt", "pth", "mp4",
    }
)
"""Extensions of files that count as artifacts (outputs the work produced)."""
NOT_FILES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})

LATEST_REQUEST_LABEL = "Latest user request (verbatim):"
EARLIER_REQUESTS_LABEL = "Earlier user requests:"
CONSTRAINTS_LABEL = "Constraints the user stated:"
CARRIED_LABEL = "Carried over from the previous capsule:"
ASSIGNED_NAMES_PREFIX = "Names assigned by the agent's python code (type and shape not recorded):"

_PATH = r"""[rRbBuU]?(?P<q>['"])(?P<path>[^'"\n]+)(?P=q)"""
_CODE_WRITES = [
    re.compile(
        r"\.to_(?:csv|parquet|json|excel|html|pickle|feather|markdown|latex|stata|hdf|xml|orc)"
        r"\(\s*(?:\w+\s*=\s*)?" + _PATH
    ),
    re.compile(
        r"\b(?:savefig|write_image|write_html|savez_compressed|savez|savetxt|imwrite|to_file|save)"
        r"\(\s*(?:\w+\s*=\s*)?" + _PATH
    ),
    re.compile(r"\b(?:torch\.save|joblib\.dump|pickle\.dump|dump)\([^()\n]*?,\s*" + _PATH),
    re.compile(r"\bopen\(\s*" + _PATH + r"""\s*,\s*(?:mode\s*=\s*)?['"][^'"]*[wax+]"""),
    re.compile(r"Path\(\s*" + _PATH + r"\s*\)\s*\.\s*(?:write_text|write_bytes|touch)\("),
    re.compile(r"\b(?:copy2?|copyfile|move|rename|replace)\([^,\n]*,\s*" + _PATH),
]
_SHELL_TARGET = r"""(?P<path>[^\s&|;<>()]+)"""
_SHELL_WRITES = [
    re.compile(r"(?<![0-9&<>])>>?\s*" + _SHELL_TARGET),
    re.compile(r"\btee\s+(?:-a\s+)?" + _SHELL_TARGET),
    re.compile(r"\btouch\s+" + _SHELL_TARGET),
    re.compile(r"\b(?:cp|mv)\s+(?:-\w+\s+)*[^\s&|;<>()]+\s+" + _SHELL_TARGET),
]
_ASSIGNMENT = re.compile(
    r"^([A-Za-z_]\w*(?:[ \t]*,[ \t]*[A-Za-z_]\w*)*)[ \t]*(?:[-+*/%&|^@]|//|\*\*|>>|<<)?=(?!=)",
    re.MULTILINE,
)
_EXIT_STATUS = re.compile(r"^\s*exit status:?\s*(-?\d+)", re.IGNORECASE)
_EXCEPTION = re.compile(
    r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Failure|Timeout))\b:?(.*)$",
    re.MULTILINE,
)
_CONSTRAINT = re.compile(
    r"\b(?:must|never|don['’]?t|do not|only|should|shouldn['’]t|without|always|avoid"
    r"|make sure|ensure|no more than|at most|at least)\b",
    re.IGNORECASE,
)
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")
_DECISION = re.compile(
    r"\b(?:decided|decide to|chose|choosing|instead of|switch(?:ed|ing)? to|because|rather than)\b",
    re.IGNORECASE,
)
_NEXT_STEP = re.compile(
    r"^\s*(?:(?:[-*]|\d{1,2}[.)])\s+|(?:next|then|todo|i will|i'll|we will|we'll|remaining)\b)",
    re.IGNORECASE,
)
_ITEM_MARKER = re.compile(r"^\s*(?:[-*+]|\d{1,3}[.)])\s+")
_REQUEST_BLOCK = re.compile(
    re.escape(LATEST_REQUEST_LABEL) + r"\n\n(?P<fence>`{3,})\n(?P<text>.*?)\n(?P=fence)(?:\n|$)",
    re.DOTALL,
)
_ARGUMENT_STRING = re.compile(r'"(?P<key>path|command|code|kind|note)"\s*:\s*(?P<value>"(?:[^"\\]|\\.)*")')
_BACKTICK_NAME = re.compile(r"`([A-Za-z_]\w*)`")


# --- small text helpers ----------------------------------------------------------------


def _one_line(text: str, limit: int) -> str:
    """Whitespace collapsed, clipped to `limit` characters with an ellipsis."""
    line = " ".join(text[: limit * 4].split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _first_line(text: str, limit: int) -> str:
    line = next((s for s in text[: limit * 8].splitlines() if s.strip()), "")
    return _one_line(line, limit)


def _code_span(text: str) -> str:
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"


def _code_display(code: str, limit: int) -> str:
    """Code on one line; when clipped, a short hash keeps different runs apart."""
    joined = " ⏎ ".join(line.strip() for line in code.strip().splitlines() if line.strip())
    if len(joined) <= limit:
        return joined
    digest = hashlib.sha1(code.encode("utf-8", "replace")).hexdigest()[:6]
    return f"{joined[: limit - 1]}… [#{digest}]"


def _fenced(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def _bullet(text: str) -> str:
    return f"- {text}"


def _strip_marker(item: str) -> str:
    return _ITEM_MARKER.sub("", item, count=1).strip()


def _item_key(item: str) -> str:
    return " ".join(_strip_marker(item).replace("`", "").lower().split())


def _path_key(item: str) -> str:
    text = _strip_marker(item).replace("`", "")
    for cut in (" (", " — ", " - "):
        text = text.split(cut, 1)[0]
    return text.strip()


def _kernel_key(item: str) -> str:
    text = _strip_marker(item).replace("`", "")
    return text.split(":", 1)[0].strip() if ":" in text else text


def _merge(previous: Iterable[str], new: Iterable[str], key: Callable[[str], str] = _item_key) -> list[str]:
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
    kept = items[-(limit - 1) :]
    return [_bullet(f"… and {len(items) - len(kept)} more, older (see the transcript)"), *kept]


def _body(items: Sequence[str]) -> str:
    """Items joined as a Markdown list; a paragraph item is set off by blank lines."""
    parts: list[str] = []
    for index, item in enumerate(items):
        if index:
            tight = _ITEM_MARKER.match(item) and _ITEM_MARKER.match(items[index - 1])
            parts.append("\n" if tight else "\n\n")
        parts.append(item)
    return "".join(parts)


def _arguments(raw: str) -> dict[str, Any]:
    """Tool arguments from JSON text; from a malformed text, the string fields we can read."""
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    found: dict[str, Any] = {}
    for match in _ARGUMENT_STRING.finditer(raw):
        try:
            found.setdefault(match["key"], json.loads(match["value"]))
        except ValueError:
            continue
    return found


def _text_argument(arguments: dict[str, Any], key: str) -> str:
    value = arguments.get(key)
    return value if isinstance(value, str) else ""


def _looks_like_path(path: str) -> bool:
    return path not in NOT_FILES and re.search(r"[A-Za-z]", path) is not None


def _paths_written(text: str, patterns: Sequence[re.Pattern[str]]) -> list[str]:
    found: dict[str, None] = {}
    for pattern in patterns:
        for match in pattern.finditer(text):
            path = match["path"].strip("'\"")
            if _looks_like_path(path):
                found[path] = None
    return list(found)


def _shell_outcome(result: ToolResultEntry) -> tuple[str, bool]:
    status = _EXIT_STATUS.match(result.content[:OUTCOME_CLIP_CHARS])
    if status:
        return f"exit status {status[1]}", int(status[1]) != 0
    if result.is_error:
        return f"error: {_first_line(result.content, OUTCOME_CLIP_CHARS) or 'no message'}", True
    return "finished (no exit status reported)", False


def _python_outcome(result: ToolResultEntry) -> tuple[str, bool]:
    if not result.is_error:
        return "ok", False
    exceptions = list(_EXCEPTION.finditer(result.content[-EXCEPTION_SCAN_CHARS:]))
    if not exceptions:
        return f"error: {_first_line(result.content, OUTCOME_CLIP_CHARS) or 'no message'}", True
    name, message = exceptions[-1][1], exceptions[-1][2].strip()
    return _one_line(f"{name}: {message}" if message else name, OUTCOME_CLIP_CHARS), True


@dataclass
class _Run:
    """One distinct command or code run, with its last outcome."""

    kind: str
    display: str
    outcome: str
    failed: bool


@dataclass
class _Scan:
    """What one pass over the entries found."""

    results: dict[str, ToolResultEntry]
    user_messages: list[str] = field(default_factory=list)
    work: list[tuple[bool, str]] = field(default_factory=list)
    """(is a milestone, item) in order."""
    decisions: list[tuple[bool, str]] = field(default_factory=list)
    """(is a checkpoint note, item) in order."""
    last_assistant: str | None = None
    answered_latest_request: bool = False
    files_read: dict[str, str] = field(default_factory=dict)
    files_modified: dict[str, str] = field(default_factory=dict)
    """Path → "" when the last write to it succeeded, else a note saying it failed."""
    runs: dict[str, _Run] = field(default_factory=dict)
    last_python: str | None = None
    assigned: dict[str, None] = field(default_factory=dict)
    skills: dict[str, str] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    tool_counts: dict[str, int] = field(default_factory=dict)
    capsule_text: str | None = None

    def run(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            if isinstance(entry, MessageEntry):
                self._message(entry)
            elif isinstance(entry, ToolCallEntry):
                self._call(entry)
            elif isinstance(entry, CheckpointEntry):
                self._checkpoint(entry.kind, entry.note)
            elif isinstance(entry, SkillEntry):
                self.skills[entry.name] = entry.path
            elif isinstance(entry, CapsuleEntry):
                self.capsule_text = entry.content

    def _message(self, entry: MessageEntry) -> None:
        if entry.role == "user":
            self.user_messages.append(entry.content)
            self.answered_latest_request = False
        elif entry.role == "assistant" and entry.content.strip():
            self.last_assistant = entry.content
            self.answered_latest_request = True
            self.work.append((False, _bullet(_first_line(entry.content, ITEM_CLIP_CHARS))))
            for sentence in _SENTENCE_BREAK.split(entry.content[:DECISION_SCAN_CHARS]):
                if _DECISION.search(sentence):
                    self.decisions.append((False, _bullet(_one_line(sentence, ITEM_CLIP_CHARS))))

    def _checkpoint(self, kind: str, note: str) -> None:
        text = _one_line(note, ITEM_CLIP_CHARS * 2)
        if not text:
            return
        if kind == "milestone":
            self.work.append((True, _bullet(f"Milestone: {text}")))
        elif kind == "plan_pivot":
            self.decisions.append((True, _bullet(f"Plan pivot: {text}")))
        elif kind == "user":
            self.decisions.append((True, _bullet(f"User checkpoint: {text}")))

    def _record_run(self, kind: str, key: str, display: str, outcome: tuple[str, bool]) -> None:
        self.runs.pop(key, None)
        self.runs[key] = _Run(kind, display, *outcome)

    def _call(self, call: ToolCallEntry) -> None:
        self.tool_counts[call.name] = self.tool_counts.get(call.name, 0) + 1
        arguments = _arguments(call.arguments)
        result = self.results.get(call.call_id)
        ok = result is None or not result.is_error
        if result is None:
            self.pending.append(_bullet(f"tool call {call.name} ({call.call_id}) has no result yet"))
        if call.name in ("read_file", "list_files"):
            if path := _text_argument(arguments, "path"):
                self.files_read[path] = path if call.name == "read_file" else f"{path} (listed)"
        elif call.name in ("write_file", "edit_file"):
            if path := _text_argument(arguments, "path"):
                self._modified(path, "" if ok else "write failed")
        elif call.name == "shell":
            command = _text_argument(arguments, "command")
            display = f"shell {_code_span(_code_display(command, SHELL_COMMAND_CLIP_CHARS))}"
            self._record_run("shell", "shell " + command, display, _shell_outcome(result) if result else ("no result recorded", False))
            for path in _paths_written(command, _SHELL_WRITES):
                self._modified(path, "" if ok else "the command writing it failed")
        elif call.name == "python":
            code = _text_argument(arguments, "code")
            display = f"python {_code_span(_code_display(code, PYTHON_CODE_CLIP_CHARS))}"
            self._record_run("python", "python " + code, display, _python_outcome(result) if result else ("no result recorded", False))
            self.last_python = "python " + code
            for path in _paths_written(code, _CODE_WRITES):
                self._modified(path, "" if ok else "the code writing it failed")
            for match in _ASSIGNMENT.finditer(code):
                for name in match[1].split(","):
                    if not name.strip().startswith("_"):
                        self.assigned.pop(name.strip(), None)
                        self.assigned[name.strip()] = None
        elif call.name == "checkpoint":
            self._checkpoint(_text_argument(arguments, "kind"), _text_argument(arguments, "note"))

    def _modified(self, path: str, failure: str) -> None:
        self.files_modified.pop(path, None)
        self.files_modified[path] = failure


def _select(pairs: list[tuple[bool, str]], newest: int) -> list[str]:
    """Items flagged True always, plus the newest `newest` of the others, in order."""
    others = [index for index, (always, _) in enumerate(pairs) if not always]
    keep = set(others[-newest:]) if newest else set()
    return [item for index, (always, item) in enumerate(pairs) if always or index in keep]


def _run_key(item: str) -> str:
    text = _strip_marker(item)
    match = re.match(r"^(?:shell|python) (?:`` .*? ``|`[^`]*`)", text)
    return match[0] if match else " ".join(text.rsplit(" → ", 1)[0].split())


# --- sections ----------------------------------------------------------------------------

CLIPPED_REQUEST_NOTE = "(clipped here; the whole request is in the recent messages after this capsule)"


def _decompose_goal(body: str) -> tuple[str | None, list[str], list[str], str]:
    """(latest request, earlier requests, constraints, carried text) of a goal section this
    module wrote; a goal in any other layout is carried over whole."""
    if not body:
        return None, [], [], ""
    request = None
    rest = body
    if block := _REQUEST_BLOCK.match(body):
        request, rest = block["text"], body[block.end() :]
    head, carried = rest, ""
    marker = CARRIED_LABEL + "\n"
    at = 0 if rest.startswith(marker) else rest.find("\n" + marker) + 1
    if rest.startswith(marker) or at > 0:
        head, carried = rest[:at], rest[at + len(marker) :].strip()
    earlier: list[str] = []
    constraints: list[str] = []
    target: list[str] | None = None
    for line in head.split("\n"):
        stripped = line.strip()
        if not stripped or stripped == CLIPPED_REQUEST_NOTE:
            continue
        if stripped in (EARLIER_REQUESTS_LABEL, CONSTRAINTS_LABEL):
            target = earlier if stripped == EARLIER_REQUESTS_LABEL else constraints
        elif target is not None and _ITEM_MARKER.match(line):
            target.append(line)
        else:
            return None, [], [], body
    return request, earlier, constraints, carried


def _constraints(messages: Iterable[str]) -> list[str]:
    found = []
    for message in messages:
        for sentence in _SENTENCE_BREAK.split(message[:CONSTRAINT_SCAN_CHARS]):
            if _CONSTRAINT.search(sentence):
                found.append(_bullet(_one_line(sentence, ITEM_CLIP_CHARS)))
    return found


def _goal(scan: _Scan, kept_requests: list[str], previous_body: str, latest_whole: bool) -> str:
    old_request, earlier, constraints, carried = _decompose_goal(previous_body)
    earlier_source = [*scan.user_messages, *kept_requests]
    request: str | None = None
    note = ""
    if kept_requests or (scan.user_messages and latest_whole):
        request = earlier_source.pop()
        if kept_requests and len(request) > KEPT_REQUEST_QUOTE_LIMIT_CHARS:
            request, note = request[:KEPT_REQUEST_QUOTE_LIMIT_CHARS], CLIPPED_REQUEST_NOTE
    if old_request is not None:
        if request is None and not earlier_source:
            request = old_request  # no newer request: the previous one is still the latest
        else:
            earlier = [*earlier, _bullet(_one_line(old_request, REQUEST_CLIP_CHARS))]
    newest = earlier_source[-EARLIER_REQUESTS_KEPT:] if latest_whole else earlier_source[-EARLIER_REQUESTS_KEPT - 1 :]
    earlier = _cap(_merge(earlier, [_bullet(_one_line(m, REQUEST_CLIP_CHARS)) for m in newest if m.strip()]), EARLIER_REQUESTS_MAX)
    constraints = _cap(_merge(constraints, _constraints(scan.user_messages)), CONSTRAINTS_MAX)
    parts = []
    if request is not None:
        parts.append(f"{LATEST_REQUEST_LABEL}\n\n{_fenced(request)}" + (f"\n{note}" if note else ""))
    if earlier:
        parts.append(EARLIER_REQUESTS_LABEL + "\n" + "\n".join(earlier))
    if constraints:
        parts.append(CONSTRAINTS_LABEL + "\n" + "\n".join(constraints))
    if carried:
        parts.append(f"{CARRIED_LABEL}\n{carried}")
    return "\n\n".join(parts)


def _kernel_state(scan: _Scan, given: Sequence[str], previous: list[str]) -> list[str]:
    names: list[str] = []
    others: list[str] = []
    for item in previous:
        if _strip_marker(item).startswith(ASSIGNED_NAMES_PREFIX):
            names.extend(_BACKTICK_NAME.findall(item))
        else:
            others.append(item)
    items = _merge(others, [_bullet(line.strip()) for line in given if line.strip()], _kernel_key)
    described = {_kernel_key(item) for item in items}
    names = [n for n in _merge(names, scan.assigned, lambda n: n) if n not in described]
    names = names[-ASSIGNED_NAMES_MAX:]
    if names:
        items.append(_bullet(f"{ASSIGNED_NAMES_PREFIX} " + ", ".join(f"`{n}`" for n in names)))
    return items


def _blockers(scan: _Scan, previous: list[str]) -> list[str]:
    resolved = {_run_key(run.display) for run in scan.runs.values() if not run.failed}
    failing = [
        _bullet(f"{run.display} last failed: {run.outcome}")
        for key, run in scan.runs.items()
        if run.failed and (run.kind == "shell" or key == scan.last_python)
    ]
    merged = _merge(previous, failing, _run_key)
    return _cap([item for item in merged if _run_key(item) not in resolved], BLOCKERS_MAX)


def _in_progress(scan: _Scan, kept_requests: list[str]) -> list[str]:
    if kept_requests or not scan.user_messages:
        return []
    if scan.answered_latest_request and scan.last_assistant is not None:
        return [_bullet(f"Latest step: {_first_line(scan.last_assistant, ITEM_CLIP_CHARS)}")]
    return [_bullet("Working on the latest user request (quoted under Goal and constraints)")]


def _next_steps(scan: _Scan) -> list[str]:
    if scan.last_assistant is None:
        return []
    lines = [s for s in scan.last_assistant[:DECISION_SCAN_CHARS].splitlines() if _NEXT_STEP.match(s)]
    return [_bullet(_one_line(_strip_marker(s), ITEM_CLIP_CHARS)) for s in lines[-NEXT_STEPS_NEW_MAX:]]


def _tool_summary(scan: _Scan) -> list[str]:
    if not scan.tool_counts:
        return []
    counts = ", ".join(f"{name} ×{n}" for name, n in sorted(scan.tool_counts.items()))
    return [_bullet(f"Tool calls in this stretch: {sum(scan.tool_counts.values())} ({counts})")]


def build_deterministic_capsule(
    entries: Sequence[Entry],
    *,
    previous: Capsule | None = None,
    kept: Sequence[Entry] = (),
    kernel_state: Sequence[str] = (),
    latest_request_whole: bool = True,
) -> Capsule:
    """A capsule of `entries` built without a model.

    `previous`: the capsule being rolled up (when None, the last capsule entry among
    `entries` is used); its items come first in every section. `kept`: the kept tail that
    follows, read for tool results and for the latest user request (quoted whole, or
    clipped with a note when it is long, since the tail carries it whole). `kernel_state`:
    lines such as `df: DataFrame 120000×14`. `latest_request_whole=False` clips the latest
    request like the earlier ones (for an extract whose request is shown elsewhere).
    """
    results = {e.call_id: e for e in (*entries, *kept) if isinstance(e, ToolResultEntry)}
    scan = _Scan(results)
    scan.run(entries)
    if previous is None and scan.capsule_text is not None:
        previous = parse_capsule(scan.capsule_text, require_all=False)
    prior = previous or Capsule()

    def items(field_name: str) -> list[str]:
        return section_items(str(getattr(prior, field_name)))

    kept_requests = [e.content for e in kept if isinstance(e, MessageEntry) and e.role == "user"]
    modified = [_bullet(f"{p} ({failure})" if failure else p) for p, failure in scan.files_modified.items()]
    outputs = [
        _bullet(p)
        for p, failure in scan.files_modified.items()
        if not failure and p.rsplit(".", 1)[-1].lower() in OUTPUT_EXTENSIONS
    ]
    work = [*_select(scan.work, WORK_DONE_NEW_LINES), *_tool_summary(scan)]
    return Capsule(
        goal_and_constraints=_goal(scan, kept_requests, prior.goal_and_constraints, latest_request_whole),
        work_done=_body(_cap(_merge(items("work_done"), work), NARRATIVE_MAX_ITEMS)),
        in_progress=_body(_cap(_merge(items("in_progress"), _in_progress(scan, kept_requests)), NARRATIVE_MAX_ITEMS)),
        pending=_body(_cap(_merge(items("pending"), scan.pending), NARRATIVE_MAX_ITEMS)),
        decisions=_body(_cap(_merge(items("decisions"), _select(scan.decisions, DECISIONS_NEW_MAX)), NARRATIVE_MAX_ITEMS)),
        blockers=_body(_blockers(scan, items("blockers"))),
        next_steps=_body(_cap(_merge(items("next_steps"), _next_steps(scan)), NARRATIVE_MAX_ITEMS)),
        files_read=_body(_merge(items("files_read"), map(_bullet, scan.files_read.values()), _path_key)),
        files_modified=_body(_merge(items("files_modified"), modified, _path_key)),
        verification=_body(
            _merge(items("verification"), [_bullet(f"{r.display} → {r.outcome}") for r in scan.runs.values()], _run_key)
        ),
        active_skills=_body(_merge(items("active_skills"), [_bullet(f"{n} ({p})") for n, p in scan.skills.items()], _path_key)),
        kernel_state=_body(_kernel_state(scan, kernel_state, items("kernel_state"))),
        artifacts=_body(_merge(items("artifacts"), outputs, _path_key)),
        extra_sections=list(prior.extra_sections),
    )
