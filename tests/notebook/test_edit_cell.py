"""SPEC §18: `edit_cell(execution_count, source)` proposes a new source for a cell the user ran.

With the labextension (a real kernel; a jupyter_client plays it, opening the monitor's comm and
running cells with the `cellId` metadata JupyterLab sends) the proposal is an ``edit_cell``
comm message naming the cell and the call; without one (a bare `InteractiveShell`, or no comm
open yet) the cell output shows the change as a diff and the new source goes below as the
next cell (`set_next_input`). Nothing is changed in the kernel either way. What the model was
sent is read from the loopback server's request bodies.
"""

from __future__ import annotations

from typing import Any

import pytest
from IPython.utils.capture import capture_output
from llm_server import text, tool_calls
from test_cell_insert import Frontend, frontend, next_inputs  # noqa: F401  (frontend is a fixture)

from soba_nb.notebook import comm as monitor_comm
from soba_nb.notebook import controls
from soba_nb.transcript.entries import ApprovalEntry, EditDecision, MessageEntry, ToolResultEntry

FAILING = "sales = {'amount': [120, 80, 45]}\nrevenue = sum(sales['revenue'])"
FIXED = "sales = {'amount': [120, 80, 45]}\nrevenue = sum(sales['amount'])"


def run_cell(ip: Any, source: str) -> Any:
    """A cell as a kernel runs it: its events fire and it gets an execution count."""
    return ip.run_cell(source, store_history=True)


def results(ip: Any) -> list[ToolResultEntry]:
    agent = ip.magics_manager.registry["SobaMagics"].agent
    return [e for e in agent.transcript.path() if isinstance(e, ToolResultEntry)]


def tool_messages(request: Any) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def run_failing(kernel: Frontend, code: str, cell_id: str) -> int:
    """Run `code` (which raises) as the cell `cell_id`, as JupyterLab does; its In [n]. (Not
    stopping on the error: ipykernel would abort the next request if it came at once.)"""
    content = {"code": code, "silent": False, "store_history": True, "allow_stdin": False, "stop_on_error": False}
    request = kernel.client.session.msg("execute_request", content, metadata={"cellId": cell_id})
    kernel.client.shell_channel.send(request)
    while True:
        reply = kernel.client.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == request["header"]["msg_id"]:
            assert reply["content"]["status"] == "error"
            return int(reply["content"]["execution_count"])


def edits(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        m["content"]["data"]
        for m in messages
        if m["msg_type"] == "comm_msg" and m["content"]["data"].get("type") == "edit_cell"
    ]


# -- without a labextension: the diff in the output, the new source as the next cell --------------


def test_the_model_is_offered_edit_cell_and_its_proposal_shows_as_a_diff_and_the_next_cell(ip, scripted):
    assert run_cell(ip, "note = 'a cell that works'").success
    assert not run_cell(ip, FAILING).success
    scripted.script(tool_calls(("edit_cell", {"execution_count": 2, "source": FIXED})), text("The key is 'amount'."))
    with capture_output() as shown:
        run_cell(ip, "%soba the second cell fails")

    first, second = scripted.inference_requests()
    [schema] = [t["function"] for t in first["tools"] if t["function"]["name"] == "edit_cell"]
    assert set(schema["parameters"]["properties"]) == {"execution_count", "source"}
    assert schema["parameters"]["required"] == ["execution_count", "source"]
    [result] = tool_messages(second)
    assert result.startswith("proposed a new source for In [2] (2 lines), not applied:")
    assert "no editor here" in result and "put below as a new cell" in result
    assert "comes to you" not in result  # one account of where it went, not two that disagree
    # The output: the change as a diff, whole; the new source below, not run; the cell as it was.
    assert "Proposed edit of In [2] (the new source is put below as a cell, not run):" in shown.stdout
    assert "--- In [2]\n+++ In [2] proposed\n" in shown.stdout
    assert "-revenue = sum(sales['revenue'])\n+revenue = sum(sales['amount'])" in shown.stdout
    assert ip.rl_next_input == FIXED
    assert "revenue" not in ip.user_ns
    recorder = ip.magics_manager.registry["SobaMagics"].holder.recorder
    assert recorder.by_count(2, 2)[0].source == FAILING


def test_the_rich_diff_is_escaped_text_never_markup(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.display_mode = 'rich'")
    assert not run_cell(ip, "raise ValueError('x')").success
    hostile = "```\n</pre><script>alert(1)</script>\n# [link](javascript:x)"
    scripted.script(tool_calls(("edit_cell", {"execution_count": 1, "source": hostile})), text("Proposed."))
    with capture_output() as shown:
        run_cell(ip, "%soba fix it")
    [bundle] = [o.data for o in shown.outputs if "soba-proposed-edit" in o.data.get("text/html", "")]
    assert "text/markdown" not in bundle
    html_text = bundle["text/html"]
    assert "<script>" not in html_text and "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in html_text
    assert "-raise ValueError(&#x27;x&#x27;)" in html_text
    plain = bundle["text/plain"]
    assert plain.startswith("Proposed edit of In [1]") and "+</pre><script>alert(1)</script>" in plain
    assert ip.rl_next_input == hostile


def test_a_cell_that_was_not_recorded_is_refused_in_one_line_naming_those_that_were(ip, scripted):
    for source in ("a = 1", "b = 2", "c = 3"):
        run_cell(ip, source)
    ip.run_cell("d = 4", store_history=False)  # no In [n]: not recorded
    run_cell(ip, "e = 5")
    scripted.script(
        tool_calls(("edit_cell", {"execution_count": 9, "source": "a = 10"})),
        tool_calls(("edit_cell", {"execution_count": 2, "source": "   "})),
        text("None to edit."),
    )
    with capture_output() as shown:
        run_cell(ip, "%soba change a cell")
    refused, empty = results(ip)
    assert refused.is_error and refused.content == "edit_cell: no cell In [9] was recorded in this kernel; recorded: In [1]–In [4]"
    assert empty.is_error and empty.content == "edit_cell: the source is empty"
    assert tool_messages(scripted.inference_requests()[1]) == [refused.content]
    assert "Proposed edit" not in shown.stdout and not getattr(ip, "rl_next_input", None)


def test_before_any_recorded_cell_the_refusal_says_why(ip, scripted):
    scripted.script(tool_calls(("edit_cell", {"execution_count": 1, "source": "x = 1"})), text("No."))
    with capture_output():
        run_cell(ip, "%soba edit In [1]")
    [refused] = results(ip)
    assert refused.content == (
        "edit_cell: no cell In [1] was recorded in this kernel; "
        "none is (cells run before `%load_ext soba_nb` are not recorded)"
    )


def test_a_proposal_is_never_asked_about_like_add_cell(ip, scripted):
    """Approval (SPEC §11) asks before what runs or writes; a proposal the user decides on is not
    asked about, even under `--approve all`."""
    assert not run_cell(ip, FAILING).success
    scripted.script(tool_calls(("edit_cell", {"execution_count": 1, "source": FIXED})), text("Proposed."))
    with capture_output():
        run_cell(ip, "%soba --approve all fix In [1]")
    agent = ip.magics_manager.registry["SobaMagics"].agent
    assert [e for e in agent.transcript.path() if isinstance(e, ApprovalEntry)] == []
    [result] = results(ip)
    assert not result.is_error and result.content.startswith("proposed a new source for In [1]")


class RecordingComm:
    """Stands in for ipykernel's comm object: keeps what it was sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, data: dict[str, Any]) -> None:
        self.sent.append(data)

    def on_close(self, callback: Any) -> None:
        pass

    def on_msg(self, callback: Any) -> None:
        pass


def test_an_edit_no_call_names_is_not_sent_to_the_labextension(ip, monkeypatch):
    """Outside a turn's transcript (no edit_cell call to name) no decision could come back: the
    proposal goes to the output and the next cell, never to a comm."""
    monkeypatch.setattr(monitor_comm, "_comms", [])
    monkeypatch.setattr(monitor_comm, "_undelivered_cells", [])
    tab = RecordingComm()
    monitor_comm._opened(tab, {})
    assert not run_cell(ip, FAILING).success
    holder = ip.magics_manager.registry["SobaMagics"].holder
    access = holder.notebook_access()
    assert access.edit is not None and access.edit(1, FIXED).startswith("there is no editor here")
    assert [m for m in tab.sent if m.get("type") == "edit_cell"] == []
    [edit] = holder.place_proposed()
    assert (edit.execution_count, edit.new, edit.call) == (1, FIXED, None)


# -- with the labextension: an edit_cell message on the monitor's comm -----------------------------


@pytest.mark.timeout(120)
def test_the_edit_goes_to_the_labextension_naming_the_cell_and_the_call(frontend):  # noqa: F811
    kernel, server = frontend
    kernel.run("%load_ext soba_nb")
    kernel.open_comm("tab-1")
    count = run_failing(kernel, FAILING, "cell-sales")
    server.script(
        tool_calls(("edit_cell", {"execution_count": count, "source": FIXED})),
        text("Proposed on the cell."),
    )
    reply, messages = kernel.run(f"%soba fix In [{count}]", cell_id="cell-soba")

    [edit] = edits(messages)  # on iopub, before the cell's idle: while the turn ran
    assert edit == {
        "type": "edit_cell",
        "call": "call_0",
        "executionCount": count,
        "cellId": "cell-sales",
        "old": FAILING,
        "new": FIXED,
        "turn": edit["turn"],
    }
    assert next_inputs(reply) == []  # the labextension shows it on the cell: no copy below
    [result] = tool_messages(server.requests[-1].body)
    assert "shown on that cell as a diff; the user accepts or rejects it" in result
    assert "their decision comes to you as a message" in result

    # The kernel is unchanged: the failed cell's names are still missing.
    _, checked = kernel.run("print('revenue' in globals())")
    assert [m["content"]["text"] for m in checked if m["msg_type"] == "stream"] == ["False\n"]


@pytest.mark.timeout(120)
def test_an_edit_no_comm_took_goes_below_and_to_the_next_comm_once(frontend):  # noqa: F811
    kernel, server = frontend
    kernel.run("%load_ext soba_nb")
    count = run_failing(kernel, FAILING, "cell-sales")
    server.script(tool_calls(("edit_cell", {"execution_count": count, "source": FIXED})), text("Below."))
    reply, messages = kernel.run("%soba fix it", cell_id="cell-soba")

    assert edits(messages) == []
    assert next_inputs(reply) == [{"source": "set_next_input", "text": FIXED, "replace": False}]
    shown = "".join(
        m["content"].get("text", "") or m["content"].get("data", {}).get("text/plain", "")
        for m in messages
        if m["msg_type"] in ("stream", "display_data")
    )
    assert f"Proposed edit of In [{count}]" in shown and "+revenue = sum(sales['amount'])" in shown
    replayed = [m for m in kernel.open_comm("tab-1") if m.get("type") == "edit_cell"]
    assert [(m["executionCount"], m["cellId"], m["new"]) for m in replayed] == [(count, "cell-sales", FIXED)]
    assert [m for m in kernel.open_comm("tab-2") if m.get("type") == "edit_cell"] == []


# -- the user's decision: an entry, and the next request's user message ---------------------------


def propose_an_edit(ip: Any, scripted: Any) -> Any:
    """In [1] fails; a turn proposes its corrected source (call `call_0`); the holder."""
    assert not run_cell(ip, FAILING).success
    scripted.script(tool_calls(("edit_cell", {"execution_count": 1, "source": FIXED})), text("Proposed."))
    with capture_output():
        run_cell(ip, "%soba fix In [1]")
    return ip.magics_manager.registry["SobaMagics"].holder


def decisions(ip: Any) -> list[MessageEntry]:
    agent = ip.magics_manager.registry["SobaMagics"].agent
    return [e for e in agent.transcript.path() if isinstance(e, MessageEntry) and e.edit]


def test_a_decision_sent_while_idle_is_the_user_message_the_next_request_carries(ip, scripted):
    holder = propose_an_edit(ip, scripted)
    answer = controls.handle(holder, {"type": "edit", "call": "call_0", "executionCount": 1, "decision": "accepted"})
    assert answer == {"type": "done", "request": "edit", "ok": True, "text": "edit of In [1]: accepted"}
    [entry] = decisions(ip)
    assert entry.role == "user" and entry.edit == EditDecision(call="call_0", execution_count=1, decision="accepted")
    # Not run yet: read_cells still shows the run that was, and the content says so.
    assert entry.content == (
        "The user accepted your proposed edit of In [1]: the cell now holds it (not run yet; "
        "read_cells shows In [1] as it ran, and its next run gets a new number)."
    )
    assert "revenue" not in ip.user_ns  # an accepted edit changes nothing in the kernel

    scripted.script(text("Run it when you like."))
    with capture_output():
        run_cell(ip, "%soba anything else?")
    users = [m["content"] for m in scripted.inference_requests()[-1]["messages"] if m["role"] == "user"]
    assert users[-2:] == [entry.content, "anything else?"]


def test_a_rejection_tells_the_model_the_cell_keeps_its_source(ip, scripted):
    holder = propose_an_edit(ip, scripted)
    answer = controls.handle(holder, {"type": "edit", "call": "call_0", "executionCount": 1, "decision": "rejected"})
    assert answer["ok"] is True
    [entry] = decisions(ip)
    assert entry.content == "The user rejected your proposed edit of In [1]; the cell keeps its source."


@pytest.mark.parametrize(
    ("request_fields", "problem"),
    [
        ({"call": "call_9", "executionCount": 1, "decision": "accepted"}, "edit: no edit_cell call call_9 in this session"),
        ({"call": "call_0", "executionCount": 2, "decision": "accepted"}, "edit: call call_0 proposed an edit of In [1], not In [2]"),
        ({"call": "call_0", "executionCount": 1, "decision": "maybe"}, "edit: decision must be accepted or rejected, not 'maybe'"),
        ({"call": "call_0", "executionCount": "1", "decision": "accepted"}, "edit: executionCount must be a cell's In [n], not '1'"),
        ({"executionCount": 1, "decision": "accepted"}, "edit: give call, the id of the edit_cell call"),
    ],
)
def test_a_decision_that_names_no_proposal_is_refused_in_one_line(ip, scripted, request_fields, problem):
    holder = propose_an_edit(ip, scripted)
    answer = controls.handle(holder, {"type": "edit", **request_fields})
    assert answer == {"type": "done", "request": "edit", "ok": False, "text": problem}
    assert decisions(ip) == []


def test_a_proposal_is_decided_once(ip, scripted):
    holder = propose_an_edit(ip, scripted)
    request = {"type": "edit", "call": "call_0", "executionCount": 1, "decision": "accepted"}
    assert controls.handle(holder, request)["ok"] is True
    again = controls.handle(holder, {**request, "decision": "rejected"})  # a second tab
    assert again["ok"] is False and again["text"] == "edit: the edit of In [1] (call_0) was already accepted"
    assert len(decisions(ip)) == 1
