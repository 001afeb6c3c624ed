"""The HTTP handlers of the server extension: authenticated jupyter_server API handlers,
JSON in and out, bad input refused with 400 and `{"message": one line}`, a write the disk
refused with 507 (full) or 500 and one line, nothing half-written (see `soba_nb.server`)."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import msgspec
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

import soba_nb.server.queue as queue
from soba_nb.inbox import MessageError, inbox_for, parse, post, sent_now
from soba_nb.server.paths import Refused, notebook_in_root
from soba_nb.transcript.errors import TranscriptError

AUTH_RESOURCE = "contents"
"""What jupyter_server's authorizer is asked about: these read and write files beside a notebook."""
MAX_BODY_BYTES = 1 << 20
FULL = (errno.ENOSPC, errno.EDQUOT)


class _Handler(APIHandler):
    auth_resource = AUTH_RESOURCE

    def root(self) -> Path:
        return Path(self.contents_manager.root_dir)

    def notebook(self, path: object) -> Path:
        return notebook_in_root(self.root(), path)

    def body(self) -> dict[str, Any]:
        if len(self.request.body) > MAX_BODY_BYTES:
            raise Refused(f"body: {len(self.request.body):,} bytes, more than {MAX_BODY_BYTES:,}")
        try:
            data = json.loads(self.request.body or b"null")
        except ValueError as exc:
            raise Refused(f"body: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise Refused("body: give a JSON object")
        return data

    def answer(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def refuse(self, status: int, line: str) -> None:
        self.set_status(status)
        self.finish(json.dumps({"message": line.splitlines()[0] if line else "refused"}))

    def run(self, work: Any, status: int = 200) -> None:
        """`work()`'s answer, or its failure in one line."""
        try:
            self.answer(work(), status)
        except Refused as exc:
            self.refuse(400, str(exc))
        except queue.Missing as exc:
            self.refuse(404, str(exc.args[0]))
        except (TranscriptError, ValueError) as exc:  # a queue or a transcript that cannot be read
            self.refuse(500, str(exc))
        except OSError as exc:
            self.log.warning("soba_nb: %s", exc)
            said = exc.strerror or str(exc)
            self.refuse(507 if exc.errno in FULL else 500, f"not written: {said}; nothing was changed")


class InboxHandler(_Handler):
    """`POST {"path", "message": {kind, ...}}` → 201 `{"id": file name}`."""

    @web.authenticated
    @authorized
    def post(self) -> None:
        def work() -> dict[str, str]:
            data = self.body()
            notebook = self.notebook(data.get("path"))
            message = data.get("message")
            if not isinstance(message, dict):
                raise Refused('message: give {"kind": "steer", "text": …} or {"kind": "edit", …}')
            if not message.get("sent"):
                message = {**message, "sent": sent_now()}
            try:
                parsed = parse(msgspec.json.encode(message))
            except MessageError as exc:
                raise Refused(f"message: {exc}") from None
            return {"id": post(inbox_for(notebook), parsed)}

        self.run(work, 201)


class QueueHandler(_Handler):
    """GET `?path=` → `{"items"}`; POST `{"path", "text"}` → the item; PUT `{"path", "id",
    "text"}` → the item; DELETE `?path=&id=` → the item removed."""

    @web.authenticated
    @authorized
    def get(self) -> None:
        self.run(lambda: {"items": queue.items(self.notebook(self.get_argument("path", "")))})

    @web.authenticated
    @authorized
    def post(self) -> None:
        def work() -> queue.Item:
            data = self.body()
            return queue.add(self.notebook(data.get("path")), data.get("text"))  # type: ignore[arg-type]

        self.run(work, 201)

    @web.authenticated
    @authorized
    def put(self) -> None:
        def work() -> queue.Item:
            data = self.body()
            notebook = self.notebook(data.get("path"))
            return queue.change(notebook, queue.checked_id(data.get("id")), data.get("text"))  # type: ignore[arg-type]

        self.run(work)

    @web.authenticated
    @authorized
    def delete(self) -> None:
        def work() -> queue.Item:
            notebook = self.notebook(self.get_argument("path", ""))
            return queue.remove(notebook, queue.checked_id(self.get_argument("id", "")))

        self.run(work)


class QueueNextHandler(_Handler):
    """`POST {"path"}` → `{"item": the first item, removed}` (`null` when none waits)."""

    @web.authenticated
    @authorized
    def post(self) -> None:
        self.run(lambda: {"item": queue.take_next(self.notebook(self.body().get("path")))})


class ConversationHandler(_Handler):
    """GET `?path=` → `{"session", "messages", "omitted"}` (`server.conversation`)."""

    @web.authenticated
    @authorized
    def get(self) -> None:
        from soba_nb.server.conversation import conversation

        self.run(lambda: conversation(self.notebook(self.get_argument("path", "")), self.root()))


ROUTES = (
    ("soba/api/inbox", InboxHandler),
    ("soba/api/queue/next", QueueNextHandler),
    ("soba/api/queue", QueueHandler),
    ("soba/api/conversation", ConversationHandler),
)


def add_handlers(web_app: Any) -> None:
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base, route), handler) for route, handler in ROUTES])
