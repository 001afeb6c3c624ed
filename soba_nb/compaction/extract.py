"""One pass over transcript entries for the deterministic capsule (`deterministic.py`):
the user requests, assistant first lines and decisions, checkpoints, skills, and from the
tool calls the files read and written, the commands and code run with their last outcome,
and the names python code assigned.

Regular expressions only (no tokenizing, no parsing of code), so a 200k-token history
scans in milliseconds. Best effort where it reads code: paths written by
`df.to_csv("x")`, `open("x", "w")`, `savefig("x")`, shell redirections; names assigned at
the top level of python code.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from soba_nb.text import clip, first_line, one_line
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
from soba_nb.transcript.pairing import results_by_call

ITEM_CLIP_CHARS = 200
DECISION_SCAN_CHARS = 4000
SHELL_COMMAND_CLIP_CHARS = 300
PYTHON_CODE_CLIP_CHARS = 120
OUTCOME_CLIP_CHARS = 160
EXCEPTION_SCAN_CHARS = 4000
OUTPUT_LINES = 3
"""A run's key output in Verification: the first lines it printed, at most this many..."""
OUTPUT_CLIP_CHARS = 140
"""... and this many characters (results are the state of data work: `ok: 14`). Every run
listed pays it, in every capsule and in the extract of older history a summary request
carries (100 runs: ~3,500 tokens more at most)."""
OUTPUT_SCAN_CHARS = 4000
NO_OUTPUT = "(no output)"
"""The python tool's whole result text when the code printed and returned nothing."""
CONSTRAINT_SCAN_CHARS = 20_000
NOT_FILES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})

_PATH = r"""[rRbBuU]?(?P<q>['"])(?P<path>[^'"\n]+)(?P=q)"""


@dataclass(frozen=True)
class Needing:
    """A case-sensitive pattern and the substrings one of which every match contains: a text
    with none of them is not searched (most code and commands write no file)."""

    pattern: re.Pattern[str]
    needs: tuple[str, ...]

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        if any(need in text for need in self.needs):
            yield from self.pattern.finditer(text)


_CODE_WRITES = [
    Needing(
        re.compile(
            r"\.to_(?:csv|parquet|json|excel|html|pickle|feather|markdown|latex|stata|hdf|xml|orc)"
            r"\(\s*(?:\w+\s*=\s*)?" + _PATH
        ),
        (".to_",),
    ),
    Needing(
        re.compile(
            r"\b(?:savefig|write_image|write_html|savez_compressed|savez|savetxt|imwrite|to_file|save)"
            r"\(\s*(?:\w+\s*=\s*)?" + _PATH
        ),
        ("save", "write", "to_file"),
    ),
    Needing(re.compile(r"\b(?:torch\.save|joblib\.dump|pickle\.dump|dump)\([^()\n]*?,\s*" + _PATH), ("dump", "save")),
    Needing(re.compile(r"\bopen\(\s*" + _PATH + r"""\s*,\s*(?:mode\s*=\s*)?['"][^'"]*[wax+]"""), ("open(",)),
    Needing(re.compile(r"Path\(\s*" + _PATH + r"\s*\)\s*\.\s*(?:write_text|write_bytes|touch)\("), ("Path(",)),
    # Copies, moves and renames only through what moves files: `shutil.`/`os.`, a `Path(...)`
    # receiver, or a bare name imported from them (never a method: `df.replace("N/A", "x")`,
    # `.str.replace`, `s.replace("a", "b")` and `.rename(columns=...)` write no file).
    Needing(
        re.compile(
            r"(?:\bshutil\s*\.\s*|(?<![.\w])(?<!\.\s))(?:copy2?|copyfile|copytree|move)\([^,\n]*,\s*(?:dst\s*=\s*)?" + _PATH
        ),
        ("copy", "move"),
    ),
    Needing(
        re.compile(r"(?:\bos\s*\.\s*|(?<![.\w])(?<!\.\s))(?:rename|replace|renames)\([^,\n]*,\s*(?:dst\s*=\s*)?" + _PATH),
        ("rename", "replace"),
    ),
    Needing(
        re.compile(r"\bPath\(\s*[^()\n]*\)\s*\.\s*(?:rename|replace)\(\s*(?:target\s*=\s*)?" + _PATH),
        ("Path(",),
    ),
]
_SHELL_TARGET = r"""(?P<path>[^\s&|;<>()]+)"""
_SHELL_WRITES = [
    Needing(re.compile(r"(?<![0-9&<>])>>?\s*" + _SHELL_TARGET), (">",)),
    Needing(re.compile(r"\btee\s+(?:-a\s+)?" + _SHELL_TARGET), ("tee",)),
    Needing(re.compile(r"\btouch\s+" + _SHELL_TARGET), ("touch",)),
    Needing(re.compile(r"\b(?:cp|mv)\s+(?:-\w+\s+)*[^\s&|;<>()]+\s+" + _SHELL_TARGET), ("cp", "mv")),
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
_PYTHON_SECTION = re.compile(r"^(?:(?P<name>stdout|stderr):|(?P<valued>result|error): (?P<rest>.*))$")
"""A section header of the python tool's result text (`soba_nb.agent.tools.python_tool`)."""
_NUMPY_SCALAR = re.compile(r"\bnp\.(?:u?int|float|complex|bool|str)_?\d*\((?P<value>[^()]*)\)")
"""`np.int64(14)` (numpy 2's repr of a scalar) reads `14`."""
_IMAGE_NOTE = re.compile(r"^\[image \d+: ")
_TERMINAL_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(frozen=True)
class Keyed:
    """A case-insensitive pattern and case-folded stems, one of which is in every text it
    matches: a text with none of them is not searched (a few substring tests instead of a
    case-insensitive regular expression, ~20× faster on the messages that do not match)."""

    pattern: re.Pattern[str]
    stems: tuple[str, ...]

    def search(self, text: str) -> re.Match[str] | None:
        folded = text.casefold()  # (as the pattern matches: "ſ" is an "s", "K" a "k")
        for stem in self.stems:
            if stem in folded:
                return self.pattern.search(text)
        return None


_DECISION = Keyed(
    re.compile(
        r"\b(?:decided|decide to|chose|choosing|instead of|switch(?:ed|ing)? to|because|rather than)\b",
        re.IGNORECASE,
    ),
    ("decid", "chose", "choosing", "instead of", "switch", "because", "rather than"),
)
_BLOCKER = Keyed(
    re.compile(
        r"\b(?:blocked|blocker|waiting (?:on|for)|(?:has|have) not (?:yet )?(?:confirmed|approved|answered|arrived|sent)"
        r"|not (?:yet )?confirmed|(?:is|are) still (?:open|missing|pending)|cannot proceed|can['’]t proceed"
        r"|(?:is|are) missing from)\b",
        re.IGNORECASE,
    ),
    ("block", "waiting", "not", "still", "proceed", "missing"),
)
"""A sentence that says the work is held up by something outside it (stated, not a failed run)."""
_CONSTRAINT = Keyed(
    re.compile(
        r"\b(?:must|never|don['’]?t|do not|only|should|shouldn['’]t|without|always|avoid"
        r"|make sure|ensure|no more than|at most|at least|has to|have to|needs? to|required?|keep\b[^.!?\n]*?"
        r"\b(?:under|below|within|to|out|apart|aside|separate(?:ly)?)\b|in under|exclud(?:e|es|ed|ing)"
        r"|treat\b[^.!?\n]*?\bas|instead of|from now on)\b",
        re.IGNORECASE,
    ),
    ("must", "never", "don", "do not", "only", "should", "without", "always", "avoid", "make sure", "ensure",
     "no more than", "at most", "at least", "has to", "have to", "need", "require", "keep", "in under",
     "exclud", "treat", "instead of", "from now on"),
)
"""A sentence of a user message that states a constraint or a decision the work must follow from
now on ("keep refunds out of revenue", "treat Unknown as a region", "exclude test orders")."""
_ARGUMENT_STRING = re.compile(r'"(?P<key>path|command|code|kind|note)"\s*:\s*(?P<value>"(?:[^"\\]|\\.)*")')


# --- small text helpers ----------------------------------------------------------------





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


def bullet(text: str) -> str:
    return f"- {text}"


# --- reading tool calls ----------------------------------------------------------------


def _arguments(raw: str) -> dict[str, Any]:
    """Tool arguments from JSON text; from a malformed text, the string fields we can read."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # a model's arguments can be nested absurdly deep
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


def _paths_written(text: str, patterns: Sequence[Needing]) -> list[str]:
    found: dict[str, None] = {}
    for pattern in patterns:
        for match in pattern.finditer(text):
            path = match["path"].strip("'\"")
            if _looks_like_path(path):
                found[path] = None
    return list(found)


def _printed(lines: Iterable[str]) -> str:
    """The key output among `lines`: the first `OUTPUT_LINES` that say something, control
    characters and terminal sequences removed, on one line (` ⏎ ` between lines), clipped."""
    kept: list[str] = []
    for raw in lines:
        line = " ".join(_CONTROL.sub("", _TERMINAL_SEQUENCE.sub("", raw)).split())
        if line and not _IMAGE_NOTE.match(line):
            kept.append(line)
            if len(kept) == OUTPUT_LINES:
                break
    return clip(" ⏎ ".join(kept), OUTPUT_CLIP_CHARS)


def _python_sections(content: str) -> dict[str, list[str]]:
    """The sections of the python tool's result text (`soba_nb.agent.tools.python_tool`):
    `stdout`, `stderr`, `result`, `error` → their lines ({} for another layout)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in content[:OUTPUT_SCAN_CHARS].splitlines():
        header = _PYTHON_SECTION.match(line)
        if header and (name := header["name"] or header["valued"]) not in sections:
            current = sections[name] = []
            if header["rest"]:
                current.append(header["rest"])
        elif current is not None:
            current.append(line)
    return sections


def _python_output(content: str) -> str:
    """What a successful python run printed (`stdout:`) and the value of its last expression
    (`result:`); stderr (warnings, progress bars) only when it wrote nothing else."""
    sections = _python_sections(content)
    if not sections:  # not the tool's layout (an older transcript, a test): its first lines
        return "" if content.strip() == NO_OUTPUT else _printed(content[:OUTPUT_SCAN_CHARS].splitlines())
    result = [_NUMPY_SCALAR.sub(r"\g<value>", line) for line in sections.get("result", [])]
    return _printed([*sections.get("stdout", []), *result]) or _printed(sections.get("stderr", []))


def _with_output(outcome: str, output: str) -> str:
    return f"{outcome}: {output}" if output else outcome


def _shell_outcome(result: ToolResultEntry) -> tuple[str, bool]:
    status = _EXIT_STATUS.match(result.content[:OUTCOME_CLIP_CHARS])
    if status:
        output = _printed(result.content[:OUTPUT_SCAN_CHARS].splitlines()[1:])
        return _with_output(f"exit status {status[1]}", output), int(status[1]) != 0
    if result.is_error:
        return f"error: {first_line(result.content, OUTCOME_CLIP_CHARS) or 'no message'}", True
    return "finished (no exit status reported)", False


def _python_outcome(result: ToolResultEntry) -> tuple[str, bool]:
    if not result.is_error:
        return _with_output("ok", _python_output(result.content)), False
    if error := _python_sections(result.content).get("error"):  # `error: KeyError: 'region'`
        return one_line(error[0], OUTCOME_CLIP_CHARS) or "error", True
    exceptions = list(_EXCEPTION.finditer(result.content[-EXCEPTION_SCAN_CHARS:]))
    if not exceptions:
        return f"error: {first_line(result.content, OUTCOME_CLIP_CHARS) or 'no message'}", True
    name, message = exceptions[-1][1], exceptions[-1][2].strip()
    return one_line(f"{name}: {message}" if message else name, OUTCOME_CLIP_CHARS), True


# --- the scan ----------------------------------------------------------------------------


@dataclass
class Run:
    """One distinct command or code run, with its last outcome."""

    kind: str
    display: str
    outcome: str
    failed: bool


def _sentences_matching(pattern: Keyed, text: str, scan_chars: int = DECISION_SCAN_CHARS) -> list[str]:
    """The sentences of `text`'s head that `pattern` finds something in, as bullets. Most
    messages have none: one search of the whole head decides before any split."""
    head = text[:scan_chars]
    if pattern.search(head) is None:
        return []
    return [bullet(one_line(s, ITEM_CLIP_CHARS)) for s in SENTENCE_BREAK.split(head) if pattern.search(s)]


@dataclass
class Scan:
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
    runs: dict[str, Run] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    """Images the calls displayed: artifact path → how the capsule lists it, newest last."""
    last_python: str | None = None
    assigned: dict[str, None] = field(default_factory=dict)
    skills: dict[str, str] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    stated_blockers: list[str] = field(default_factory=list)
    """Sentences of user or assistant messages that say the work is held up (`_BLOCKER`)."""
    constraints: list[str] = field(default_factory=list)
    """Sentences of user messages that state a constraint (`_CONSTRAINT`), as bullets."""
    tool_counts: dict[str, int] = field(default_factory=dict)
    capsule_text: str | None = None
    older_left_out: list[str] = field(default_factory=list)
    """Fields (`runs`, `files_read`, ...) a snapshot kept only the newest of."""

    def run(self, entries: Iterable[Entry]) -> None:
        entries = entries if isinstance(entries, Sequence) else list(entries)
        # By their order: a server may give every answer's first call the id `call_0`.
        paired = results_by_call(entries)
        for entry in entries:
            if isinstance(entry, MessageEntry):
                self._message(entry)
            elif isinstance(entry, ToolCallEntry):
                self._call(entry, paired.get(entry.id) or self.results.get(entry.call_id))
            elif isinstance(entry, CheckpointEntry):
                self._checkpoint(entry.kind, entry.note)
            elif isinstance(entry, SkillEntry):
                self.skills[entry.name] = entry.path
            elif isinstance(entry, CapsuleEntry):
                self.capsule_text = entry.content
            elif isinstance(entry, CellsEntry):
                self._cell_images(entry)

    def _cell_images(self, entry: CellsEntry) -> None:
        """The user's plots (SPEC §15) are artifacts like the calls' own: a capsule names them."""
        for record in entry.cells:
            for image in record.images or ():
                count = "" if record.execution_count is None else f" In [{record.execution_count}]"
                self.artifacts.pop(image.path, None)
                self.artifacts[image.path] = f"{image.path} ({image.width}×{image.height} image displayed by the user's cell{count})"

    def _message(self, entry: MessageEntry) -> None:
        if entry.role in ("user", "assistant"):
            self._stated_blockers(entry.content)
        if entry.role == "user":
            # What the user typed, not soba's expansion of it (`/fix`: a template around a
            # traceback, whose instructions are soba's words, never the user's constraints).
            said = entry.typed if entry.typed is not None else entry.content
            self.user_messages.append(said)
            self.constraints += _sentences_matching(_CONSTRAINT, said, CONSTRAINT_SCAN_CHARS)
            self.answered_latest_request = False
        elif entry.role == "assistant" and entry.content.strip():
            # Taken as the answer that ends the turn until a tool call follows it: then it was
            # the narration of a step ("Looking at the amounts by region first"), and `_call`
            # takes its Work done item back (the flag and the item survive a snapshot).
            self.last_assistant = entry.content
            self.answered_latest_request = True
            self.work.append((False, bullet(first_line(entry.content, ITEM_CLIP_CHARS))))
            self.decisions += [(False, item) for item in _sentences_matching(_DECISION, entry.content)]

    def _step_not_answer(self) -> None:
        """The assistant message before this tool call was a step, not the turn's answer: it
        is no Work done item, and the latest request is not answered yet."""
        if not self.answered_latest_request or self.last_assistant is None:
            return
        self.answered_latest_request = False
        item = (False, bullet(first_line(self.last_assistant, ITEM_CLIP_CHARS)))
        for index in range(len(self.work) - 1, -1, -1):
            if self.work[index] == item:
                del self.work[index]
                break

    def _stated_blockers(self, text: str) -> None:
        self.stated_blockers += _sentences_matching(_BLOCKER, text)

    def _checkpoint(self, kind: str, note: str) -> None:
        text = one_line(note, ITEM_CLIP_CHARS * 2)
        if not text:
            return
        if kind == "milestone":
            self.work.append((True, bullet(f"Milestone: {text}")))
        elif kind == "plan_pivot":
            self.decisions.append((True, bullet(f"Plan pivot: {text}")))
        elif kind == "user":
            self.decisions.append((True, bullet(f"User checkpoint: {text}")))

    def _record_run(self, kind: str, key: str, display: str, outcome: tuple[str, bool]) -> None:
        self.runs.pop(key, None)
        self.runs[key] = Run(kind, display, *outcome)

    def _call(self, call: ToolCallEntry, result: ToolResultEntry | None) -> None:
        self._step_not_answer()
        self.tool_counts[call.name] = self.tool_counts.get(call.name, 0) + 1
        arguments = _arguments(call.arguments)
        if result is not None and result.artifacts:
            for artifact in result.artifacts:
                self.artifacts.pop(artifact.path, None)
                self.artifacts[artifact.path] = (
                    f"{artifact.path} ({artifact.width}×{artifact.height} image displayed by {call.name} call {call.call_id})"
                )
        ok = result is None or not result.is_error
        if result is None:
            self.pending.append(bullet(f"tool call {call.name} ({call.call_id}) has no result yet"))
        if call.name in ("read_file", "list_files"):
            if path := _text_argument(arguments, "path"):
                self.files_read.pop(path, None)  # (the order is of the last read: the newest last)
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


@dataclass(frozen=True)
class Start:
    """Where a scan of a region starts: `covered` entries already read into `scan`."""

    covered: int
    scan: Scan
    unanswered: tuple[str, ...] = ()


def fresh_start(entries: Sequence[Entry]) -> Start:
    """A scan from the region's first entry (no snapshot)."""
    return Start(0, Scan({e.call_id: e for e in entries if type(e) is ToolResultEntry}))
