"""Kernel side of the labextension (SPEC §9, §10): send the budget sidebar's messages, and the
cells the agent proposes, over a comm.

In JupyterLab the budget monitor sits in the right sidebar; the `labextension` opens a comm
to the target `soba_nb.monitor` on the notebook's kernel and shows what arrives on it. `publish` is the only entry point: the magics call it (through
`monitor.SidebarPublisher`) with each message and keep rendering inline/plain text as usual,
so nothing depends on a frontend being there. (The sidebar's buttons talk to the kernel over
another target, `soba_nb.control`: see `soba_nb.notebook.controls`.)

Messages (JSON objects, discriminated on "type"):

- ``{"type": "snapshot", "effective": int, "hardLimit": int, "softLimit": int,
  "source": "provider_usage" | "estimated", "auto": bool, "lastResult": str | None,
  "lastAttempt": str | None, "degraded": bool, "provider": str, "session": str,
  "contextWindow": int, "windowSource": str, "cost": str, "headsUp": str | None}`` — the
  budget figures of the session (what ``%budget`` shows); ``lastResult`` is the last compaction's result line
  (``%budget``'s "Last compaction") and ``degraded`` says whether its capsule was a fallback;
  ``cost`` is the session's cost line (SPEC §11: ``Cost: $0.0123 this session (inference
  $0.0100 · compaction $0.0023) · prices: <source>`` or ``Cost: not priced``, then the cap
  when ``agent.maxSessionCostUsd`` sets one), shown as is;
  ``lastAttempt`` is the result line of this kernel's latest operation when it did not
  complete (``%budget``'s "Last attempt"), else None; ``headsUp`` is the line a turn ending
  past 85 % of the soft limit with auto on prints (SPEC §14: how close, that the next request
  may — or will — compact first, ``%compact FOCUS`` to steer it, ``%auto_compact off`` to
  avoid it), shown as is (``data-soba-role="compaction-heads-up"``); None when none is due
  and in the snapshots a running turn sends.
- ``{"type": "progress", "percent": int, "trigger": str, "line": str}`` — during a
  barrier; ``line`` is the live line exactly as the cell shows it
  (``Compacting context before response · NN%``, or ``Compacting context · NN%`` for
  ``%compact``); the sidebar shows it as is.
- ``{"type": "result", "line": str, "outcome": str, "degraded": bool}`` — the barrier
  finished; the live line collapses to this result line, the one the cell shows.
  ``outcome`` is ``completed``, ``skipped``, ``cancelled``, ``stale`` or ``failed``.
- ``{"type": "turn", "phase": ..., "turn": str, ...}`` — the sidebar's conversation: a turn
  as it happens, typed in the sidebar or run in a cell (`soba_nb.notebook.conversation`
  documents the phases).
- ``{"type": "add_cell", "source": str, "kind": "code" | "markdown", "cellId": str | None,
  "executionCount": int | None, "turn": str, "index": int}`` — the agent proposed a cell
  (`add_cell`, SPEC §10), sent while the turn runs (`soba_nb.notebook.cell_insert`): the
  labextension puts it below the running cell (``cellId``: the id JupyterLab and Notebook 7
  send in the execute_request's metadata; ``executionCount``: that cell's ``In [n]``),
  after the cells of the same run it already put there, not run. ``turn`` names the turn
  and ``index`` counts its proposals from 0: together they say which messages are the same
  one (every open comm gets each message, and several may be open). One that no comm took
  (the cell that ran ``%load_ext soba_nb`` also ran the turn, so the frontend had no comm
  open yet) is kept, with the rest of its turn only, and sent to the next comm that opens.
- ``{"type": "edit_cell", "call": str | None, "executionCount": int, "cellId": str | None,
  "old": str, "new": str, "turn": str}`` — the agent proposed a new source for the cell the
  user ran as ``In [executionCount]`` (`edit_cell`, SPEC §18; `soba_nb.notebook.cell_edit`):
  the labextension shows the change as a diff on that cell (``cellId``: its id from the
  execute_request that ran it, when the frontend sent one) with accept and reject; ``call``
  is the tool call's id, which the decision names. ``old`` is the source as it ran. Kept when
  no comm took it, like ``add_cell`` (with the proposed cells of its turn).

The frontend opens the comm, never the kernel: a kernel that opened comms on its own would
reach frontends without the target (nbclient and nbconvert log "No handler found for comm
target 'soba_nb.monitor'", Notebook 7 closes it and the next message opens another). So
`%load_ext soba_nb` registers the target (`register`); the sidebar opens a comm when a cell
that uses soba is about to run, after `%load_ext soba_nb` ran, and after a page reload when
the kernel still holds a comm from the previous page. On open, and on a ``{"type":
"refresh"}`` request, the kernel sends the last snapshot published, and the last result if it
came after it (on open, also the proposed cells no comm took). Every open comm gets every
message (two browser tabs on one kernel both follow); the oldest is closed past `MAX_COMMS`
(pages that were reloaded never say goodbye).

Outside a kernel (terminal IPython, a bare `InteractiveShell`, a plain script) or before any
frontend opened a comm, `publish` sends nothing and returns False, but the message is kept
for the next comm to open. It never raises — the sidebar is a view, and a broken view must
not break a turn or a compaction.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

TARGET_NAME = "soba_nb.monitor"
"""The comm target `%load_ext soba_nb` registers on the kernel; the sidebar opens comms to it."""

ADD_CELL = "add_cell"
"""The message of a cell the agent proposed (`soba_nb.notebook.cell_insert` words it)."""

EDIT_CELL = "edit_cell"
"""The message of a cell edit the agent proposed (`soba_nb.notebook.cell_edit` words it)."""

TURN = "turn"
"""A turn as it happens, for the sidebar's conversation (`soba_nb.notebook.conversation`)."""

MESSAGE_TYPES = frozenset({"snapshot", "progress", "result", ADD_CELL, TURN, EDIT_CELL})
"""The kernel → frontend message types (see the module docstring for their fields)."""

REFRESH = "refresh"
"""The frontend → kernel request: send the last snapshot (and result) again."""

MAX_COMMS = 8
"""Open comms kept per kernel; past it the oldest is closed."""

logger = logging.getLogger(__name__)

_lock = threading.RLock()
_comms: list[Any] = []
"""The comms the frontends opened and have not closed, oldest first."""
_last_snapshot: dict[str, Any] | None = None
_last_result: dict[str, Any] | None = None
_undelivered_cells: list[dict[str, Any]] = []
"""`add_cell` and `edit_cell` messages of the latest turn that no comm took, oldest first."""


def publish(message: dict[str, Any]) -> bool:
    """Send `message` to the budget sidebar; True when at least one frontend's comm took it.

    False outside a kernel or before a frontend opened a comm, for a message whose "type" is
    not one of `MESSAGE_TYPES`, or when sending failed (logged at debug level, never raised).
    """
    try:
        if message.get("type") not in MESSAGE_TYPES:
            return False
        with _lock:
            _remember(message)
            comms = list(_comms)
        delivered = sum(_send(channel, message) for channel in comms) > 0
        if not delivered and message["type"] in (ADD_CELL, EDIT_CELL):
            with _lock:
                _keep_undelivered(message)
        return delivered
    except Exception:  # the sidebar must never break the caller
        logger.debug("soba_nb.monitor: publish failed", exc_info=True)
        return False


def register(manager: Any) -> None:
    """Register the target on a kernel's comm manager (`%load_ext soba_nb`)."""
    manager.register_target(TARGET_NAME, _opened)


def unregister(manager: Any) -> None:
    """Remove the target and close the open comms (`%unload_ext soba_nb`)."""
    manager.targets.pop(TARGET_NAME, None)
    with _lock:
        comms, _comms[:] = list(_comms), []
        _undelivered_cells.clear()
    for channel in comms:
        _close(channel)


def kernel_comm_manager(shell: Any) -> Any | None:
    """The comm manager of `shell`'s kernel, or None outside a kernel (or without comms)."""
    if getattr(shell, "kernel", None) is None:
        return None
    try:
        import comm

        return comm.get_comm_manager()
    except Exception:  # no comm support: the sidebar says so itself
        logger.debug("soba_nb: no comm manager", exc_info=True)
        return None


def _opened(channel: Any, _open_message: dict[str, Any]) -> None:
    with _lock:
        _comms.append(channel)
        extra = _comms[:-MAX_COMMS]
        del _comms[:-MAX_COMMS]
    for old in extra:
        _close(old)
    channel.on_close(lambda _message: _forget(channel))
    channel.on_msg(lambda message: _answer(channel, message))
    _replay(channel)
    with _lock:
        cells, _undelivered_cells[:] = list(_undelivered_cells), []
    for message in cells:
        _send(channel, message)


def _answer(channel: Any, request: dict[str, Any]) -> None:
    data = request.get("content", {}).get("data") or {}
    if isinstance(data, dict) and data.get("type") == REFRESH:
        _replay(channel)


def _replay(channel: Any) -> None:
    with _lock:
        previous = [m for m in (_last_snapshot, _last_result) if m is not None]
    for message in previous:
        _send(channel, message)


def _forget(channel: Any) -> None:
    with _lock:
        if channel in _comms:
            _comms.remove(channel)


def _remember(message: dict[str, Any]) -> None:
    """Keep what a newly opened comm needs to show the budget without waiting for a turn."""
    global _last_snapshot, _last_result
    if message["type"] == "snapshot":
        _last_snapshot, _last_result = dict(message), None
    elif message["type"] == "result":
        _last_result = dict(message)


def _keep_undelivered(message: dict[str, Any]) -> None:
    """Keep a proposed cell for the next comm; an older turn's are dropped (their cell has
    run on since, and the frontend would no longer know where they go)."""
    if _undelivered_cells and _undelivered_cells[-1].get("turn") != message.get("turn"):
        _undelivered_cells.clear()
    _undelivered_cells.append(dict(message))


def _send(channel: Any, message: dict[str, Any]) -> bool:
    try:
        channel.send(data=message)
        return True
    except Exception:
        logger.debug("soba_nb.monitor: send failed", exc_info=True)
        return False


def _close(channel: Any) -> None:
    try:
        channel.close()
    except Exception:
        logger.debug("soba_nb.monitor: close failed", exc_info=True)
