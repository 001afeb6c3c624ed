"""Cells as context (SPEC §10), through a real InteractiveShell and its real cell events: what
the user ran reaches the model ahead of the request, with the error and its traceback."""

from __future__ import annotations

import os
import re
from contextlib import contextmanager

import pytest
from conftest import TEST_KEY_ENV, TEST_KEY_VALUE, write_soba_json
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_server import LLMServer, text, tool_calls

from soba_nb.notebook.cell_text import PrintedText
from soba_nb.transcript.entries import CellsEntry, MessageEntry


def run(ip, source: str):
    """A cell as a kernel runs it (stored in history: it gets an execution count)."""
    return ip.run_cell(source, store_history=True)


def magics(ip):
    return ip.magics_manager.registry["SobaMagics"]


def last_request_text(scripted) -> str:
    request = scripted.inference_requests()[-1]
    return "\n".join(str(m.get("content")) for m in request["messages"])


def test_the_failing_cell_above_reaches_the_model(ip, scripted):
    run(ip, "import pandas as pd\nsales = pd.DataFrame({'amount': [1, 2, 3]})")
    run(ip, "print('rows:', len(sales))")
    run(ip, "sales['revenue'].sum()")
    scripted.script(text("The column is called amount, not revenue."))
    ip.run_line_magic("soba", "why does the cell above fail?")
    sent = last_request_text(scripted)
    assert "sales['revenue'].sum()" in sent and "KeyError: 'revenue'" in sent
    assert "In [3]" in sent and "rows: 3" in sent
    assert sent.index("KeyError") < sent.index("why does the cell above fail?")  # ahead of the request
    assert "interactiveshell.py" not in sent  # IPython's own frames are left out
    path = magics(ip).agent.transcript.path()
    cells = [e for e in path if isinstance(e, CellsEntry)]
    assert len(cells) == 1 and [c.execution_count for c in cells[0].cells] == [1, 2, 3]
    assert cells[0].cells[-1].outcome == "error" and "Traceback" in (cells[0].cells[-1].error or "")
    following = path[path.index(cells[0]) + 1]
    assert isinstance(following, MessageEntry) and following.content == "why does the cell above fail?"


def test_only_cells_since_the_last_turn_and_never_soba_own(ip, scripted):
    run(ip, "a = 1")
    scripted.script(text("Noted."), text("Noted again."))
    ip.run_line_magic("soba", "first")
    run(ip, "%budget")
    run(ip, "b = a + 1\nb")
    ip.run_line_magic("soba", "second")
    cells = [e for e in magics(ip).agent.transcript.path() if isinstance(e, CellsEntry)]
    assert [[c.source for c in entry.cells] for entry in cells] == [["a = 1"], ["b = a + 1\nb"]]
    assert cells[-1].cells[0].output == "2"
    ip.run_line_magic("soba", "third, with nothing run in between")
    assert len([e for e in magics(ip).agent.transcript.path() if isinstance(e, CellsEntry)]) == 2


def test_the_first_turn_carries_the_last_five(ip, scripted):
    for index in range(8):
        run(ip, f"x{index} = {index}")
    scripted.script(text("Seen."))
    ip.run_line_magic("soba", "what did I do?")
    [entry] = [e for e in magics(ip).agent.transcript.path() if isinstance(e, CellsEntry)]
    assert [c.source for c in entry.cells] == [f"x{i} = {i}" for i in range(3, 8)]


def test_a_budget_of_zero_turns_it_off_and_secrets_are_redacted(ip, nb_dir, scripted, monkeypatch):
    monkeypatch.setenv("ACME_SERVICE_TOKEN", "zq9XvTpLmRwNs")
    run(ip, "token = 'zq9XvTpLmRwNs'\nprint(token)")
    scripted.script(text("Fine."))
    ip.run_line_magic("soba", "look")
    agent = magics(ip).agent
    assert "zq9XvTpLmRwNs" not in agent.file.read_text()
    assert "zq9XvTpLmRwNs" not in last_request_text(scripted)
    (nb_dir / "soba.json").write_text((nb_dir / "soba.json").read_text().replace('"compaction"', '"notebook": {"contextTokens": 0}, "compaction"'))
    run(ip, "y = 2")
    scripted.script(text("Fine."))
    ip.run_line_magic("soba", "again")
    assert len([e for e in magics(ip).agent.transcript.path() if isinstance(e, CellsEntry)]) == 1


def test_printed_output_is_bounded_and_the_kernel_streams_restored(ip, scripted):
    import sys

    stdout = sys.stdout
    run(ip, "print('z' * 100000)")
    assert sys.stdout is stdout
    recorded = magics(ip).holder.recorder.cells[-1]
    assert len(recorded.printed) < 9000 and "characters not kept" in recorded.printed


# -- the recorder under a demanding user (and an attacker) ----------------------------------------


def recorded(ip):
    return magics(ip).holder.recorder.cells


def test_a_cell_that_runs_a_cell_is_recorded_once_and_leaves_no_tee(ip):
    import sys

    stdout, stderr = sys.stdout, sys.stderr
    run(ip, "get_ipython().run_cell('print(\"inner\")', store_history=True)\nprint('outer')")
    assert sys.stdout is stdout and sys.stderr is stderr
    cell = recorded(ip)[-1]
    assert cell.source.startswith("get_ipython().run_cell(") and cell.printed == "inner\nouter\n"
    run(ip, "print('next')")
    assert recorded(ip)[-1].printed == "next\n"  # not twice
    assert len(recorded(ip)) == 2


def test_a_stream_the_cell_installs_is_the_users_and_stays(ip):
    import sys

    stdout = sys.stdout
    try:
        run(ip, "import io, sys\nbuffer = io.StringIO()\nsys.stdout = buffer\nprint('into the buffer')")
        assert sys.stdout is ip.user_ns["buffer"]  # not clobbered by our restore
        assert ip.user_ns["buffer"].getvalue() == "into the buffer\n"
    finally:
        sys.stdout = stdout
    # A cell keeps the stream it saw (our tee) and puts it back in a later cell; another wraps
    # it in a stream of its own: no tee stays installed and nothing is recorded twice.
    run(ip, "saved = sys.stdout")
    run(ip, "sys.stdout = saved\nprint('through the saved tee')")
    assert sys.stdout is stdout
    assert recorded(ip)[-1].printed == "through the saved tee\n"
    try:
        run(ip, "class Loud:\n    def __init__(self, s): self.s = s\n    def write(self, t): self.s.write(t)\n    def flush(self): self.s.flush()\nsys.stdout = Loud(sys.stdout)")
        run(ip, "print('once')")
        assert recorded(ip)[-1].printed == "once\n"
    finally:
        sys.stdout = stdout


def test_a_syntax_error_is_the_error_not_printed_text(ip, scripted):
    run(ip, "total = sum(\n")
    cell = recorded(ip)[-1]
    assert cell.execution_count == 1 and cell.printed == ""
    assert (cell.error or "").startswith("SyntaxError") and "total = sum(" in (cell.error or "")
    scripted.script(text("An unclosed parenthesis."))
    run(ip, "%soba what is wrong?")
    sent = last_request_text(scripted)
    assert "SyntaxError" in sent and "\x1b[" not in sent


def test_cells_run_without_history_are_not_the_notebooks(ip):
    run(ip, "a = 1")
    ip.run_cell("frontend_probe = 1", store_history=False)  # a frontend's or a library's own code
    run(ip, "b = 2")
    assert [cell.source for cell in recorded(ip)] == ["a = 1", "b = 2"]
    assert [cell.execution_count for cell in recorded(ip)] == [1, 2]


def test_an_interrupted_cell_is_recorded_and_the_next_one_too(ip):
    import sys

    stdout = sys.stdout
    run(ip, "import signal, time\nprint('started')\nsignal.raise_signal(signal.SIGINT)\ntime.sleep(5)")
    assert sys.stdout is stdout
    cell = recorded(ip)[-1]
    assert (cell.error or "").splitlines()[0] == "KeyboardInterrupt" and cell.printed == "started\n"
    run(ip, "print('after')")
    assert recorded(ip)[-1].printed == "after\n" and recorded(ip)[-1].error is None


def test_a_result_is_recorded_as_shown_its_repr_run_once(ip):
    run(ip, "class Counted:\n    shown = 0\n    def __repr__(self):\n        Counted.shown += 1\n        return f'Counted(shown={Counted.shown})'\nCounted()")
    assert ip.user_ns["Counted"].shown == 1  # a slow or stateful repr is not run a second time
    assert recorded(ip)[-1].result == "Counted(shown=1)"
    run(ip, "class Broken:\n    def __repr__(self):\n        raise ValueError('no repr today')\nBroken()")
    cell = recorded(ip)[-1]
    assert cell.error is None and cell.result == "[its repr raised ValueError: no repr today]"
    run(ip, "list(range(1_000_000))")
    result = recorded(ip)[-1].result or ""
    assert len(result) < 2200 and result.startswith("[0,\n 1,")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab \n", max_size=3000), max_size=40))
def test_printed_text_keeps_a_head_and_a_tail_and_counts_the_rest(writes):
    printed = PrintedText(limit=1000)
    for written in writes:
        printed.add(written)
    whole, kept = "".join(writes), printed.text()
    if len(whole) <= 1000:
        assert kept == whole
        return
    head, count, tail = re.fullmatch(r"(.*)\n\[… (\d+) characters not kept …\]\n(.*)", kept, re.DOTALL).groups()
    assert whole.startswith(head) and whole.endswith(tail) and len(head) <= 500 and len(tail) <= 500
    assert int(count) == len(whole) - len(head) - len(tail)


def test_ten_megabytes_printed_keep_head_and_tail_with_the_count(ip):
    run(ip, "for i in range(100_000):\n    print(f'line {i:06d} ' + 'x' * 90)")
    printed = recorded(ip)[-1].printed
    head, count, tail = re.fullmatch(r"(.*)\n\[… (\d+) characters not kept …\]\n(.*)", printed, re.DOTALL).groups()
    assert head.startswith("line 000000 ") and tail.endswith("line 099999 " + "x" * 90 + "\n")
    assert int(count) == 100_000 * len("line 000000 " + "x" * 90 + "\n") - len(head) - len(tail)
    assert len(printed) < 8200


def test_terminal_codes_progress_bars_and_control_characters(ip):
    run(ip, "import sys\nprint('\\x1b[1;31mred\\x1b[0m alert\\x07')\nfor p in range(0, 101, 10):\n    sys.stderr.write(f'\\rtraining {p:3d}%')\nsys.stderr.write('\\n')\nprint('done')")
    assert recorded(ip)[-1].printed == "red alert\\x07\ntraining 100%\ndone\n"
    run(ip, "raise ValueError('\\x1b[31mbad\\x1b[0m value\\rrewritten')")
    assert (recorded(ip)[-1].error or "").splitlines()[0] == "ValueError: bad value\\x0drewritten"  # as it is, escaped


def test_magics_cells_are_recorded_with_their_output_once(ip):
    run(ip, "%%time\nsquares = [n * n for n in range(10)]")
    cell = recorded(ip)[-1]
    assert cell.source.startswith("%%time") and cell.printed.count("Wall time") == 1
    run(ip, "%%capture captured\nprint('kept by the capture')")
    assert recorded(ip)[-1].printed == ""  # captured, not shown: not what the cell printed


def test_a_soba_cell_is_not_teed(ip, llm_server, scripted):
    import sys

    seen = []

    def answer(request):
        seen.append(type(sys.stdout).__name__)
        return text("Answered.")

    llm_server.script(answer)
    run(ip, "%soba hello")
    assert seen and seen[0] != "_Tee"
    assert [cell.source for cell in recorded(ip)] == []


def test_images_are_bounded_over_the_whole_record(ip):
    from soba_nb.notebook.cells import IMAGE_BYTES_KEPT

    image = b"\x89PNG\r\n\x1a\n" + bytes(7 * 1024 * 1024)
    for index in range(6):
        ip.user_ns["image"] = image
        run(ip, f"from IPython.display import display\ndisplay({{'image/png': image, 'text/plain': 'plot {index}'}}, raw=True)")
    kept = [len(cell.images) for cell in recorded(ip)]
    assert sum(len(raw) for cell in recorded(ip) for _, raw in cell.images) <= IMAGE_BYTES_KEPT
    assert kept[-1] == 1 and kept[0] == 0  # the oldest cells' images go first
    assert all(cell.displayed == ["image/png"] for cell in recorded(ip))


SECRET = "zq9XvTpLmRwNs"


def test_a_secret_is_redacted_whole_even_where_the_record_is_clipped(ip, nb_dir, scripted, monkeypatch):
    """The record keeps 4,000 printed characters at each end; the cells block clips a cell's
    output to 1,000 at each end. A secret lying across any of those cuts must not leave a
    piece the redaction no longer recognises, in the cells block or in `read_cells`."""
    monkeypatch.setenv("ACME_SERVICE_TOKEN", SECRET)
    printed = "word " * 199 + SECRET + " done" * 2000 + " " + SECRET + " end" * 747 + "!" + " " + SECRET + " end" * 247 + "\n"
    starts = [at for at in range(len(printed)) if printed.startswith(SECRET, at)]
    for cut, start in zip((1000, len(printed) - 4000, len(printed) - 1001), starts, strict=True):
        assert start < cut < start + len(SECRET)  # each secret lies across a cut
    ip.user_ns["printed"] = printed
    run(ip, f"token = '{SECRET}'\nprint(printed, end='')")
    run(ip, "raise PermissionError('refused: ' + token)")
    scripted.script(tool_calls(("read_cells", {})), text("Fine."))
    run(ip, "%soba what happened?")
    pieces = [SECRET[i : i + 5] for i in range(len(SECRET) - 4)]
    written = magics(ip).agent.file.read_text()
    sent = "\n".join(request.raw.decode() for request in scripted.server.requests)
    assert "refused: [redacted]" in written and "refused: [redacted]" in sent
    assert [piece for piece in pieces if piece in written or piece in sent] == []


# -- under a real kernel ---------------------------------------------------------------------------


@contextmanager
def real_kernel(project):
    """A python3 kernel (ipykernel, its OutStream on sys.stdout) in `project`, soba loaded."""
    from jupyter_client.manager import start_new_kernel

    env = {**os.environ, TEST_KEY_ENV: TEST_KEY_VALUE, "HOME": str(project.parent)}
    env = {k: v for k, v in env.items() if not k.startswith("SOBA_") and k != "JPY_SESSION_NAME"}
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(project), env=env)
    try:
        reply = client.execute_interactive("%load_ext soba_nb", timeout=60)
        assert reply["content"]["status"] == "ok"
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def execute(client, code: str, *, store_history: bool = True) -> tuple[dict, list[dict]]:
    """Run `code` as a frontend does; (the reply, the iopub messages it caused)."""
    messages: list[dict] = []
    reply = client.execute_interactive(code, store_history=store_history, timeout=120, output_hook=messages.append)
    return reply, messages


def streamed(messages: list[dict], name: str) -> str:
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream" and m["content"]["name"] == name)


@pytest.mark.timeout(180)
def test_a_real_kernel_still_streams_what_a_cell_prints(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    with LLMServer() as server:
        write_soba_json(project, server.url)
        with real_kernel(project) as client:
            cell = (
                "import io, sys\nfrom ipykernel.iostream import OutStream\nprint('to stdout')\nsys.stdout.flush()\n"
                "print('to stderr', file=sys.stderr)\nsys.stderr.flush()\nsys.stdout.writelines(['a', 'b\\n'])\n"
                "print(isinstance(sys.stdout, OutStream), isinstance(sys.stderr, io.TextIOBase))"
            )
            reply, messages = execute(client, cell)
            assert reply["content"]["status"] == "ok"
            assert streamed(messages, "stdout") == "to stdout\nab\nTrue True\n" and streamed(messages, "stderr") == "to stderr\n"
            # Cells run without history are not recorded, hence not teed: they see the kernel as is.
            _, messages = execute(client, "print(type(sys.stdout).__name__, type(sys.stderr).__name__)", store_history=False)
            assert streamed(messages, "stdout") == "OutStream OutStream\n"  # no tee left between cells
            probe = "print([c.printed for c in get_ipython().magics_manager.registry['SobaMagics'].holder.recorder.cells])"
            _, messages = execute(client, probe, store_history=False)
            assert streamed(messages, "stdout") == repr(["to stdout\nto stderr\nab\nTrue True\n"]) + "\n"
            _, messages = execute(client, "41 + 1")  # the result still reaches the frontend, and the record
            assert [m["content"]["data"]["text/plain"] for m in messages if m["msg_type"] == "execute_result"] == ["42"]
            _, messages = execute(client, probe.replace("c.printed", "c.result"), store_history=False)
            assert streamed(messages, "stdout") == repr([None, "42"]) + "\n"


@pytest.mark.timeout(180)
def test_a_real_kernels_failing_cell_reaches_the_model_ahead_of_the_request(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    with LLMServer() as server:
        write_soba_json(project, server.url)
        server.script(text("The column is called amount."))
        with real_kernel(project) as client:
            execute(client, "sales = {'amount': [1, 2, 3]}")
            reply, messages = execute(client, "total = sum(sales['revenue'])")
            assert reply["content"]["status"] == "error"
            assert any(m["msg_type"] == "error" for m in messages)  # the frontend still shows it
            execute(client, "%soba why does the cell above fail?")
        [request] = [r for r in server.requests if r.operation == "inference"]
    sent = "\n".join(str(m.get("content")) for m in request["messages"])
    assert "total = sum(sales['revenue'])" in sent and "KeyError: 'revenue'" in sent and "Traceback" in sent
    assert sent.index("KeyError: 'revenue'") < sent.index("why does the cell above fail?")
    assert "In [3]" in sent and "\x1b[" not in sent and "ipykernel" not in sent


def test_a_new_session_starts_with_the_last_five_cells_again(ip, scripted):
    from soba_nb.transcript.entries import CellsEntry

    for index in range(3):
        ip.run_cell(f"a{index} = {index}", store_history=True)
    scripted.script(text("One."), text("Two."))
    ip.run_line_magic("soba", "first")
    ip.run_cell("b = 1", store_history=True)
    ip.run_line_magic("soba", "--new second, in a new session")
    agent = ip.magics_manager.registry["SobaMagics"].agent
    [entry] = [e for e in agent.transcript.path() if isinstance(e, CellsEntry)]
    assert [c.source for c in entry.cells] == ["a0 = 0", "a1 = 1", "a2 = 2", "b = 1"]
