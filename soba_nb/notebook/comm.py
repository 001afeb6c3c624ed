"""Kernel side of the JupyterLab budget sidebar (SPEC §9): send monitor messages over a comm.

In JupyterLab the budget monitor sits in the right sidebar; the `labextension` registers the
comm target `soba_nb.monitor` on every notebook's kernel and shows what arrives here for that
notebook. `publish` is the only entry point: the budget monitor calls it with each message and
keeps rendering inline/plain text as usual, so nothing depends on a frontend being there.

Messages (JSON objects, discriminated on "type"):

- ``{"type": "snapshot", "effective": int, "hardLimit": int, "softLimit": int,
  "source": "provider_usage" | "estimated", "auto": bool, "lastResult": str | None,
  "degraded": bool, "provider": str, "session": str}`` — the budget figures of the
  session (what ``%budget`` shows); ``lastResult`` is the last compaction's result line and
  ``degraded`` says whether its capsule was a fallback.
- ``{"type": "progress", "percent": int, "trigger": str}`` — during a barrier; the sidebar
  shows ``Compacting context before response · NN%``.
- ``{"type": "result", "line": str, "degraded": bool}`` — the barrier finished; the live
  line collapses to this result line.

The frontend may send ``{"type": "refresh"}`` (after a page reload it adopts the open comm);
the answer is the last snapshot published, and the last result if it came after it.

One comm per kernel, opened lazily by the first `publish`, with the message as the open
data. A frontend without the target closes the comm at once; the next `publish` opens a new
one. Outside a kernel (terminal IPython, a bare `InteractiveShell`, a plain script) there is
no frontend to talk to: `publish` does nothing and returns False. It never raises — the
sidebar is a view, and a broken view must not break a turn or a compaction.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

TARGET_NAME = "soba_nb.monitor"
"""The comm target the labextension registers on each notebook's kernel."""

MESSAGE_TYPES = frozenset({"snapshot", "progress", "result"})
"""The kernel → frontend message types (see the module docstring for their fields)."""

REFRESH = "refresh"
"""The frontend → kernel request: send the last snapshot (and result) again."""

logger = logging.getLogger(__name__)

_lock = threading.RLock()
_comms: dict[int, Any] = {}
"""The open comm per kernel, keyed by `id(kernel)`; dropped when the frontend closes it."""
_last_snapshot: dict[str, Any] | None = None
_last_result: dict[str, Any] | None = None


def publish(message: dict[str, Any]) -> bool:
    """Send `message` to the budget sidebar; True when it was handed to a kernel comm.

    False outside a kernel, for a message whose "type" is not one of `MESSAGE_TYPES`, or
    when sending failed (logged at debug level, never raised).
    """
    try:
        if message.get("type") not in MESSAGE_TYPES:
            return False
        _remember(message)
        kernel = _current_kernel()
        if kernel is None:
            return False
        return _send(kernel, message)
    except Exception:  # the sidebar must never break the caller
        logger.debug("soba_nb.monitor: publish failed", exc_info=True)
        return False


def _remember(message: dict[str, Any]) -> None:
    """Keep what a reloaded page needs to show the budget again without waiting for a turn."""
    global _last_snapshot, _last_result
    if message["type"] == "snapshot":
        _last_snapshot, _last_result = dict(message), None
    elif message["type"] == "result":
        _last_result = dict(message)


def _current_kernel() -> Any | None:
    """The running ipykernel kernel, or None (no IPython, or a shell without a kernel)."""
    try:
        from IPython.core.getipython import get_ipython
    except ImportError:
        return None
    getter: Any = get_ipython  # typed in IPython 9, untyped in 8: call it as Any in both
    shell = getter()
    return getattr(shell, "kernel", None) if shell is not None else None


def _send(kernel: Any, message: dict[str, Any]) -> bool:
    with _lock:
        open_comm = _comms.get(id(kernel))
        if open_comm is not None and not getattr(open_comm, "_closed", False):
            open_comm.send(data=message)
            return True
        _comms[id(kernel)] = _open(kernel, message)
        return True


def _open(kernel: Any, message: dict[str, Any]) -> Any:
    # Looked up at call time: ipykernel replaces `comm.create_comm` when the kernel starts.
    import comm

    new_comm = comm.create_comm(target_name=TARGET_NAME, data=message)
    kernel_key = id(kernel)

    def forget(_close_message: dict[str, Any]) -> None:
        with _lock:
            if _comms.get(kernel_key) is new_comm:
                del _comms[kernel_key]

    def answer(request: dict[str, Any]) -> None:
        data = request.get("content", {}).get("data") or {}
        if data.get("type") == REFRESH:
            for previous in (_last_snapshot, _last_result):
                if previous is not None:
                    new_comm.send(data=previous)

    new_comm.on_close(forget)
    new_comm.on_msg(answer)
    return new_comm
