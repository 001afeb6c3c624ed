"""Approval before calls run (SPEC §11): through a bare InteractiveShell whose `input()` reads
a real stdin, and through a real kernel whose stdin channel is answered (and one that does
not allow stdin). The server's request log shows what the model was told."""

from __future__ import annotations

import html
import io
import json
import os
import sys

import pytest
from conftest import TEST_KEY_ENV, TEST_KEY_VALUE, write_soba_json
from IPython.utils.capture import capture_output
from llm_server import LLMServer, text, tool_calls

from soba_nb.transcript.entries import ApprovalEntry, ToolResultEntry

WRITE = ("write_file", {"path": "notes.md", "content": "# Notes\nnew line\n"})
SHELL = ("shell", {"command": "echo hello > shell.txt"})
PYTHON = ("python", {"code": "ran = True"})


def magics(ip):
    return ip.magics_manager.registry["SobaMagics"]


def set_approval(nb_dir, mode: str) -> None:
    config = json.loads((nb_dir / "soba.json").read_text())
    config["agent"] = {"approval": mode}
    (nb_dir / "soba.json").write_text(json.dumps(config))


def answered(monkeypatch, answers: str) -> None:
    """`input()` reads these lines from a real stdin stream."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(answers))


def entries(ip, kind):
    return [e for e in magics(ip).agent.transcript.path() if isinstance(e, kind)]


def turn(ip, prompt: str) -> str:
    with capture_output() as out:
        ip.run_line_magic("soba", prompt)
    return out.stdout


def test_yes_runs_no_declines_and_the_turn_goes_on(ip, nb_dir, scripted, monkeypatch):
    set_approval(nb_dir, "edits")
    (nb_dir / "notes.md").write_text("# Notes\n")
    answered(monkeypatch, "y\nn\n")
    scripted.script(tool_calls(WRITE, SHELL, PYTHON), text("Done what I was allowed to."))
    shown = turn(ip, "update the notes and run the script")
    assert "Approval needed before this call runs:" in shown
    assert "write_file notes.md (replaces the file)" in shown and "+new line" in shown  # the diff
    assert "$ echo hello > shell.txt" in shown
    assert (nb_dir / "notes.md").read_text() == "# Notes\nnew line\n"
    assert not (nb_dir / "shell.txt").exists()
    assert ip.user_ns.get("ran") is True  # python is not asked about in `edits`
    assert [(a.decision, a.mode) for a in entries(ip, ApprovalEntry)] == [("approved", "edits"), ("declined", "edits")]
    shell_result = [r for r in entries(ip, ToolResultEntry) if r.name == "shell"][0]
    assert shell_result.is_error and shell_result.content == "declined by the user"
    tool_messages = [m for m in scripted.inference_requests()[-1]["messages"] if m["role"] == "tool"]
    assert "declined by the user" in [m["content"] for m in tool_messages]
    # the approval sits between the call and its result
    path = magics(ip).agent.transcript.path()
    kinds = [type(e).__name__ for e in path if getattr(e, "call_id", None) == shell_result.call_id]
    assert kinds == ["ToolCallEntry", "ApprovalEntry", "ToolResultEntry"]


def test_all_approves_the_rest_of_the_turn_and_unclear_answers_are_asked_again(ip, nb_dir, scripted, monkeypatch):
    answered(monkeypatch, "maybe\na\n")
    scripted.script(tool_calls(PYTHON, SHELL, WRITE), text("All done."))
    shown = turn(ip, "--approve all do everything")
    assert shown.count("Approval needed") == 1  # asked again without showing the call twice
    assert [a.decision for a in entries(ip, ApprovalEntry)] == ["approved_all"]
    assert (nb_dir / "shell.txt").read_text() == "hello\n" and (nb_dir / "notes.md").exists()
    # --approve is for one turn: the next one follows agent.approval (never by default)
    scripted.script(tool_calls(("write_file", {"path": "again.md", "content": "x"})), text("ok"))
    turn(ip, "write again")
    assert len(entries(ip, ApprovalEntry)) == 1 and (nb_dir / "again.md").exists()


def test_no_input_declines_with_the_reason_and_the_way_out(ip, nb_dir, scripted, monkeypatch):
    set_approval(nb_dir, "edits")
    answered(monkeypatch, "")  # end of input
    scripted.script(tool_calls(WRITE), text("Could not write."))
    shown = turn(ip, "write the notes")
    assert "declined write_file: the input has ended" in shown
    assert "%soba --approve never" in shown and "agent.approval" in shown
    [approval] = entries(ip, ApprovalEntry)
    assert approval.decision == "no_input" and not (nb_dir / "notes.md").exists()
    # --approve never runs them without asking
    scripted.script(tool_calls(WRITE), text("Written."))
    turn(ip, "--approve never write the notes")
    assert (nb_dir / "notes.md").exists() and len(entries(ip, ApprovalEntry)) == 1


def test_a_bad_mode_is_one_line(ip, nb_dir, scripted):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="--approve"):
        ip.run_line_magic("soba", "--approve sometimes do it")
    set_approval(nb_dir, "sometimes")
    with pytest.raises(UsageError, match="agent.approval"):
        ip.run_line_magic("soba", "do it")


@pytest.mark.timeout(180)
def test_a_real_kernel_asks_on_the_stdin_channel(tmp_path):
    from jupyter_client.manager import start_new_kernel

    project = tmp_path / "project"
    project.mkdir()
    with LLMServer() as server:
        write_soba_json(project, server.url)
        set_approval(project, "edits")
        server.script(tool_calls(WRITE), text("Written."), tool_calls(WRITE), text("Not written."))
        env = {**os.environ, TEST_KEY_ENV: TEST_KEY_VALUE, "HOME": str(tmp_path)}
        env = {k: v for k, v in env.items() if not k.startswith("SOBA_") and k != "JPY_SESSION_NAME"}
        manager, client = start_new_kernel(kernel_name="python3", cwd=str(project), env=env)
        prompts: list[str] = []

        def answer(message):
            prompts.append(message["content"]["prompt"])
            client.input("y")

        try:
            client.execute_interactive("%load_ext soba_nb", timeout=60)
            client.execute_interactive("%soba write the notes", timeout=120, allow_stdin=True, stdin_hook=answer)
            written = (project / "notes.md").read_text()
            (project / "notes.md").unlink()
            shown: list[str] = []
            reply = client.execute_interactive(
                "%soba write them again",
                timeout=120,
                allow_stdin=False,
                output_hook=lambda m: shown.append(str(m["content"].get("text") or m["content"].get("data", {}).get("text/plain", ""))),
            )
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    assert prompts == ["Run this call? [y]es / [n]o / [a]ll this turn: "]
    assert written == "# Notes\nnew line\n"
    assert reply["content"]["status"] == "ok" and not (project / "notes.md").exists()
    assert "declined write_file: this frontend does not answer input()" in "".join(shown)


@pytest.mark.timeout(180)
def test_a_real_kernel_shows_the_injected_code_escaped_before_stdin_answers(tmp_path):
    """Issue 40: code that closes a Markdown fence and opens an HTML comment, and erases a
    terminal line, is shown whole and escaped in the display the kernel sends on iopub —
    before the stdin request — and declined there, it does not run."""
    from jupyter_client.manager import start_new_kernel

    hidden = 'open("PWNED1.txt", "w")'
    code = f'print("plot the sales data")\n_ = """\n````\n<!--\n"""\n{hidden}  # \x1b[2K\r\n'
    project = tmp_path / "project"
    project.mkdir()
    with LLMServer() as server:
        write_soba_json(project, server.url)
        set_approval(project, "all")
        server.script(tool_calls(("python", {"code": code})), text("Not run."))
        env = {**os.environ, TEST_KEY_ENV: TEST_KEY_VALUE, "HOME": str(tmp_path)}
        env = {k: v for k, v in env.items() if not k.startswith("SOBA_") and k != "JPY_SESSION_NAME"}
        manager, client = start_new_kernel(kernel_name="python3", cwd=str(project), env=env)
        displayed: list[dict] = []
        seen_at_the_question: list[int] = []

        def answer(message):
            seen_at_the_question.append(len(displayed))
            client.input("n")

        def output(message):
            if message["msg_type"] in ("display_data", "update_display_data", "stream"):
                displayed.append(message["content"])

        try:
            client.execute_interactive("%load_ext soba_nb", timeout=60)
            reply = client.execute_interactive(
                "%soba plot the sales data", timeout=120, allow_stdin=True, stdin_hook=answer, output_hook=output
            )
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok" and seen_at_the_question
    before = displayed[: seen_at_the_question[0]]
    [question] = [c["data"] for c in before if "Approval needed" in c.get("data", {}).get("text/plain", "")]
    escaped_line = html.escape(hidden) + "  # \\x1b[2K\\x0d"
    assert escaped_line in question["text/html"] and "<pre" in question["text/html"]
    assert "&lt;!--" in question["text/html"] and "<!--" not in question["text/html"]
    assert "text/markdown" not in question  # nothing rendered as Markdown around the code
    assert hidden + "  # \\x1b[2K\\x0d" in question["text/plain"] and "\x1b" not in question["text/plain"]
    assert not (project / "PWNED1.txt").exists()


def test_a_declined_call_is_labelled_declined_in_the_cell_and_the_conversation(ip, nb_dir, scripted, monkeypatch):
    """Its receipt says `declined` (not `error`, no duration: it never ran), in the cell and in the
    conversation the sidebar reads back; the model still reads an error result, as before."""
    from soba_nb.server.conversation import items

    set_approval(nb_dir, "edits")
    answered(monkeypatch, "n\n")
    scripted.script(tool_calls(SHELL, PYTHON), text("I did not run the script."))
    shown = turn(ip, "run the script")
    assert "[shell: echo hello > shell.txt (timeout 60s) · declined]" in shown
    assert "· error" not in shown and "[python: ran = True · ok · " in shown
    path = magics(ip).agent.transcript.path()
    lines = [item["line"] for item in items(path, nb_dir, nb_dir) if item["kind"] == "tool"]
    assert lines[0] == "shell: echo hello > shell.txt (timeout 60s) · declined" and lines[1].startswith("python: ran = True · ok · ")
    # what the model reads is unchanged: an error result saying so
    [tool] = [m for m in scripted.inference_requests()[-1]["messages"] if m["role"] == "tool" and m["content"] == "declined by the user"]
    assert [r.is_error for r in entries(ip, ToolResultEntry) if r.name == "shell"] == [True]
