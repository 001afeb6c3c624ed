"""The conversation the sidebar shows, read back from the notebook's latest transcript (SPEC
§18: the panel comes back after a page reload).

Read-only (`Transcript.load`: no lock taken, nothing written; a torn last line is skipped as
everywhere), along the transcript's current path (what a rewind left behind is not shown).
Each item is one of:

- `{"kind": "message", "role": "user" | "assistant", "text", "steer": bool}` (a user message
  soba expanded shows what the user typed, `/fix`; an edit decision carries `edit`);
- `{"kind": "tool", "line", "isError", "status", "images"}` (`status`: ok, error or declined) — a call's receipt in the cell's words
  (`agent.receipts`), its images as paths relative to the server root;
- `{"kind": "capsule", "line"}` — a compaction.

Transcripts are redacted on the way to disk: no secret is in what this reads. Text has its
control characters escaped, as the cell shows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from soba_nb.agent.mcp.calls import summarize_call
from soba_nb.agent.receipts import receipt_status, receipt_text
from soba_nb.agent.tools import summarize_arguments
from soba_nb.layout import SessionLayout, sessions_folder_for
from soba_nb.printable import printable
from soba_nb.transcript.entries import (
    ApprovalEntry,
    CapsuleEntry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
)
from soba_nb.transcript.store import Transcript

MAX_ITEMS = 1000
"""The newest items shown; older ones are counted (`omitted`)."""
NO_RESULT = "no result"


def conversation(notebook: Path, root: Path) -> dict[str, Any]:
    """`{"session": id | None, "messages": [...], "omitted": n}` for the notebook (raises
    `TranscriptError` for a transcript that cannot be read)."""
    layout = SessionLayout.latest(sessions_folder_for(notebook))
    if layout is None:
        return {"session": None, "messages": [], "omitted": 0}
    transcript = Transcript.load(layout.transcript)
    found = items(transcript.path(), notebook.parent, root)
    return {"session": layout.session_id, "messages": found[-MAX_ITEMS:], "omitted": max(0, len(found) - MAX_ITEMS)}


def items(path: list[Any], notebook_folder: Path, root: Path) -> list[dict[str, Any]]:
    """The items of a transcript path, oldest first."""
    found: list[dict[str, Any]] = []
    calls: dict[str, dict[str, Any]] = {}
    declined: set[str] = set()  # calls the user declined (or no one could be asked about)
    for entry in path:
        kind = type(entry)
        item: dict[str, Any]
        if kind is MessageEntry and entry.role in ("user", "assistant") and entry.content.strip():
            text = entry.typed if entry.typed is not None else entry.content
            item = {"kind": "message", "role": entry.role, "text": printable(text, lines=True), "steer": entry.steer is True}
            if entry.edit:
                item["edit"] = {"call": entry.edit.call, "executionCount": entry.edit.execution_count, "decision": entry.edit.decision}
            found.append(item)
        elif kind is ToolCallEntry:
            summary = summarize_call(entry.name, entry.arguments, summarize_arguments)  # an MCP tool's too
            item = {"kind": "tool", "call": entry.call_id, "name": entry.name, "summary": summary, "isError": False, "images": []}
            item["line"] = printable(receipt_text(entry.name, summary, NO_RESULT, None))
            calls[entry.call_id] = item
            found.append(item)
        elif kind is ApprovalEntry and entry.decision in ("declined", "no_input"):
            declined.add(entry.call_id)
        elif kind is ToolResultEntry and entry.call_id in calls:
            item = calls.pop(entry.call_id)
            status = receipt_status(entry.is_error, entry.call_id in declined)
            item["line"] = printable(receipt_text(item["name"], item["summary"], status, entry.duration_ms))
            item["isError"] = entry.is_error
            item["status"] = status
            item["images"] = [_from_root(notebook_folder / a.path, root) for a in entry.artifacts or ()]
        elif kind is CapsuleEntry:
            found.append({"kind": "capsule", "line": printable(capsule_line(entry))})
    for item in found:
        item.pop("summary", None)
        item.pop("name", None)
    return found


def capsule_line(entry: CapsuleEntry) -> str:
    if entry.source is not None:
        return f"capsule loaded: {entry.title or entry.source} · {entry.checkpoint_id}"
    what = "Capsule amended" if entry.amends else "Compacted"  # the cell's words (`compaction.outcomes`)
    return f"{what} ({entry.trigger}) · {entry.tokens_before:,} → {entry.tokens_after:,} tokens · {entry.checkpoint_id}"


def _from_root(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return ""
