"""The `python` tool takes what a cell takes (SPEC §15): IPython syntax through the shell's input
transformers, and `timeout_s`, a KeyboardInterrupt in the kernel at the limit that leaves the
kernel and its variables alive — through a real InteractiveShell and `%soba` turns against the
loopback server, and in a real kernel (jupyter_client) where the interrupt is a real signal."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_KEY_ENV, TEST_KEY_VALUE, write_soba_json
from IPython.utils.capture import capture_output
from llm_server import LLMServer, text, tool_calls

from soba_nb.agent.tools import ToolContext, run_tool
from soba_nb.agent.tools import time_limit as time_limit_module
from soba_nb.transcript.entries import ToolResultEntry

STOPPED = re.compile(r"stopped after (\d+(?:\.\d+)?) s \(timeout_s\)")


def results(ip: Any) -> list[ToolResultEntry]:
    agent = ip.magics_manager.registry["SobaMagics"].agent
    return [e for e in agent.transcript.path() if isinstance(e, ToolResultEntry)]


def last_result(ip: Any) -> Any:
    return ip.magics_manager.registry["SobaMagics"].last_result


def sent_tool_results(server: LLMServer) -> list[str]:
    """The tool results the model was sent in the last inference request, in order."""
    contents = []
    request = [r for r in server.requests if r.operation == "inference"][-1]
    for message in request.body["messages"]:
        if message["role"] != "tool":
            continue
        content = message["content"]
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        contents.append(content)
    return contents


def python(code: str, **more: Any) -> tuple[str, dict[str, Any]]:
    return ("python", {"code": code, **more})


# --- IPython syntax, through a real InteractiveShell -------------------------------------------


def test_magics_and_shell_commands_run_as_in_a_cell(ip, scripted):
    code = "!echo hi from the shell\nfiles = !echo a b\n%timeit -n 3 -r 2 sum(range(10))\nprint(files)\nlen(files)"
    scripted.script(tool_calls(python(code)), text("Done."))
    ip.run_line_magic("soba", "try IPython syntax")
    result = results(ip)[-1]
    assert not result.is_error, result.content
    assert result.content.startswith("stdout:\nhi from the shell\n")  # a terminal's \r\n as \n
    assert re.search(r"per loop \(mean ± std\. dev\. of 2 runs, 3 loops each\)", result.content)
    assert "['a b']" in result.content and "result: 1" in result.content
    assert list(ip.user_ns["files"]) == ["a b"]  # `x = !cmd` assigns in the user's namespace
    assert sent_tool_results(scripted.server)[-1] == result.content


def test_a_cell_magic_on_the_first_line(ip, nb_dir, scripted):
    scripted.script(tool_calls(python("%%writefile notes.txt\nfirst\nsecond\n")), text("Written."))
    ip.run_line_magic("soba", "write a file with a cell magic")
    assert not results(ip)[-1].is_error, results(ip)[-1].content
    assert (nb_dir / "notes.txt").read_text() == "first\nsecond\n"
    assert "Writing notes.txt" in results(ip)[-1].content


def test_shell_variables_are_expanded_from_the_users_namespace(ip, scripted):
    ip.user_ns["greeting"] = "hello-there"
    scripted.script(tool_calls(python("!echo $greeting")), text("Echoed."))
    ip.run_line_magic("soba", "echo it")
    assert "hello-there" in results(ip)[-1].content


def test_traceback_lines_are_the_models_own_lines(ip, scripted):
    # IPython drops leading blank lines and rewrites `!true`: the line numbers and the text
    # shown are still those the model wrote.
    failing = "\n\n!true\nvalue = 1\nraise ValueError('bad value')"
    broken = "\n!true\nx = (1,\n"
    scripted.script(tool_calls(python(failing), python(broken)), text("Seen."))
    ip.run_line_magic("soba", "fail twice")
    raised, syntax = results(ip)[-2:]
    assert raised.is_error and "error: ValueError: bad value" in raised.content
    assert re.search(r'File "<soba-python-\d+>", line 5, in <module>\n    raise ValueError\(\'bad value\'\)', raised.content)
    assert syntax.is_error and "(line 3)" in syntax.content and "    x = (1," in syntax.content


def test_an_unknown_magic_is_an_error_the_model_can_read(ip, scripted):
    scripted.script(tool_calls(python("%no_such_magic 1")), text("Noted."))
    ip.run_line_magic("soba", "use a magic that does not exist")
    result = results(ip)[-1]
    assert result.is_error and "UsageError" in result.content and "no_such_magic" in result.content
    assert last_result(ip).status == "completed"


def test_a_transformer_that_raises_is_a_one_line_error(ip, scripted):
    def refuse(lines: list[str]) -> list[str]:
        raise ValueError("this shell refuses '%%bad' input\nsecond line")

    ip.input_transformers_post.append(refuse)
    try:
        scripted.script(tool_calls(python("%%bad syntax")), text("Understood."))
        ip.run_line_magic("soba", "try it")
    finally:
        ip.input_transformers_post.remove(refuse)
    result = results(ip)[-1]
    assert result.is_error
    assert result.content == "error: IPython could not transform the code: ValueError: this shell refuses '%%bad' input"
    assert last_result(ip).status == "completed" and last_result(ip).answer == "Understood."


# --- timeout_s, through a real InteractiveShell -------------------------------------------------


def test_a_call_past_its_timeout_is_stopped_and_the_turn_goes_on(ip, scripted):
    handler = signal.getsignal(signal.SIGINT)
    sleeping = "import time\nx = 41\nprint('started')\ntime.sleep(600)\nx = 0"
    scripted.script(tool_calls(python(sleeping, timeout_s=1)), tool_calls(python("x + 1")), text("x is 42."))
    started = time.monotonic()
    ip.run_line_magic("soba", "sleep a long time")
    assert time.monotonic() - started < 30
    stopped, after = results(ip)[-2:]
    assert stopped.is_error
    assert stopped.content.startswith("stdout:\nstarted\nerror: stopped after 1 s (timeout_s)\n")
    assert re.search(r"line 4, in <module>\n    time.sleep\(600\)$", stopped.content)
    assert after.content == "result: 42" and ip.user_ns["x"] == 41
    assert last_result(ip).status == "completed" and last_result(ip).answer == "x is 42."
    assert signal.getsignal(signal.SIGINT) is handler  # put back
    time.sleep(0.3)  # no interrupt of ours arrives after the call


def test_an_endless_loop_is_stopped(ip, scripted):
    scripted.script(tool_calls(python("n = 0\nwhile True:\n    n += 1", timeout_s=0.5)), text("Stopped."))
    ip.run_line_magic("soba", "loop forever")
    result = results(ip)[-1]
    assert result.is_error and "error: stopped after 0.5 s (timeout_s)" in result.content
    assert ip.user_ns["n"] > 0
    assert last_result(ip).status == "completed"


def test_the_default_limit_is_what_is_left_of_the_turn(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.turn_timeout_s = 6")
    scripted.script(tool_calls(python("while True: pass")), text("It was stopped."))
    started = time.monotonic()
    ip.run_line_magic("soba", "loop forever")
    took = time.monotonic() - started
    match = STOPPED.search(results(ip)[-1].content)
    assert match is not None, results(ip)[-1].content
    # What was left of 6 s once the first answer came, rounded up; more than the floor of 3.
    assert 4 <= float(match.group(1)) <= 6 and took < 20
    assert last_result(ip).status == "completed"


def test_code_that_catches_the_interrupt_is_interrupted_again(ip, scripted, monkeypatch):
    monkeypatch.setattr(time_limit_module, "RESEND_S", 0.3)
    code = "import time\ntry:\n    time.sleep(600)\nexcept KeyboardInterrupt:\n    print('caught')\ntime.sleep(600)"
    scripted.script(tool_calls(python(code, timeout_s=0.5)), text("Stopped twice."))
    ip.run_line_magic("soba", "catch it")
    result = results(ip)[-1].content
    assert result.startswith("stdout:\ncaught\nerror: stopped after 0.5 s (timeout_s)")
    assert "line 6" in result


def test_a_users_interrupt_still_cancels_the_turn(ip, scripted):
    handler = signal.getsignal(signal.SIGINT)
    main = threading.main_thread().ident
    assert main is not None
    # The user's interrupt, as the kernel's interrupt button sends it: SIGINT to the process.
    timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
    scripted.script(tool_calls(python("import time\ntime.sleep(600)", timeout_s=60), python("1")), text("Never sent."))
    timer.start()
    try:
        with capture_output():
            ip.run_line_magic("soba", "sleep")
    finally:
        timer.cancel()
    assert last_result(ip).status == "cancelled"
    contents = [r.content for r in results(ip)[-2:]]
    assert contents[0] == "[interrupted by the user]"
    assert len(scripted.inference_requests()) == 1  # nothing more was asked of the model
    assert signal.getsignal(signal.SIGINT) is handler


# --- the time limit itself -----------------------------------------------------------------------


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(project_root=tmp_path, namespace={})


def call(ctx: ToolContext, **arguments: Any) -> Any:
    return run_tool("python", json.dumps(arguments), ctx)


def test_the_default_limit_has_a_floor_when_the_turn_is_nearly_spent(ctx):
    ctx.turn_deadline = time.monotonic() - 100
    started = time.monotonic()
    outcome = call(ctx, code="while True: pass")
    assert "error: stopped after 3 s (timeout_s)" in outcome.content
    assert 2.9 < time.monotonic() - started < 10


def test_outside_a_turn_there_is_no_default_limit(ctx):
    outcome = call(ctx, code="import time\ntime.sleep(0.3)\n'slept'")
    assert outcome.content == "result: 'slept'"


def test_off_the_main_thread_the_interrupt_is_raised_in_the_tools_thread(ctx):
    outcomes: list[Any] = []
    worker = threading.Thread(target=lambda: outcomes.append(call(ctx, code="k = 0\nwhile True:\n    k += 1", timeout_s=0.3)))
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive()
    assert "error: stopped after 0.3 s (timeout_s)" in outcomes[0].content
    assert ctx.namespace["k"] > 0
    time.sleep(0.2)
    assert call(ctx, code="k > 0").content == "result: True"


def test_timeout_s_is_bounded(ctx):
    for bad in (0, -1, 3601):
        outcome = call(ctx, code="1", timeout_s=bad)
        assert outcome.is_error and outcome.content.startswith("python: parameter 'timeout_s':")
        assert "\n" not in outcome.content
    assert call(ctx, code="1", timeout_s=None).content == "result: 1"  # null: the default


def test_a_call_that_ends_in_time_is_not_interrupted_later(ctx):
    outcome = call(ctx, code="import time\ntime.sleep(0.2)\n'done'", timeout_s=0.4)
    assert outcome.content == "result: 'done'"
    time.sleep(0.5)  # past the limit: nothing arrives (pytest would report a KeyboardInterrupt)


# --- in a real kernel ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, LLMServer, Path]]:
    from jupyter_client.manager import start_new_kernel

    home = tmp_path_factory.mktemp("kernel")
    project = home / "project"
    project.mkdir()
    with LLMServer() as server:
        write_soba_json(project, server.url)
        env = {**os.environ, TEST_KEY_ENV: TEST_KEY_VALUE, "HOME": str(home)}
        env = {k: v for k, v in env.items() if not k.startswith("SOBA_") and k != "JPY_SESSION_NAME"}
        manager, client = start_new_kernel(kernel_name="python3", cwd=str(project), env=env)
        try:
            client.execute_interactive("%load_ext soba_nb", timeout=60)
            yield client, server, project
            assert manager.is_alive()
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)


def kernel_stdout(client: Any, code: str, shown: list[str] | None = None) -> str:
    """What `code` prints in the kernel; `shown` gets the text of what it displays."""
    printed: list[str] = []

    def keep(message: dict[str, Any]) -> None:
        if message["msg_type"] == "stream" and message["content"]["name"] == "stdout":
            printed.append(message["content"]["text"])
        elif message["msg_type"] in ("display_data", "update_display_data") and shown is not None:
            shown.append(message["content"]["data"].get("text/plain", ""))

    reply = client.execute_interactive(code, timeout=60, output_hook=keep)
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(printed)


@pytest.mark.timeout(240)
def test_a_real_kernel_stops_a_call_at_its_timeout_and_lives_on(kernel):
    client, server, _ = kernel
    server.script(
        tool_calls(python("import time\nx = 41\nprint('before the sleep')\ntime.sleep(600)", timeout_s=2)),
        tool_calls(python("while True: pass", timeout_s=1)),
        tool_calls(python("x + 1")),
        text("The kernel is fine."),
    )
    started = time.monotonic()
    shown: list[str] = []
    kernel_stdout(client, "%soba sleep, then loop", shown)
    assert time.monotonic() - started < 60
    sleep, loop, after = sent_tool_results(server)[-3:]
    assert sleep.startswith("stdout:\nbefore the sleep\nerror: stopped after 2 s (timeout_s)\n"), sleep
    assert sleep.endswith("line 4, in <module>\n    time.sleep(600)")
    assert loop.startswith("error: stopped after 1 s (timeout_s)"), loop
    assert after == "result: 42"
    assert any("The kernel is fine." in text for text in shown)  # the turn went on to its answer
    assert kernel_stdout(client, "print(x)") == "41\n"  # the variable lives on in the kernel


@pytest.mark.timeout(240)
def test_a_real_kernel_runs_ipython_syntax(kernel):
    client, server, project = kernel
    code = "!echo hi\nlisting = !echo a b\n%timeit -n 3 -r 2 sum(range(10))\nlisting"
    server.script(
        tool_calls(python(code)),
        tool_calls(python("!sleep 600\nprint('after the command')", timeout_s=1)),
        text("Ran."),
    )
    kernel_stdout(client, "%soba run IPython syntax")
    syntax, command = sent_tool_results(server)[-2:]
    assert syntax.startswith("stdout:\nhi\n"), syntax  # ipykernel's `system` prints: the call got it
    assert re.search(r"per loop \(mean ± std\. dev\. of 2 runs, 3 loops each\)", syntax)
    assert syntax.endswith("result: ['a b']")
    # `!cmd` catches the interrupt (it stops the command) and the code goes on: stopped all the same.
    assert "error: stopped after 1 s (timeout_s)" in command
    assert kernel_stdout(client, "print(listing)") == "['a b']\n"
