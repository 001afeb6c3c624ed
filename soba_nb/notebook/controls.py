"""The JupyterLab sidebar's controls, kernel side: Compact now, Auto-compact on/off, Export.

`%load_ext soba_nb` registers the comm target `soba_nb.control` on the kernel; the sidebar
opens a comm to it when a button is used and sends one request per message:

- ``{"type": "compact", "focus": str | None}`` — what `%compact [focus]` does;
- ``{"type": "auto", "on": bool}`` — what `%auto_compact on|off` does;
- ``{"type": "export", "path": str}`` — export the latest capsule on the path to `path`
  (what `%capsule export <latest checkpoint> <path>` does);
- ``{"type": "edit", "call": str, "executionCount": int, "decision": "accepted" | "rejected"}``
  — the user's decision on a cell edit the agent proposed (`edit_cell`), recorded at once as
  the entry the model reads (`agent.cell_edits`); refused in one line when the session has no
  such call or it was decided already;
- ``{"type": "inbox"}`` — take the session folder's inbox now (`agent.steering`): what the
  sidebar sent through the Jupyter server (a steer, an edit decision) becomes entries at once
  instead of at the next turn; the answer lists what was taken, one line each.

Each request is answered on the same comm with ``{"type": "done", "request": <type>, "ok":
bool, "text": str}``: the lines the magic would have printed, or the one-line error. The
budget figures and the compaction line reach the sidebar as always (`comm.publish`). Cancel
is not a request: the sidebar interrupts the kernel, the clean cancel path of a running cell.

Requests are handled when the kernel is idle (a kernel runs comm messages between cells);
they never raise into the kernel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from soba_nb.agent.cell_edits import DecisionError, record_decision
from soba_nb.agent.events import Notice
from soba_nb.agent.steering import take_inbox
from soba_nb.capsule_files.file import FILE_SUFFIX
from soba_nb.inbox import pending
from soba_nb.layout import INBOX_FOLDER
from soba_nb.notebook import comm
from soba_nb.notebook.capsule_commands import create_capsule_file
from soba_nb.notebook.comm import kernel_comm_manager
from soba_nb.notebook.location import locate
from soba_nb.notebook.render import STEER_LABEL

if TYPE_CHECKING:
    from soba_nb.notebook.holder import SessionHolder

CONTROL_TARGET = "soba_nb.control"
logger = logging.getLogger(__name__)


def _compact(holder: SessionHolder, data: dict[str, Any]) -> None:
    focus = data.get("focus")
    _magic(holder, "compact")(focus if isinstance(focus, str) else "")


def _auto(holder: SessionHolder, data: dict[str, Any]) -> None:
    state = data.get("on")
    if not isinstance(state, bool):
        raise UsageError("auto: give on: true or false")
    _magic(holder, "auto_compact")("on" if state else "off")


def _export(holder: SessionHolder, data: dict[str, Any]) -> None:
    path = data.get("path")
    if not isinstance(path, str) or not path.strip():
        raise UsageError("export: give the path of the .capsule.md file to write")
    agent = holder.get_session()
    capsules = agent.capsules()
    if not capsules:
        # Nothing compacted yet: a capsule of the session as it is (what `%capsule create`
        # writes), never a dead end.
        target = Path(path.strip()).expanduser()
        if not target.is_absolute():  # as `%capsule export` takes it: inside the project
            target = agent.project_root / target
            if not target.resolve().is_relative_to(agent.project_root.resolve()):
                raise UsageError(f"export: {path.strip()} is outside the project folder {agent.project_root}")
        title = target.name.removesuffix(FILE_SUFFIX).removesuffix(".md") or "capsule"
        create_capsule_file(holder, agent, title, target, force=False)
        return
    _magic(holder, "capsule")(f"export {capsules[-1].checkpoint_id} {_quoted(path.strip())}")


def _magic(holder: SessionHolder, name: str) -> Callable[[str], None]:
    """The line magic `name`, as IPython finds it (the buttons do what the magics do)."""
    method: Callable[[str], None] | None = holder.shell.find_line_magic(name)
    if method is None:
        raise UsageError(f"%{name} is not loaded; run %load_ext soba_nb")
    return method


def _quoted(path: str) -> str:
    """One word for `%capsule`'s argument splitting (quotes group, no escapes), spaces and all."""
    for quote in ('"', "'"):
        if quote not in path:
            return f"{quote}{path}{quote}"
    raise UsageError("export: a path holding both kinds of quotes cannot be passed on; rename it")


def _inbox(holder: SessionHolder, _data: dict[str, Any]) -> None:
    """Take the mailbox into the session (opened only when something waits)."""
    agent = holder.agent
    inbox = agent.layout.inbox if agent is not None else locate(holder.shell.user_ns).sessions_dir / INBOX_FOLDER
    if not pending(inbox):
        print("inbox: nothing waiting")
        return
    agent = holder.get_session()
    for entry in take_inbox(agent.layout.inbox, agent.transcript, _said):
        if entry.edit:
            print(f"edit of In [{entry.edit.execution_count}]: {entry.edit.decision}")
        else:
            print(f"{STEER_LABEL}{entry.content}")


def _edit(holder: SessionHolder, data: dict[str, Any]) -> None:
    """The user's decision on a proposed cell edit, as an entry now (the sidebar sends it
    this way when the kernel is idle)."""
    agent = holder.get_session()
    try:
        entry = record_decision(agent.transcript, data.get("call"), data.get("executionCount"), data.get("decision"))
    except DecisionError as exc:
        raise UsageError(str(exc)) from None
    assert entry.edit
    print(f"edit of In [{entry.edit.execution_count}]: {entry.edit.decision}")


def _said(event: object) -> None:
    if isinstance(event, Notice):  # a file set aside (steers are listed with what was taken)
        print(event.text)


HANDLERS: dict[str, Callable[[SessionHolder, dict[str, Any]], None]] = {
    "compact": _compact,
    "auto": _auto,
    "export": _export,
    "inbox": _inbox,
    "edit": _edit,
}


def handle(holder: SessionHolder, data: dict[str, Any]) -> dict[str, Any]:
    """Run one request; the answer to send back."""
    kind = data.get("type")
    handler = HANDLERS.get(kind) if isinstance(kind, str) else None
    if handler is None:
        known = ", ".join(HANDLERS)
        return {"type": "done", "request": kind, "ok": False, "text": f"unknown request {kind!r}; known: {known}"}
    settings = holder.settings
    mode, settings.display_mode = settings.display_mode, "plain"  # no cell to render in: text only
    capturing: Any = capture_output  # typed in IPython 9, untyped in 8
    try:
        with capturing() as out:
            handler(holder, data)
        return {"type": "done", "request": kind, "ok": True, "text": out.stdout.strip()}
    except UsageError as error:
        return {"type": "done", "request": kind, "ok": False, "text": str(error)}
    except Exception as error:  # the kernel belongs to the user: report, never raise
        logger.debug("soba_nb.control: request failed", exc_info=True)
        return {"type": "done", "request": kind, "ok": False, "text": f"{type(error).__name__}: {error}"}
    finally:
        settings.display_mode = mode
        holder.refresh_monitor()


def register(holder: SessionHolder) -> bool:
    """Register the control target (and the monitor's, `comm.register`) on the kernel of
    `holder.shell`; False outside a kernel."""
    manager = kernel_comm_manager(holder.shell)
    if manager is None:
        return False
    comm.register(manager)

    def opened(channel: Any, _open_message: dict[str, Any]) -> None:
        def on_message(message: dict[str, Any]) -> None:
            data = message.get("content", {}).get("data") or {}
            channel.send(data=handle(holder, data if isinstance(data, dict) else {}))

        channel.on_msg(on_message)

    manager.register_target(CONTROL_TARGET, opened)
    return True


def unregister(holder: SessionHolder) -> None:
    """Remove the targets (`%unload_ext`): the sidebar then says to load the extension."""
    manager = kernel_comm_manager(holder.shell)
    if manager is not None:
        manager.targets.pop(CONTROL_TARGET, None)
        comm.unregister(manager)
