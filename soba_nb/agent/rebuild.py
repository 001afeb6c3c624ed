"""After a kernel restart: notice the variables that are gone, and rebuild them on request.

The agent's variables live in the kernel, the session in the transcript; a restart keeps the
one and loses the other. Before each turn `kernel_note` compares what the session says should
exist — the variables the agent's `python` calls built (`provenance`) and those the latest
capsule's `## Kernel state` names — with the namespace. Anything missing is said once, in the
cell and to the model (a `system` message: "kernel was restarted: df, model_v2 are gone; they
were built by python calls …"), so neither the user nor the model works on a `df` that is not
there.

`%soba /rebuild` (`rebuild`) re-runs the recorded producing code in the order it first ran:
the calls that last assigned each missing variable, and, before them, those that built the
missing variables they read. Each run is a real `python` call with its receipt and its
transcript entries; the first error stops the rebuild and says what is still missing.
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
from soba_nb.agent.provenance import Provenance, PythonCall
from soba_nb.agent.session import AgentSession
from soba_nb.agent.tools import ToolContext, run_tool, summarize_arguments
from soba_nb.compaction.capsule import CapsuleFormatError, parse_capsule
from soba_nb.transcript.entries import MessageEntry, ToolCallEntry, ToolResultEntry

MAX_NAMES_SHOWN = 8
"""Names listed in a note; the rest are counted."""
ERROR_CHARS = 200
PREVIEW_LINES = 3
PREVIEW_CHARS = 240
_CAPSULE_VARIABLE = re.compile(r"^\s*[-*]\s+`?([A-Za-z_][A-Za-z0-9_]*)`?\s*:")


def missing_variables(session: AgentSession) -> list[str]:
    """Variables the session says should exist that the kernel does not have, in the order
    the work used them (most recent first), then those only the latest capsule names."""
    provenance = session.provenance()
    producers = provenance.producers
    # Imports are how the work was done, not what it made: `/rebuild` restores them as needed.
    expected = [name for name in provenance.ranked() if name in producers and name not in producers[name].imported]
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


def kernel_note(session: AgentSession, *, restarted: bool) -> str | None:
    """What to tell the user and the model about missing variables, or None when all are there.

    `restarted`: this is the first turn of a resumed session in this kernel process.
    """
    missing = missing_variables(session)
    if not missing:
        return None
    provenance = session.provenance()
    gone = _names(missing)
    built = [name for name in missing if name in provenance.producers]
    calls = ", ".join(dict.fromkeys(provenance.producers[name].entry_id for name in built))
    head = f"kernel was restarted: {gone} {'is' if len(missing) == 1 else 'are'} gone" if restarted else (
        f"no longer defined in the kernel: {gone}"
    )
    if not built:
        return f"{head}. They were not built by soba's python calls, so /rebuild cannot restore them."
    origin = f"{'it was' if len(built) == 1 else 'they were'} built by python call{'s' if ', ' in calls else ''} {calls}"
    return f"{head}; {origin}. `%soba /rebuild` re-runs that code."


def note_missing(session: AgentSession) -> str | None:
    """Before a turn: record and return the note about missing variables, once per change.

    The note becomes a `system` message (the model sees it as a note before the request)
    and is shown in the cell; the same missing set is not reported twice.
    """
    missing = frozenset(missing_variables(session))
    if not missing:
        session.noted_missing = frozenset()
        return None
    if missing <= session.noted_missing:
        return None
    note = kernel_note(session, restarted=session.resumed and not session.noted_missing)
    session.noted_missing = missing
    if note is not None:
        session.transcript.append(MessageEntry(role="system", content=note))
    return note


@dataclass
class RebuildResult:
    """How a rebuild ended."""

    rebuilt: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """Still missing afterwards."""
    calls_run: int = 0
    failed: PythonCall | None = None
    error: str = ""
    """The failing call's error line (`NameError: name 'factor' is not defined`)."""
    message: str = ""


def plan(provenance: Provenance, namespace: dict[str, object], missing: list[str]) -> list[PythonCall]:
    """The calls to re-run for `missing`, with those building what they read, in run order."""
    wanted: dict[int, PythonCall] = {}
    queue = [name for name in missing if name in provenance.producers]
    while queue:
        call = provenance.producers[queue.pop()]
        if id(call) in wanted:
            continue
        wanted[id(call)] = call
        queue.extend(
            name for name in call.read
            if name not in namespace and name in provenance.producers and provenance.producers[name] is not call
        )
    return [call for call in provenance.calls if id(call) in wanted]


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
    calls = plan(provenance, session.namespace, missing)
    result = RebuildResult()
    if not missing:
        result.message = "nothing to rebuild: every variable the session built is defined"
        return result
    if not calls:
        result.missing = missing
        result.message = f"nothing to rebuild: {_names(missing)} were not built by soba's python calls"
        return result
    transcript = session.transcript
    transcript.append(
        MessageEntry(
            role="system",
            content=f"kernel rebuild (%soba /rebuild): re-running {len(calls)} python "
            f"call{'s' if len(calls) != 1 else ''} ({', '.join(c.entry_id for c in calls)}) to rebuild {_names(missing)}",
        )
    )
    ctx = ToolContext(project_root=session.project_root, namespace=session.namespace, cancel=cancel, transform=transform)
    for call in calls:
        if cancel is not None and cancel.is_set():
            break
        call_id = f"rebuild_{secrets.token_hex(6)}"
        arguments = json.dumps({"code": call.code})
        transcript.append(ToolCallEntry(call_id=call_id, name="python", arguments=arguments))
        summary = summarize_arguments("python", arguments)
        emit(ToolStarted(call_id, "python", summary))
        started = time.monotonic()
        try:
            outcome = run_tool("python", arguments, ctx)
        except KeyboardInterrupt:
            transcript.append(ToolResultEntry(call_id=call_id, name="python", content="[interrupted by the user]", is_error=True))
            raise
        duration = int((time.monotonic() - started) * 1000)
        transcript.append(
            ToolResultEntry(call_id=call_id, name="python", content=outcome.content, is_error=outcome.is_error, duration_ms=duration)
        )
        preview = "\n".join(outcome.content.splitlines()[:PREVIEW_LINES])[:PREVIEW_CHARS]
        emit(ToolFinished(call_id, "python", summary, outcome.is_error, duration, preview))
        result.calls_run += 1
        if outcome.is_error:
            result.failed = call
            result.error = _error_line(outcome.content)
            break
    result.missing = [name for name in missing if name not in session.namespace]
    result.rebuilt = [name for name in missing if name in session.namespace]
    result.message = _outcome_line(result, len(calls))
    transcript.append(MessageEntry(role="system", content=result.message))
    emit(Notice(result.message, "error" if result.failed or result.missing else "info"))
    return result


def _outcome_line(result: RebuildResult, planned: int) -> str:
    rebuilt = f"rebuilt {_names(result.rebuilt)}" if result.rebuilt else "nothing rebuilt"
    if result.failed is not None:
        return (
            f"rebuild stopped: the re-run of python call {result.failed.entry_id} failed "
            f"({result.calls_run} of {planned} run: {result.error}); {rebuilt}; still missing: {_names(result.missing)}"
        )
    if result.calls_run < planned:
        return f"rebuild cancelled after {result.calls_run} of {planned} calls; {rebuilt}; still missing: {_names(result.missing)}"
    if result.missing:
        return f"{rebuilt} ({result.calls_run} calls re-run); still missing: {_names(result.missing)}"
    return f"{rebuilt} ({result.calls_run} call{'s' if result.calls_run != 1 else ''} re-run)"


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
