"""Cells as context (SPEC §10), through a real InteractiveShell and its real cell events: what
the user ran reaches the model ahead of the request, with the error and its traceback."""

from __future__ import annotations

from llm_server import text

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
