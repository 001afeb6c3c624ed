"""The sidebar's controls, kernel side (`soba_nb.notebook.controls`): Compact now,
Auto-compact on/off and Export capsule…, each answered with the text the magic prints.

Requests go through a real `InteractiveShell` with the extension loaded and the loopback
LLM server; the comm wiring is checked with a fake kernel and comm manager.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.notebook import controls
from soba_nb.notebook.controls import CONTROL_TARGET, handle
from soba_nb.transcript.entries import CapsuleEntry

LONG_ANSWER = "The data has many columns worth describing. " * 45
TURNS_TO_COMPACT = 6
"""Enough turns that a capsule really makes the input smaller (see tests/notebook/test_magics.py)."""


def magics(ip: Any) -> Any:
    return ip.magics_manager.registry["SobaMagics"]


def capsules(ip: Any) -> list[CapsuleEntry]:
    return [e for e in magics(ip).agent.transcript.path() if isinstance(e, CapsuleEntry)]


def some_turns(ip: Any, scripted: Any) -> None:
    """Long turns with auto-compaction off: `%compact` has something to do."""
    ip.run_line_magic("auto_compact", "off")
    for index in range(TURNS_TO_COMPACT):
        scripted.script(text(f"Answer {index}. {LONG_ANSWER}"))
        with capture_output():
            ip.run_line_magic("soba", f"question {index}")


def test_compact_answers_with_the_result_line_and_appends_a_capsule(ip, scripted):
    some_turns(ip, scripted)
    ip.run_line_magic("config", "SobaMagics.display_mode = 'rich'")
    sent: list[dict[str, Any]] = []
    magics(ip).sidebar.send = lambda message: sent.append(message) or True

    answer = handle(magics(ip).holder, {"type": "compact", "focus": "keep the totals"})

    result = magics(ip).agent.compactor.last_result
    assert answer["type"] == "done" and answer["request"] == "compact" and answer["ok"] is True
    assert answer["text"].splitlines()[0] == result.line()
    assert answer["text"].startswith("Compacted (user) · ")
    assert [c.checkpoint_id for c in capsules(ip)] == [result.checkpoint_id]
    # The sidebar saw the barrier (`%compact` wording) and then the new figures.
    assert any(m["type"] == "progress" and m["line"].startswith("Compacting context · ") for m in sent)
    assert [m for m in sent if m["type"] == "result"][-1]["line"] == result.line()
    assert sent[-1]["type"] == "snapshot" and sent[-1]["lastResult"].startswith("Compacted (user)")
    assert magics(ip).display_mode == "rich"  # restored after the text-only request


def test_compact_with_nothing_to_compact_answers_skipped(ip, scripted):
    scripted.script(text("Short answer."))
    with capture_output():
        ip.run_line_magic("soba", "hello")
    answer = handle(magics(ip).holder, {"type": "compact"})
    skipped, hint = answer["text"].splitlines()
    assert answer["ok"] is True and skipped.startswith("skipped: nothing to compact: the last ") and " tokens are kept whole" in skipped
    assert hint.startswith('to hand the session over as it is, %capsule create "TITLE"')  # no dead end
    assert capsules(ip) == []
    ip.run_line_magic("config", "SobaMagics.display_mode = 'plain'")
    with capture_output() as budget:
        ip.run_line_magic("budget", "")
    assert f"Last attempt: {skipped}" in budget.stdout.splitlines()


def test_auto_turns_soft_triggers_off_and_on(ip, scripted):
    answer = handle(magics(ip).holder, {"type": "auto", "on": False})
    assert answer["ok"] is True and answer["text"].startswith("auto compaction off")
    assert magics(ip).agent.limits.auto is False
    with capture_output() as budget:
        ip.run_line_magic("budget", "")
    assert "· auto off" in budget.stdout

    answer = handle(magics(ip).holder, {"type": "auto", "on": True})
    assert answer["ok"] is True and answer["text"].startswith("auto compaction on")
    assert magics(ip).agent.limits.auto is True

    answer = handle(magics(ip).holder, {"type": "auto", "on": "yes"})
    assert answer == {"type": "done", "request": "auto", "ok": False, "text": "auto: give on: true or false"}
    assert magics(ip).agent.limits.auto is True


def test_export_writes_the_latest_capsule(ip, scripted, nb_dir: Path):
    some_turns(ip, scripted)
    assert handle(magics(ip).holder, {"type": "compact"})["ok"]
    checkpoint = capsules(ip)[-1].checkpoint_id

    answer = handle(magics(ip).holder, {"type": "export", "path": "my notes.capsule.md"})
    written = nb_dir / "my notes.capsule.md"
    assert answer == {
        "type": "done",
        "request": "export",
        "ok": True,
        "text": f"exported {checkpoint} to my notes.capsule.md",  # as the user typed it, inside the notebook folder
    }
    assert written.read_text(encoding="utf-8").startswith("---\nsoba-capsule: ")

    again = handle(magics(ip).holder, {"type": "export", "path": "my notes.capsule.md"})
    assert again["ok"] is False and again["text"].startswith("%capsule export: ")
    assert "exists" in again["text"]


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("", "export: give the path of the .capsule.md file to write"),
        ("   ", "export: give the path of the .capsule.md file to write"),
        (None, "export: give the path of the .capsule.md file to write"),
        ("../outside.capsule.md", "outside the project folder"),
        ("soba.json/x.capsule.md", "%capsule export: "),  # under a file, not a folder
    ],
)
def test_export_to_a_bad_path_is_a_one_line_error(ip, scripted, nb_dir: Path, path, error):
    some_turns(ip, scripted)
    assert handle(magics(ip).holder, {"type": "compact"})["ok"]
    answer = handle(magics(ip).holder, {"type": "export", "path": path})
    assert answer["ok"] is False and error in answer["text"]
    assert "\n" not in answer["text"] and "Traceback" not in answer["text"]
    assert not (nb_dir.parent / "outside.capsule.md").exists()


def test_export_before_any_capsule_writes_one_of_the_session_as_it_is(ip, scripted, nb_dir: Path):
    scripted.script(text("Hello there."))
    with capture_output():
        ip.run_line_magic("soba", "hello")
    answer = handle(magics(ip).holder, {"type": "export", "path": "handoff.capsule.md"})
    assert answer["ok"] is True and answer["text"].startswith("capsule 'handoff' written to handoff.capsule.md (")
    assert (nb_dir / "handoff.capsule.md").read_text().startswith("---")
    assert not capsules(ip)  # nothing was compacted
    with capture_output() as listed:
        ip.run_line_magic("capsule", "list")
    assert "capsule 'handoff' written to handoff.capsule.md" in listed.stdout.splitlines()[-1]
    outside = handle(magics(ip).holder, {"type": "export", "path": "../outside.capsule.md"})
    assert outside["ok"] is False and "outside the project folder" in outside["text"]


def test_an_unknown_request_is_answered_not_raised(ip):
    answer = handle(magics(ip).holder, {"type": "nope"})
    assert answer == {
        "type": "done",
        "request": "nope",
        "ok": False,
        "text": "unknown request 'nope'; known: compact, auto, export, inbox, edit",
    }
    assert handle(magics(ip).holder, {})["ok"] is False


class FakeChannel:
    """A kernel-side comm: records what is sent, delivers what the frontend sends."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.on_message: Any = None

    def send(self, data: dict[str, Any]) -> None:
        self.sent.append(data)

    def on_msg(self, callback: Any) -> None:
        self.on_message = callback

    def receive(self, data: dict[str, Any]) -> None:
        self.on_message({"content": {"data": data}})


class FakeCommManager:
    def __init__(self) -> None:
        self.targets: dict[str, Any] = {}

    def register_target(self, name: str, callback: Any) -> None:
        self.targets[name] = callback


def test_the_target_is_registered_only_in_a_kernel(ip, monkeypatch):
    import comm

    assert controls.register(magics(ip).holder) is False  # a bare InteractiveShell has no kernel

    manager = FakeCommManager()
    monkeypatch.setattr(comm, "get_comm_manager", lambda: manager)
    monkeypatch.setattr(ip, "kernel", object(), raising=False)  # as in ipykernel
    assert controls.register(magics(ip).holder) is True
    channel = FakeChannel()
    manager.targets[CONTROL_TARGET](channel, {"content": {"data": {}}})
    channel.receive({"type": "auto", "on": False})
    assert channel.sent[-1]["request"] == "auto" and channel.sent[-1]["ok"] is True

    controls.unregister(magics(ip).holder)
    assert CONTROL_TARGET not in manager.targets
