"""Steering a running turn through the session folder's inbox (SPEC §18): a real
`InteractiveShell` turn, the loopback server's request bodies, the transcript."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import NOTEBOOK_NAME, write_soba_json
from llm_server import text, tool_calls

from soba_nb.inbox import Edit, Steer, inbox_for, post, sent_now
from soba_nb.notebook import controls
from soba_nb.transcript.entries import EditDecision, MessageEntry, ToolResultEntry
from soba_nb.transcript.store import Transcript

STEER = "use the region column, not the city"
SLEEP_S = 2.0
WIRES = {
    "chat_completions": {"name": "gpt-4o"},
    "anthropic": {"provider": "anthropic", "name": "claude-sonnet-4-5"},
    "responses": {"api": "responses", "name": "gpt-4.1"},
}


def transcript_of(ip) -> Transcript:
    agent = ip.magics_manager.registry["SobaMagics"].agent
    return Transcript.load(agent.file)


def wire_messages(request) -> list[dict]:
    """The request's messages (Chat Completions, Anthropic) or input items (Responses)."""
    return list(request.get("input" if request.wire == "responses" else "messages") or [])


def texts_of(message: dict) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [part.get("text", "") for part in content or [] if part.get("type") in ("text", "input_text")]


def test_a_steer_sent_while_python_sleeps_reaches_the_next_request_after_the_result(ip, nb_dir, scripted):
    code = f"import time\ntime.sleep({SLEEP_S})\nprint('slept')"
    scripted.script(tool_calls(("python", {"code": code})), text("Grouped by region."))
    inbox = inbox_for(nb_dir / NOTEBOOK_NAME)
    posted: list[float] = []

    def steer_meanwhile() -> None:
        deadline = time.monotonic() + 30
        while not scripted.inference_requests() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # the python call is running now
        post(inbox, Steer(text=STEER, sent=sent_now()))  # the very code the server extension runs
        posted.append(time.monotonic())

    writer = threading.Thread(target=steer_meanwhile)
    writer.start()
    ip.run_line_magic("soba", "count the orders by city")
    writer.join()

    first, second = scripted.inference_requests()
    assert posted and posted[0] < second.time
    messages = second["messages"]
    assert [m["role"] for m in messages[-3:]] == ["assistant", "tool", "user"]
    assert messages[-2]["content"].strip().endswith("slept")  # the call ran to its end
    assert messages[-1]["content"] == STEER
    assert STEER not in str(first.body)

    path = transcript_of(ip).path()
    [result] = [e for e in path if isinstance(e, ToolResultEntry)]
    assert not result.is_error and "slept" in result.content
    assert result.duration_ms is not None and result.duration_ms >= SLEEP_S * 1000
    [steer] = [e for e in path if isinstance(e, MessageEntry) and e.steer is True]
    assert steer.content == STEER and steer.role == "user"
    assert path.index(steer) == path.index(result) + 1
    assert list(inbox.iterdir()) == []  # taken


@pytest.mark.parametrize("wire", WIRES)
def test_a_steer_follows_the_tool_results_in_every_wire_format(ip, nb_dir, scripted, wire):
    model = WIRES[wire]
    url = scripted.server.anthropic_url if model.get("provider") == "anthropic" else scripted.server.url
    write_soba_json(nb_dir, url, {"model": model})
    inbox = inbox_for(nb_dir / NOTEBOOK_NAME)
    # The call itself posts the steer (as the server would while it runs): the boundary after it takes it.
    code = f"from pathlib import Path\nfrom soba_nb.inbox import Steer, post\npost(Path({str(inbox)!r}), Steer(text={STEER!r}))"
    scripted.script(tool_calls(("python", {"code": code})), text("Done."))
    ip.run_line_magic("soba", "count the orders")

    _, second = scripted.inference_requests()
    messages = wire_messages(second)
    if wire == "anthropic":  # the result and the steer in one user message, results first
        last = messages[-1]
        assert last["role"] == "user"
        assert [block["type"] for block in last["content"]] == ["tool_result", "text"]
        assert last["content"][1]["text"] == STEER
        assert messages[-2]["role"] == "assistant"
    elif wire == "responses":
        assert messages[-2]["type"] == "function_call_output"
        assert messages[-1]["role"] == "user" and texts_of(messages[-1]) == [STEER]
    else:
        assert [m["role"] for m in messages[-2:]] == ["tool", "user"]
        assert messages[-1]["content"] == STEER


def test_an_edit_decision_sent_while_idle_becomes_an_entry_before_the_next_request(ip, nb_dir, scripted):
    inbox = inbox_for(nb_dir / NOTEBOOK_NAME)
    post(inbox, Edit(call="call_7", execution_count=4, decision="rejected", sent=sent_now()))
    scripted.script(text("Understood."))
    ip.run_line_magic("soba", "what now?")

    [request] = scripted.inference_requests()
    users = [m["content"] for m in request["messages"] if m["role"] == "user"]
    assert users[-2:] == ["The user rejected your proposed edit of In [4]; the cell keeps its source.", "what now?"]
    [entry] = [e for e in transcript_of(ip).path() if isinstance(e, MessageEntry) and e.edit]
    assert entry.edit == EditDecision(call="call_7", execution_count=4, decision="rejected")


def test_the_inbox_control_takes_the_mailbox_when_the_kernel_is_idle(ip, nb_dir, scripted):
    scripted.script(text("Hello."))
    ip.run_line_magic("soba", "hello")
    inbox = inbox_for(nb_dir / NOTEBOOK_NAME)
    post(inbox, Edit(call="call_1", execution_count=2, decision="accepted"))
    post(inbox, Steer(text="and mind the nulls"))
    (inbox / "00000000000000000001-deadbeef.json").write_text('{"kind": "steer"}')
    holder = ip.magics_manager.registry["SobaMagics"].holder

    answer = controls.handle(holder, {"type": "inbox"})

    assert answer["ok"] is True and answer["request"] == "inbox"
    lines = answer["text"].splitlines()
    assert lines[0].startswith("inbox: 00000000000000000001-deadbeef.json is not a message (")
    assert lines[0].endswith("set aside as 00000000000000000001-deadbeef.json.bad")
    assert lines[1:] == [
        "edit of In [2]: accepted",
        "steer: and mind the nulls",
    ]
    path = transcript_of(ip).path()
    assert [e.content for e in path[-2:] if isinstance(e, MessageEntry)] == [
        "The user accepted your proposed edit of In [2]: the cell now holds it (not run yet; "
        "read_cells shows In [2] as it ran, and its next run gets a new number).",
        "and mind the nulls",
    ]
    assert sorted(p.name for p in inbox.iterdir()) == ["00000000000000000001-deadbeef.json.bad"]
    assert controls.handle(holder, {"type": "inbox"})["text"] == "inbox: nothing waiting"


def test_a_steered_turn_is_named_by_its_request_not_the_steer(ip, nb_dir, scripted):
    """`%rewind`'s and `%capsule list`'s turn lines and `/code`'s comments name the request."""
    from soba_nb.agent.code_export import code_steps
    from soba_nb.notebook.capsule_commands import path_checkpoint_lines
    from soba_nb.notebook.checkpoints import checkpoint_lines

    inbox = inbox_for(nb_dir / NOTEBOOK_NAME)
    code = f"from pathlib import Path\nfrom soba_nb.inbox import Steer, post\npost(Path({str(inbox)!r}), Steer(text={STEER!r}))"
    scripted.script(tool_calls(("python", {"code": code})), tool_calls(("python", {"code": "1 + 1"})), text("Done."))
    ip.run_line_magic("soba", "count the orders")
    transcript = transcript_of(ip)
    [line] = checkpoint_lines(transcript)
    assert line.endswith('· "count the orders"') and STEER not in line
    [listed] = path_checkpoint_lines(transcript.path())
    assert "count the orders" in listed and STEER not in listed
    assert [step.request for step in code_steps(transcript.path())] == ["count the orders", "count the orders"]


def test_a_steer_sent_while_the_final_answer_streams_is_answered_before_the_turn_ends(ip, nb_dir, scripted):
    scripted.script(
        text("The orders by city: Paris 4, Lyon 2, Nice 1.", chunks=8, chunk_delay_s=0.25),
        text("By region: Île-de-France 4, Auvergne-Rhône-Alpes 2, PACA 1."),
    )
    inbox = inbox_for(nb_dir / NOTEBOOK_NAME)

    def steer_meanwhile() -> None:
        deadline = time.monotonic() + 30
        while not scripted.inference_requests() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # the answer is streaming now: no tool boundary is coming
        post(inbox, Steer(text=STEER, sent=sent_now()))

    writer = threading.Thread(target=steer_meanwhile)
    writer.start()
    ip.run_line_magic("soba", "count the orders by city")
    writer.join()

    first, second = scripted.inference_requests()  # the steer got its own answer, in the same turn
    assert [m["role"] for m in second["messages"][-2:]] == ["assistant", "user"]
    assert second["messages"][-1]["content"] == STEER
    magics = ip.magics_manager.registry["SobaMagics"]
    assert magics.last_result.status == "completed" and "By region" in magics.last_result.answer
    assert list(inbox.iterdir()) == []
