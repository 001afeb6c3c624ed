"""An obedient summary model for the continuation benchmark: it stands for a strong model that
follows the summary prompt to the letter, so a capsule's faults can be traced to the prompt.

It reads only what soba sends it (the system prompt and the user message) and writes the 13
sections by these rules, each switched on or off by the prompt's own words:

- headings: the lines of the system prompt that start with "## ", in order;
- `quote latest`: when the prompt says "quote the latest user request", the Goal section opens
  with "Latest user request (verbatim):" and that request fenced: the <latest_user_request>
  block when the message has one, else the last `[user]` entry of the history (as rendered:
  what the user typed, which is soba's expansion when the history does not say otherwise);
- the overall goal: the first sentence of the first `[user]` entry;
- constraints and decisions ("every constraint the user stated", "each with its reason"): the
  sentences of `[user]` entries (never soba's `[soba sent it to the model as]` expansion) that
  are not questions and state a rule (keep, leave, use, treat, drop, never, only, without, from
  now on, …); a decision is such a sentence that also gives its reason (a comma, a dash, "because");
- `ban values`: when the prompt forbids "the values of variables", no line it copies from a
  tool result or an answer holds a digit (an answer's sentence with one becomes "done");
- `keep figures`: when the prompt says "keep the figures", each request's work lists the
  printed lines of its results that hold a figure, up to `FIGURE_LINES_MAX` per request, leaving
  out rows of tables ("raw data dumps") and stderr;
- Work done: per `[user]` request, its first line and the first sentence of the answer;
- In progress: the last request when the history ends before an answer to it, with the last step;
- files: read from the code of `python` calls (`read_csv("x")`, `open("x")`) and written by it
  (`to_csv`, `savefig`, `open(..., "w")`, …); a careless reader also takes the new value of
  `.replace(old, new)` and `.rename(...)` as a written path unless the prompt says "real" paths;
- Verification: each python call with its outcome (its error line; with `keep figures` its first
  figure line, with `ban values` "ok");
- Artifacts: the written paths with an output extension; Kernel state: "(filled in by soba)";
- Active skills, Pending, Blockers: "(none)"; Next steps: finishing the request in progress.

Only `SummaryOutput` is imported from soba_nb, when a summary is asked for, so the same model
serves today's code and the revision before issue 38 (run in another process).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

FIGURE_LINES_MAX = 8
HEAD_CHARS = 120
_ENTRY = re.compile(
    r"^\[(user|assistant|soba sent it to the model as|tool call [\w-]+|tool result [\w-]+(?:, error)?|checkpoint \w+|notebook|skill activated)\] ?",
    re.MULTILINE,
)
_RULE_WORDS = re.compile(
    r"\b(keep|leave|use|uses|treat|drop|don't|do not|never|always|only|without|from now on|must|run|runs)\b", re.IGNORECASE
)
_REASON = re.compile(r",|—| - |\bbecause\b|\bsince\b|\bas\b", re.IGNORECASE)
_READS = re.compile(r"""\b(?:read_csv|read_parquet|read_excel|read_json|open)\(\s*["']([^"']+)["']""")
_WRITES = re.compile(
    r"""\b(?:to_csv|to_parquet|to_excel|to_json|savefig|to_pickle)\(\s*["']([^"']+)["']"""
    r"""|\bopen\(\s*["']([^"']+)["']\s*,\s*["'][wax]"""
)
_CARELESS = re.compile(r"""\.(?:replace|rename)\(\s*["'][^"']*["']\s*,\s*["']([^"']+)["']""")
OUTPUT_EXTENSIONS = (".png", ".jpg", ".svg", ".pdf", ".csv", ".parquet", ".xlsx", ".json", ".html")


@dataclass(frozen=True)
class Rules:
    """What the system prompt asks, read from its words."""

    headings: tuple[str, ...]
    quote_latest: bool
    ban_values: bool
    keep_figures: bool
    real_paths_only: bool


def read_rules(system: str) -> Rules:
    lowered = " ".join(system.lower().split())
    return Rules(
        headings=tuple(line[3:].strip() for line in system.splitlines() if line.startswith("## ")),
        quote_latest="quote the latest user request" in lowered,
        ban_values="values of variables" in lowered,
        keep_figures="keep the figures" in lowered,
        real_paths_only="real file path" in lowered or "only real paths" in lowered,
    )


@dataclass
class Entry:
    marker: str
    text: str


def parse_history(user: str) -> list[Entry]:
    """The `[marker] text` entries of the <history> block."""
    start, end = user.find("<history>\n"), user.rfind("\n</history>")
    body = user[start + len("<history>\n") : end] if start >= 0 and end > start else ""
    matches = list(_ENTRY.finditer(body))
    entries = []
    for index, match in enumerate(matches):
        stop = matches[index + 1].start() if index + 1 < len(matches) else len(body)
        entries.append(Entry(match.group(1), body[match.end() : stop].strip()))
    return entries


def _block(user: str, tag: str) -> str | None:
    match = re.search(rf"<{tag}>\n(.*?)\n</{tag}>", user, re.DOTALL)
    return match.group(1) if match else None


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s.strip()]


def _code(entry: Entry) -> str:
    try:
        arguments = json.loads(entry.text)
    except ValueError:
        return entry.text
    return str(arguments.get("code", "")) if isinstance(arguments, dict) else ""


def _is_table_row(line: str) -> bool:
    words = line.split()
    numeric = sum(bool(re.fullmatch(r"[-+]?[\d.,:%-]+", word)) for word in words)
    return len(words) >= 2 and (numeric >= len(words) - 1 or bool(re.match(r"^\s*\d+\s{2,}", line)))


def figure_lines(result: str) -> list[str]:
    """Printed lines holding a figure: stdout and the result line, not stderr, not table rows."""
    lines, section = [], "stdout"
    for line in result.splitlines():
        if line in ("stdout:", "stderr:"):
            section = line[:-1]
            continue
        if line.startswith("result: "):
            section, line = "result", line[len("result: ") :]
        if section == "stderr" or not re.search(r"\d", line) or _is_table_row(line) or len(line) > 160:
            continue
        lines.append(line.strip())
    return lines


@dataclass
class Turn:
    request: str
    results: list[str]
    codes: list[str]
    answer: str | None = None
    last_step: str | None = None


def _turns(history: list[Entry]) -> list[Turn]:
    turns: list[Turn] = []
    for entry in history:
        if entry.marker == "user":
            turns.append(Turn(entry.text, [], []))
        elif not turns:
            continue
        elif entry.marker.startswith("tool call python"):
            turns[-1].codes.append(_code(entry))
            turns[-1].answer = None
        elif entry.marker.startswith("tool result python"):
            turns[-1].results.append(entry.text)
        elif entry.marker == "assistant":
            turns[-1].answer, turns[-1].last_step = entry.text, entry.text
        elif entry.marker.startswith("tool call"):
            turns[-1].answer = None
    return turns


def _bullets(items: list[str]) -> str:
    items = list(dict.fromkeys(item for item in items if item))
    return "\n".join(f"- {item}" for item in items) if items else "(none)"


def _head(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= HEAD_CHARS else line[: HEAD_CHARS - 1] + "…"


def _no_digits(text: str, rules: Rules) -> bool:
    return not (rules.ban_values and re.search(r"\d", text))


def write_capsule(system: str, user: str) -> str:
    """The capsule Markdown an obedient model writes for this prompt (rules in the docstring)."""
    rules = read_rules(system)
    history = parse_history(user)
    turns = _turns(history)
    said = [entry.text for entry in history if entry.marker == "user"]
    goal: list[str] = []
    if rules.quote_latest:
        latest = _block(user, "latest_user_request") or (said[-1] if said else "")
        goal.append(f"Latest user request (verbatim):\n\n```\n{latest}\n```")
    if said:
        goal.append(f"Overall goal: {_sentences(said[0])[0]}")
    rule_sentences = [s for text in said for s in _sentences(text) if not s.endswith("?") and _RULE_WORDS.search(s)]
    constraints = [s for s in rule_sentences if s != (_sentences(said[0])[0] if said else "")]
    if constraints:
        goal.append("Constraints the user stated:\n" + _bullets(constraints))
    work, verification, reads, writes = [], [], [], []
    for turn in turns:
        answer = _sentences(turn.answer)[0] if turn.answer and _sentences(turn.answer) else ""
        outcome = answer if answer and _no_digits(answer, rules) else ("done" if turn.answer else "not finished")
        item = f"{_head(turn.request)}: {outcome}"
        if rules.keep_figures:
            figures = [line for result in turn.results for line in figure_lines(result)][:FIGURE_LINES_MAX]
            item += "".join(f"\n  - {line}" for line in figures)
        work.append(item)
        for code, result in zip(turn.codes, turn.results, strict=False):
            error = next((line for line in result.splitlines() if line.startswith("error: ")), None)
            shown = figure_lines(result) if rules.keep_figures else []
            check = error or (shown[0] if shown and _no_digits(shown[0], rules) else "ok")
            verification.append(f"`{_head(code)}` → {check}")
            reads += _READS.findall(code)
            writes += [a or b for a, b in _WRITES.findall(code)]
            if not rules.real_paths_only:
                writes += _CARELESS.findall(code)
    open_turn = turns[-1] if turns and turns[-1].answer is None else None
    in_progress = [f"{_head(open_turn.request)}: {_head(open_turn.last_step or 'started')}"] if open_turn else []
    bodies = {
        "Goal and constraints": "\n\n".join(goal) or "(none)",
        "Work done": _bullets(work),
        "In progress": _bullets(in_progress),
        "Decisions": _bullets([s for s in constraints if _REASON.search(s)]),
        "Next steps": _bullets([f"finish: {_head(open_turn.request)}"] if open_turn else []),
        "Files read": _bullets(reads),
        "Files modified": _bullets(writes),
        "Verification": _bullets(verification),
        "Kernel state": "(filled in by soba)",
        "Artifacts": _bullets([path for path in writes if path.lower().endswith(OUTPUT_EXTENSIONS)]),
    }
    return "\n\n".join(f"## {heading}\n\n{bodies.get(heading, '(none)')}" for heading in rules.headings) + "\n"


@dataclass
class ObedientSummarizer:
    """The `Summarizer` interface (soba_nb.compaction.summarizer) over `write_capsule`."""

    model: str = "obedient-scripted"
    provider: str = "benchmark"

    def __post_init__(self) -> None:
        self.calls: list[dict[str, str]] = []

    def summarize(self, system: str, user: str, **_: Any) -> Any:
        from soba_nb.compaction.summarizer import SummaryOutput

        self.calls.append({"system": system, "user": user})
        return SummaryOutput(write_capsule(system, user), "stop", False, self.model, self.provider)
