"""The Jupyter server extension (SPEC §18): the sidebar's way to a busy kernel.

A kernel running a cell does not read its shell channel, so what the sidebar must deliver
during a turn goes through the Jupyter server instead, into the notebook's session folder:

- `POST /soba/api/inbox` — a steer or an edit decision, one file in `<stem>.soba/inbox/`
  (`soba_nb.inbox`), taken by the kernel at the next tool boundary;
- `/soba/api/queue` (GET, POST, PUT, DELETE) and `POST /soba/api/queue/next` — the requests
  queued while a turn runs, in `<stem>.soba/queue.json` (`queue`);
- `GET /soba/api/conversation` — the notebook's latest transcript read back as the panel
  shows it (`conversation`), so the conversation survives a page reload.

Enabled by the install (`jupyter-config/jupyter_server_config.d/soba_nb.json`, shipped as
shared data); `soba_nb._jupyter_server_extension_points` names this module.
"""

from __future__ import annotations

from typing import Any


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Add the handlers to the server's web application (tornado is imported only here)."""
    from soba_nb.server.handlers import add_handlers

    add_handlers(serverapp.web_app)
    serverapp.log.info("soba_nb: /soba/api/inbox, /soba/api/queue and /soba/api/conversation are served")
