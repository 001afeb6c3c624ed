"""SPEC §18: every turn reaches the sidebar's conversation as `turn` messages on the monitor
comm — a real `InteractiveShell` running `%soba` against the loopback server, and a frontend's
comm as `comm.publish` sends to it (a channel object in the open-comms list, as a kernel's
comm manager puts one there when the labextension opens it)."""

from __future__ import annotations

from typing import Any

import pytest
from llm_server import http_error, text, tool_calls

from soba_nb.notebook import comm


class Channel:
    """A frontend's comm: what `publish` sends arrives here, as it would on the wire."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, data: dict[str, Any]) -> None:
        self.sent.append(data)

    def turn_messages(self) -> list[dict[str, Any]]:
        return [m for m in self.sent if m["type"] == "turn"]


@pytest.fixture
def channel() -> Any:
    opened = Channel()
    with comm._lock:
        comm._comms.append(opened)
    yield opened
    comm._forget(opened)


def test_a_turn_run_in_a_cell_is_sent_to_the_conversation_as_it_happens(ip, scripted, channel):
    scripted.script(
        tool_calls(("python", {"code": "print(6 * 7)"})),
        text("The answer is **42**.\x1b[2J", chunks=3),
    )
    ip.run_line_magic("soba", "what is six times seven?")

    messages = channel.turn_messages()
    phases = [m["phase"] for m in messages]
    assert phases[0] == "start" and phases[-1] == "end"
    assert messages[0]["prompt"] == "what is six times seven?"
    assert len({m["turn"] for m in messages}) == 1  # one turn id throughout
    receipts = [m for m in messages if m["phase"] == "tool"]
    assert [r["status"] for r in receipts] == ["running", "ok"]
    assert receipts[0]["call"] == receipts[1]["call"] and "python" in receipts[1]["line"]
    assert "42" in receipts[1]["preview"]
    answer = "".join(m["text"] for m in messages if m["phase"] == "text")
    assert answer == "The answer is **42**.\\x1b[2J"  # control characters escaped, as the cell shows
    assert phases.index("tool") < phases.index("text")
    assert messages[-1]["status"] == "completed" and messages[-1]["line"].startswith("completed · ck_")


def test_a_fix_is_shown_as_typed_and_an_approval_question_carries_the_call_whole(ip, scripted, channel, monkeypatch):
    hidden = 'print("plot")\n````\n<!--\nopen("PWNED.txt", "w")'
    scripted.script(tool_calls(("python", {"code": hidden})), text("Declined, fine."))
    monkeypatch.setattr("builtins.input", lambda question: "n")
    ip.run_line_magic("soba", "--approve all plot it")

    messages = channel.turn_messages()
    questions = [m for m in messages if m["phase"] == "approval"]
    assert len(questions) == 1 and hidden in questions[0]["text"]
    receipt = [m for m in messages if m["phase"] == "tool"][-1]
    assert receipt["status"] == "declined" and receipt["line"].endswith("· declined")  # it never ran: no duration
    assert [m["phase"] for m in messages][-1] == "end"


def test_a_failed_turn_ends_in_one_line(ip, scripted, channel):
    scripted.script(http_error(401, {"error": {"message": "invalid api key\nsecond line"}}))
    ip.run_line_magic("soba", "hello")
    end = channel.turn_messages()[-1]
    assert end["phase"] == "end" and end["status"] == "failed"
    assert "\n" not in end["line"] and end["line"].startswith("failed: ")
