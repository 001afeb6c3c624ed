"""After a kernel restart: notice the variables that are gone, and rebuild them on request.

The variables live in the kernel, the session in the transcript; a restart keeps the one and
loses the other. Before each turn `kernel_note` compares what the session says should exist —
the variables the agent's `python` calls built or read (`provenance`: for each, the last step
that assigned it, the user's recorded cell or the agent's call) and those the latest capsule's
`## Kernel state` names — with the namespace. Anything missing is said once, in the cell and to
the model (a `system` message), telling the user's variables from the agent's: "kernel was
restarted: monthly, sales are gone; monthly was built by the agent's python call `monthly =
sales.groupby('month')…`, sales was built by your cell In [3]. `%soba /rebuild` re-runs In [3],
then the call `monthly = …`." — a call named by its code, as its receipt showed it (neither
the user nor the model ever sees an entry id) — so neither works on a `df` that is not there,
and nobody is told the agent made `sales`.

`%soba /rebuild` (`rebuild`) re-runs the recorded code in the order it first ran: the step —
the user's cell (its whole source from the `cell_sources` entries, soba's magic lines left out)
or the agent's call — that last assigned each missing variable, and, before it, those that built
the missing variables it reads. Each run is a real `python` run with its receipt and transcript
entries; the first error stops the rebuild and names the step, and a name no recorded cell or
call built is named with what to do (run the cell that makes it first).
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from soba_nb.agent.events import AgentEvent, Notice, ToolFinished, ToolStarted
from soba_nb.agent.provenance import REBUILD_PREFIX, Provenance, PythonCall
from soba_nb.agent.receipts import result_preview
from soba_nb.agent.session import AgentSession
from soba_nb.agent.tools import ToolContext, ToolOutcome, run_tool, summarize_arguments
from soba_nb.compaction.capsule import CapsuleFormatError, parse_capsule
from soba_nb.transcript.entries import (
    CellSource,
    CellSourcesEntry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
)
from soba_nb.transcript.store import Transcript

MAX_NAMES_SHOWN = 8
"""Names listed in a note; the rest are counted."""
ERROR_CHARS = 200
_CAPSULE_VARIABLE = re.compile(r"^\s*[-*]\s+`?([A-Za-z_][A-Za-z0-9_]*)`?\s*:")


def missing_variables(session: AgentSession) -> list[str]:
    """Variables the session says should exist that the kernel does not have, in the order
    the work used them (most recent first), then those only the latest capsule names."""
    provenance = session.provenance()
    builders = provenance.builders
    # Imports are how the work was done, not what it made: `/rebuild` restores them as needed.
    expected = [name for name in provenance.ranked() if name in builders and name not in builders[name].imported]
    expected += capsule_variables(session)
    namespace = session.namespace
    return [name for name in dict.fromkeys(expected) if name not in namespace]


def capsule_variables(session: AgentSession) -> list[str]:
    """The variables the latest capsule's `## Kernel state` lists (`- name: …` lines), when
    this session wrote it."""
    capsules = session.capsules()
    if not capsules or capsules[-1].source is not None:
        return []  # a loaded capsule describes another kernel: its variables were never here
    try:
        body = parse_capsule(capsules[-1].content).kernel_state
    except CapsuleFormatError:
        return []
    return [m.group(1) for line in body.splitlines() if (m := _CAPSULE_VARIABLE.match(line))]


def kernel_note(session: AgentSession, *, restarted: bool, for_model: bool = False) -> str | None:
    """What to tell the user (or, `for_model`, the model: "the user's cell", not "your cell")
    about missing variables, or None when all are there.

    `restarted`: this is the first turn of a resumed session in this kernel process.
    """
    notes = kernel_notes(session, missing_variables(session), restarted=restarted)
    return None if notes is None else notes[1] if for_model else notes[0]


def kernel_notes(session: AgentSession, missing: list[str], *, restarted: bool) -> tuple[str, str] | None:
    """The note about `missing` for the user ("your cell") and for the model ("the user's
    cell"), worked out once; None when nothing is missing."""
    if not missing:
        return None
    provenance = session.provenance()
    builders = provenance.builders
    gone = _names(missing)
    head = f"kernel was restarted: {gone} {'is' if len(missing) == 1 else 'are'} gone" if restarted else (
        f"no longer defined in the kernel: {gone}"
    )
    agents = [name for name in missing if name in builders and builders[name].cell is None]
    users = [name for name in missing if name in builders and builders[name].cell is not None]
    unknown = [name for name in missing if name not in builders]
    steps = plan(provenance, session.namespace, missing)
    rebuild_line = f" `%soba /rebuild` re-runs {_in_order(steps)}." if steps else ""
    yourself = f" Run the cell that makes {_names(unknown)} yourself{' first' if steps else ''}." if unknown else ""

    def note(users_cell: str) -> str:
        groups = [
            (agents, "the agent's python call", [builders[name].label for name in agents]),
            (users, users_cell, [builders[name].label for name in users]),
            (unknown, "no cell or call soba recorded", []),
        ]
        alone = sum(1 for names, _, _ in groups if names) == 1  # one kind: `they were built by …`
        origins = [_origin(names, what, ids, alone=alone) for names, what, ids in groups if names]
        return f"{head}; {', '.join(origins)}.{rebuild_line}{yourself}"

    return note("your cell"), note("the user's cell")


def _origin(names: list[str], what: str, ids: list[str], *, alone: bool) -> str:
    """`monthly was built by the agent's python call 8d549dfe`, `they were built by your cells In [1], In [3]`."""
    subject = ("it was" if len(names) == 1 else "they were") if alone else f"{_names(names)} {'was' if len(names) == 1 else 'were'}"
    unique = list(dict.fromkeys(ids))
    return f"{subject} built by {what}{'s' if len(unique) > 1 else ''}" + (f" {', '.join(unique)}" if unique else "")


def _in_order(steps: list[PythonCall]) -> str:
    """`In [1], In [3], then the call `monthly = …``."""
    labels = [step.label if step.cell is not None else f"the call {step.label}" for step in steps]
    return labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])}, then {labels[-1]}"


def note_missing(session: AgentSession) -> str | None:
    """Before a turn: record and return the note about missing variables, once per change.

    The note becomes a `system` message (the model sees it as a note before the request,
    naming "the user's cell") and is shown in the cell ("your cell"); the same missing set is
    not reported twice.
    """
    names = missing_variables(session)
    missing = frozenset(names)
    if not missing:
        session.noted_missing = frozenset()
        return None
    if missing <= session.noted_missing:
        return None
    notes = kernel_notes(session, names, restarted=session.resumed and not session.noted_missing)
    session.noted_missing = missing
    if notes is None:
        return None
    session.transcript.append(MessageEntry(role="system", content=notes[1]))
    return notes[0]


@dataclass
class RebuildResult:
    """How a rebuild ended."""

    rebuilt: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """Still missing afterwards."""
    ran: list[PythonCall] = field(default_factory=list)
    """The steps re-run (the failed one included)."""
    failed: PythonCall | None = None
    error: str = ""
    """The failing step's error line (`NameError: name 'factor' is not defined`)."""

    @property
    def calls_run(self) -> int:
        return len(self.ran)
    message: str = ""


def plan(provenance: Provenance, namespace: dict[str, object], missing: list[str]) -> list[PythonCall]:
    """The steps (the user's cells, the agent's calls) to re-run for `missing` — the one that
    built each and those that changed it in place since — with those building what they read,
    in the order they ran."""
    builders = provenance.builders
    wanted: dict[int, PythonCall] = {}
    queue = [name for name in missing if name in builders]
    planned: set[str] = set()
    while queue:
        name = queue.pop()
        if name in planned:
            continue
        planned.add(name)
        # The step that built it, then those that changed it in place (`df["x"] = …`).
        for step in [builders[name], *provenance.changers.get(name, ())]:
            if id(step) not in wanted:
                wanted[id(step)] = step
                queue.extend(read for read in step.read if read not in namespace and read in builders)
    return [step for step in provenance.steps if id(step) in wanted]


def rebuild(
    session: AgentSession,
    emit: Callable[[AgentEvent], None],
    cancel: threading.Event | None = None,
    transform: Callable[[str], str] | None = None,
) -> RebuildResult:
    """Re-run the code that built the missing variables; stops at the first error. `transform`:
    the shell's input transformation (calls in IPython syntax run as they first ran)."""
    missing = missing_variables(session)
    provenance = session.provenance()
    steps = plan(provenance, session.namespace, missing)
    result = RebuildResult()
    if not missing:
        result.message = "nothing to rebuild: every variable the session built is defined"
        return result
    if not steps:
        result.missing = missing
        result.message = (
            f"nothing to rebuild: {_names(missing)} {'was' if len(missing) == 1 else 'were'} built by no cell or call "
            "soba recorded: run the cells that make them yourself"
        )
        return result
    transcript = session.transcript
    transcript.append(
        MessageEntry(
            role="system",
            content=f"kernel rebuild (%soba /rebuild): re-running {_in_order(steps)} to rebuild {_names(missing)}",
        )
    )
    ctx = ToolContext(project_root=session.project_root, namespace=session.namespace, cancel=cancel, transform=transform)
    for step in steps:
        if cancel is not None and cancel.is_set():
            break
        outcome = _rerun(step, ctx, transcript, emit)
        result.ran.append(step)
        if outcome.is_error:
            result.failed = step
            result.error = _error_line(outcome.content)
            break
    result.missing = [name for name in missing if name not in session.namespace]
    result.rebuilt = [name for name in missing if name in session.namespace]
    result.message = _outcome_line(result, len(steps), provenance)
    transcript.append(MessageEntry(role="system", content=result.message))
    emit(Notice(result.message, "error" if result.failed or result.missing else "info"))
    return result


def _rerun(step: PythonCall, ctx: ToolContext, transcript: Transcript, emit: Callable[[AgentEvent], None]) -> ToolOutcome:
    """Run `step` again, with its receipt. The agent's call is recorded as a `python` call and
    its result, as it first was; the user's cell as a `cell_sources` entry of its own (its code
    is not the agent's: a capsule must not say the agent built what it makes)."""
    call_id = f"{REBUILD_PREFIX}{secrets.token_hex(6)}"
    arguments = json.dumps({"code": step.code})
    summary = summarize_arguments("python", arguments)
    if step.cell is not None:
        summary = summary.replace("python: ", f"python: your cell {step.label} · ", 1)  # python: your cell In [1] · …
    else:
        transcript.append(ToolCallEntry(call_id=call_id, name="python", arguments=arguments))
    emit(ToolStarted(call_id, "python", summary))
    started = time.monotonic()
    try:
        outcome = run_tool("python", arguments, ctx)
    except KeyboardInterrupt:
        if step.cell is None:
            transcript.append(ToolResultEntry(call_id=call_id, name="python", content="[interrupted by the user]", is_error=True))
        raise
    duration = int((time.monotonic() - started) * 1000)
    if step.cell is None:
        transcript.append(
            ToolResultEntry(call_id=call_id, name="python", content=outcome.content, is_error=outcome.is_error, duration_ms=duration)
        )
    else:
        ran = CellSource(execution_count=step.cell, source=step.code, outcome="error" if outcome.is_error else "ok")
        transcript.append(CellSourcesEntry(cells=[ran], rerun=True))
    preview = result_preview(outcome.content)
    emit(ToolFinished(call_id, "python", summary, outcome.is_error, duration, preview))
    return outcome


def _outcome_line(result: RebuildResult, planned: int, provenance: Provenance) -> str:
    rebuilt = f"rebuilt {_names(result.rebuilt)}" if result.rebuilt else "nothing rebuilt"
    still = f"still missing: {_names(result.missing)}"
    if result.failed is not None:
        step = result.failed
        what = f"your cell {step.label}" if step.cell is not None else f"the python call {step.label}"
        hint = ""
        if (unbuilt := _NAME_ERROR.search(result.error)) is not None and unbuilt[1] not in provenance.builders:
            hint = f" — {unbuilt[1]} was built by no cell or call soba recorded: run the cell that makes it, then `%soba /rebuild` again"
        return f"rebuild stopped: the re-run of {what} failed ({len(result.ran)} of {planned} run: {result.error}); {rebuilt}; {still}{hint}"
    if len(result.ran) < planned:
        return f"rebuild cancelled after {len(result.ran)} of {planned} steps; {rebuilt}; {still}"
    ran = _ran(result.ran)
    return f"{rebuilt} ({ran} re-run); {still}" if result.missing else f"{rebuilt} ({ran} re-run)"


def _ran(steps: list[PythonCall]) -> str:
    """`1 cell and 2 calls`, `2 calls`."""
    cells = sum(1 for step in steps if step.cell is not None)
    calls = len(steps) - cells
    parts = [f"{cells} cell{'s' if cells != 1 else ''}" if cells else "", f"{calls} call{'s' if calls != 1 else ''}" if calls else ""]
    return " and ".join(part for part in parts if part) or "nothing"


_NAME_ERROR = re.compile(r"NameError: name '([A-Za-z_][A-Za-z0-9_]*)' is not defined")


def _error_line(content: str) -> str:
    """The python tool's `error: …` line, else the output's last line."""
    lines = [line.strip() for line in content.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("error: "):
            return line.removeprefix("error: ")[:ERROR_CHARS]
    return (lines[-1] if lines else "no output")[:ERROR_CHARS]


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES_SHOWN])
    return shown + (f" and {len(names) - MAX_NAMES_SHOWN} more" if len(names) > MAX_NAMES_SHOWN else "")
