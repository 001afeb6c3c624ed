"""SPEC §10: a cell the agent proposes (`add_cell`) goes to the labextension while the turn
runs, as an ``add_cell`` comm message naming the running cell; every other frontend still
gets the `set_next_input` payload. A real kernel runs `%soba` against the loopback LLM
server, and a jupyter_client plays the labextension: it opens the comm and sends
execute_requests with the `cellId` metadata JupyterLab sends. (The labextension itself, in
JupyterLab and Notebook 7: tests/notebook/test_add_cell_browser.py.)
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_KEY_ENV, TEST_KEY_VALUE, write_soba_json
from llm_server import LLMServer, text, tool_calls

from soba_nb.notebook import cell_insert
from soba_nb.notebook import comm as monitor_comm
from soba_nb.notebook.comm import TARGET_NAME
from soba_nb.transcript.entries import ToolResultEntry

KERNEL_TIMEOUT_S = 60
FIX = "revenue = sales['amount'].sum()\nrevenue"
NOTE = "## Revenue\nThe column is `amount`, not `revenue`."
PROPOSALS = (
    tool_calls(("add_cell", {"source": FIX})),
    tool_calls(("add_cell", {"source": NOTE, "kind": "markdown"})),
    text("Two cells are below."),
)


class Frontend:
    """A kernel, and a client that plays the labextension: runs cells the way JupyterLab does
    (with `cellId`), opens comms to the monitor's target, reads iopub."""

    def __init__(self, manager: Any, client: Any) -> None:
        self.manager = manager
        self.client = client

    def run(
        self, code: str, cell_id: str | None = None
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Run `code` as the cell `cell_id`: its execute_reply and its iopub messages."""
        metadata = {"cellId": cell_id} if cell_id else {}
        content = {"code": code, "silent": False, "store_history": True, "allow_stdin": False}
        request = self.client.session.msg("execute_request", content, metadata=metadata)
        self.client.shell_channel.send(request)
        return self._reply_to(request["header"]["msg_id"])

    def open_comm(self, comm_id: str) -> list[dict[str, Any]]:
        """Open a comm as the labextension does; the comm messages the kernel answers with."""
        content = {"comm_id": comm_id, "target_name": TARGET_NAME, "data": {"type": "refresh"}}
        request = self.client.session.msg("comm_open", content)
        self.client.shell_channel.send(request)
        # The kernel answers on iopub within a busy/idle pair parented by the comm_open.
        _, messages = self._reply_to(request["header"]["msg_id"], wait_for_reply=False)
        return [m["content"]["data"] for m in messages if m["msg_type"] == "comm_msg"]

    def _reply_to(
        self, msg_id: str, *, wait_for_reply: bool = True
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        messages: list[dict[str, Any]] = []
        while True:
            message = self.client.get_iopub_msg(timeout=KERNEL_TIMEOUT_S)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                break
            messages.append(message)
        if not wait_for_reply:
            return {}, messages
        while True:
            reply = self.client.get_shell_msg(timeout=KERNEL_TIMEOUT_S)
            if reply["parent_header"].get("msg_id") == msg_id:
                assert reply["content"]["status"] == "ok", reply["content"]
                return reply, messages


def proposed(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        m["content"]["data"]
        for m in messages
        if m["msg_type"] == "comm_msg" and m["content"]["data"].get("type") == "add_cell"
    ]


def next_inputs(reply: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in reply["content"].get("payload") or [] if p.get("source") == "set_next_input"]


@pytest.fixture
def frontend(tmp_path: Path) -> Iterator[tuple[Frontend, LLMServer]]:
    """A python3 kernel in a project whose soba.json points at a loopback LLM server; both
    always stopped."""
    from jupyter_client.manager import start_new_kernel

    project = tmp_path / "project"
    project.mkdir()
    env = {**os.environ, TEST_KEY_ENV: TEST_KEY_VALUE, "HOME": str(tmp_path)}
    env = {k: v for k, v in env.items() if not k.startswith("SOBA_") and k != "JPY_SESSION_NAME"}
    with LLMServer() as server:
        write_soba_json(project, server.url)
        manager, client = start_new_kernel(kernel_name="python3", cwd=str(project), env=env)
        try:
            yield Frontend(manager, client), server
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)


@pytest.mark.timeout(120)
def test_each_proposal_goes_to_the_labextension_while_the_cell_runs(frontend):
    kernel, server = frontend
    kernel.run("%load_ext soba_nb")
    kernel.open_comm("tab-1")
    server.script(*PROPOSALS)
    reply, messages = kernel.run("%soba fix the revenue cell", cell_id="cell-abc")

    first, second = proposed(messages)  # on iopub, before the cell's idle: while it ran
    count = reply["content"]["execution_count"]
    assert first == {
        "type": "add_cell",
        "source": FIX,
        "kind": "code",
        "cellId": "cell-abc",
        "executionCount": count,
        "turn": first["turn"],
        "index": 0,
    }
    assert second == {**first, "source": NOTE, "kind": "markdown", "index": 1}
    # Every other frontend still gets the last one (a Markdown cell as `%%markdown`).
    assert next_inputs(reply) == [
        {"source": "set_next_input", "text": f"%%markdown\n{NOTE}", "replace": False}
    ]

    server.script(tool_calls(("add_cell", {"source": "revenue"})), text("One more."))
    _, messages = kernel.run("%soba and the total?", cell_id="cell-def")
    [again] = proposed(messages)
    assert again["turn"] != first["turn"] and again["index"] == 0 and again["cellId"] == "cell-def"


@pytest.mark.timeout(120)
def test_proposals_no_comm_took_go_to_the_next_comm_once(frontend):
    """The cell that loads soba also runs the turn: the labextension opens its comm only
    after the cell, and gets the turn's proposals then (and only that comm gets them)."""
    kernel, server = frontend
    server.script(*PROPOSALS)
    reply, messages = kernel.run("%load_ext soba_nb\n%soba fix the revenue cell", cell_id="cell-1")
    assert proposed(messages) == []  # no comm was open
    assert next_inputs(reply)[0]["text"] == f"%%markdown\n{NOTE}"

    replayed = [m for m in kernel.open_comm("tab-1") if m.get("type") == "add_cell"]
    assert [(m["source"], m["kind"], m["index"], m["cellId"]) for m in replayed] == [
        (FIX, "code", 0, "cell-1"),
        (NOTE, "markdown", 1, "cell-1"),
    ]
    assert replayed[0]["executionCount"] == reply["content"]["execution_count"]
    assert [m for m in kernel.open_comm("tab-2") if m.get("type") == "add_cell"] == []


@pytest.mark.timeout(120)
def test_only_the_latest_turn_waits_for_a_comm(frontend):
    kernel, server = frontend
    kernel.run("%load_ext soba_nb")
    server.script(*PROPOSALS)
    kernel.run("%soba fix the revenue cell", cell_id="cell-1")
    server.script(tool_calls(("add_cell", {"source": "revenue"})), text("Here."))
    kernel.run("%soba show the total", cell_id="cell-2")
    replayed = [m for m in kernel.open_comm(uuid.uuid4().hex) if m.get("type") == "add_cell"]
    assert [(m["source"], m["cellId"]) for m in replayed] == [("revenue", "cell-2")]


def test_outside_a_kernel_nothing_is_sent_and_the_turn_places_the_cell(ip, scripted):
    scripted.script(tool_calls(("add_cell", {"source": FIX})), text("Proposed."))
    ip.run_line_magic("soba", "fix it")
    agent = ip.magics_manager.registry["SobaMagics"].agent
    [result] = [e for e in agent.transcript.path() if isinstance(e, ToolResultEntry)]
    assert "goes below this cell when the turn ends" in result.content
    assert ip.rl_next_input == FIX


class BrokenComm:
    """An ipykernel comm whose iopub socket is gone."""

    def send(self, data: dict[str, Any]) -> None:
        raise RuntimeError("iopub is gone")

    def on_close(self, callback: Any) -> None:
        pass

    def on_msg(self, callback: Any) -> None:
        pass


class BrokenKernel:
    def get_parent(self) -> dict[str, Any]:
        raise RuntimeError("no parent")


class Shell:
    kernel = BrokenKernel()
    execution_count = 3


def test_announce_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitor_comm, "_comms", [])
    monkeypatch.setattr(monitor_comm, "_undelivered_cells", [])
    monitor_comm._opened(BrokenComm(), {})
    assert cell_insert.announce(Shell(), FIX, "code", 0) is False
    assert cell_insert.announce(object(), FIX, "code", 1) is False  # no kernel, no count
    assert cell_insert.running_cell_id(Shell()) is None
