"""`%rewind TARGET [--files] [--force]`: move the leaf and say what becomes of the agent's
files (SPEC §11).

Without `--files` the files stay as they are and the cell lists the ones the agent changed
on the part of the path the rewind leaves, with the command that restores them; with it
each is put back as it was at the target (`soba_nb.agent.restore`) and a `restore` entry
records what was done. `%rewind T --files` right after `%rewind T` restores what the first
listed, without moving the leaf again.
"""

from __future__ import annotations

from soba_nb.agent.restore import FilePlan, apply_restore, left_behind, plan_restore
from soba_nb.agent.session import AgentSession
from soba_nb.agent.vault import FileVault
from soba_nb.printable import printable
from soba_nb.transcript.entries import RestoredFile


def what_changed(plan: FilePlan) -> str:
    if plan.wanted is None:
        return "created by the agent"
    if plan.expected is None:
        return "removed since"
    return "changed by the agent"


def rewind_with_files(agent: AgentSession, target: str, *, files: bool, force: bool) -> list[str]:
    """Rewind to `target` (a checkpoint or entry id); the lines the cell shows."""
    target_id = agent.resolve_target(target)
    abandoned, there = left_behind(agent.transcript, target_id)
    lines = []
    if there:
        lines.append(f"already at {target} (entry {target_id})")
    else:
        leaf = agent.rewind(target)
        lines.append(f"rewound to {target} (entry {leaf.target_id}); the next turn continues from there")
    plans = plan_restore(abandoned, agent.transcript.path_view())
    if not files:
        if plans:
            listed = ", ".join(f"{printable(p.path)} ({what_changed(p)})" for p in plans)
            lines.append(f"the agent changed {len(plans)} file(s) after {target}, left as they are: {listed}")
            lines.append(f"%rewind {target} --files restores them as they were at {target}")
        return lines
    if not plans:
        lines.append(f"no file to restore: the agent changed none after {target}")
        return lines
    entry, reasons = apply_restore(
        plans,
        target_id=target_id,
        project_root=agent.project_root,
        vault=FileVault(agent.layout.file_versions),
        session_files=agent.session_files(),
        force=force,
    )
    if not entry.files:
        lines.append(f"nothing to restore: the files are as they were at {target}")
        return lines
    agent.transcript.append(entry)
    lines += [_line(restored, reasons.get(restored.path), target) for restored in entry.files]
    if any(restored.action == "left_alone" for restored in entry.files):
        lines.append(f"%rewind {target} --files --force restores those too (their current content is lost)")
    return lines


def _line(restored: RestoredFile, reason: str | None, target: str) -> str:
    path = printable(restored.path)
    if restored.action == "restored":
        return f"restored {path} as it was at {target}"
    if restored.action == "deleted":
        return f"deleted {path} (the agent created it after {target})"
    if restored.action == "left_alone":
        return f"left alone {path}: changed since the agent last wrote it"
    return f"could not restore {path}: {printable(reason or 'unknown error')}"
