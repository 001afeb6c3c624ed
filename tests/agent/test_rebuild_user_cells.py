"""After a restart, the note tells the user's variables from the agent's, and `/rebuild`
re-runs the user's recorded cells and the agent's calls in the order they ran (issue 44 item 2).

Real InteractiveShells: the user's cells run as a kernel runs them (execution counts, history),
the agent's calls come from the loopback server, and a "restart" is a new shell on the same
session (the transcript stays, the namespace is new).
"""

from __future__ import annotations

import json
from typing import Any

from conftest import new_shell, shut_down
from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

from soba_nb.agent.kernel_state import BUILT_BY_AGENT, kernel_state
from soba_nb.transcript.entries import CellSourcesEntry, MessageEntry, ToolCallEntry

AGENT_CODE = "monthly = {m: sum(v) for m, v in sales.items()}\nbusiest = max(monthly, key=monthly.get)"


def cell(shell: Any, source: str) -> str:
    with capture_output() as shown:
        result = shell.run_cell(source, store_history=True)
    assert result.error_in_exec is None or "raise" in source, result.error_in_exec
    return shown.stdout


def agent(shell: Any) -> Any:
    return shell.magics_manager.registry["SobaMagics"].agent


def restart(shell: Any, nb_dir: Any) -> Any:
    shut_down(shell)
    return new_shell(nb_dir)


def test_the_note_names_your_cell_and_the_agents_call_and_rebuild_reruns_both_in_order(ip, nb_dir, scripted):
    cell(ip, "import math\nsales = {'jan': [3, 4], 'feb': [10, 1]}")
    cell(ip, "sales['mar'] = [math.floor(2.5), 7]")  # changes `sales` in place: the rebuild must run it too
    scripted.script(tool_calls(("python", {"code": AGENT_CODE})), text("February is the busiest."))
    cell(ip, '%soba "which month is busiest?"')
    producer = "`monthly = {m: sum(v) for m, v in sales.items()}…`"  # no entry id: its code, as its receipt showed it

    shell = restart(ip, nb_dir)
    scripted.script(text("I will wait for the rebuild."))
    out = cell(shell, '%soba "and the quietest?"')
    note = (
        f"kernel was restarted: monthly, busiest, sales are gone; monthly, busiest were built by the agent's python call "
        f"{producer}, sales was built by your cell In [1]. `%soba /rebuild` re-runs In [1], In [2], then the call {producer}."
    )
    assert note in out
    sent = scripted.inference_requests()[-1]["messages"]
    told = note.replace("by your cell", "by the user's cell")  # the model is not the one with cells
    assert [m["content"] for m in sent if m["role"] == "user" and told in m["content"]]
    assert not any("your cell" in (m["content"] or "") for m in sent)

    out = cell(shell, "%soba /rebuild")
    assert "[python: your cell In [1] · import math" in out
    assert "[python: your cell In [2] · sales['mar'] = [math.floor(2.5), 7] · ok" in out
    assert "rebuilt monthly, busiest, sales (2 cells and 1 call re-run)" in out
    # `sales` as the agent's call found it: built by In [1], given `mar` by In [2].
    assert shell.user_ns["busiest"] == "feb" and shell.user_ns["monthly"] == {"jan": 7, "feb": 11, "mar": 9}
    entries = agent(shell).transcript.path()
    reruns = [e for e in entries if isinstance(e, CellSourcesEntry) and e.rerun]
    assert [(c.execution_count, c.outcome) for e in reruns for c in e.cells] == [(1, "ok"), (2, "ok")]
    assert not any(isinstance(e, ToolCallEntry) and "sales = {" in json.loads(e.arguments)["code"] for e in entries)
    lines = kernel_state(shell.user_ns, agent(shell).provenance())
    assert [line for line in lines if line.startswith("sales:")][0].endswith(BUILT_BY_AGENT) is False
    assert [line for line in lines if line.startswith("monthly:")][0].endswith(BUILT_BY_AGENT)
    notes = [e.content for e in entries if isinstance(e, MessageEntry) and e.role == "system"]
    assert f"re-running In [1], In [2], then the call {producer} to rebuild monthly, busiest, sales" in notes[-2]


def test_cells_before_soba_and_beside_its_magics_rebuild_without_starting_a_turn(nb_dir, scripted):
    shell = new_shell(nb_dir, load=False)
    try:
        cell(shell, "base = 40")
        cell(shell, "%load_ext soba_nb\nbonus = 2")
        scripted.script(tool_calls(("python", {"code": "answer = base + bonus"})), text("42."))
        cell(shell, '%soba "add them"')
        requests = len(scripted.inference_requests())
        shut_down(shell)
        shell = new_shell(nb_dir)
        out = cell(shell, "%soba /rebuild")
        assert "rebuilt bonus, base, answer (2 cells and 1 call re-run)" in out
        assert shell.user_ns["answer"] == 42
        assert len(scripted.inference_requests()) == requests  # no line of a re-run cell asked the model
    finally:
        shut_down(shell)


def test_a_name_no_recorded_cell_built_is_named_with_what_to_do(ip, nb_dir, scripted):
    ip.user_ns["factor"] = 3  # set from outside any cell: nothing recorded it
    cell(ip, "base = 2")
    scripted.script(tool_calls(("python", {"code": "scaled = base * factor"})), text("Scaled."))
    cell(ip, '%soba "scale it"')
    shell = restart(ip, nb_dir)
    out = cell(shell, "%soba /rebuild")
    assert (
        "rebuild stopped: the re-run of the python call `scaled = base * factor` failed" in out
        and "(2 of 2 run: NameError: name 'factor' is not defined); rebuilt base; still missing: scaled — factor was "
        "built by no cell or call soba recorded: run the cell that makes it, then `%soba /rebuild` again" in out
    )
    assert shell.user_ns["base"] == 2


def test_a_failing_user_cell_stops_the_rebuild_and_is_named(ip, nb_dir, scripted):
    (nb_dir / "rates.txt").write_text("1.5")
    cell(ip, "rate = float(open('rates.txt').read())")
    scripted.script(tool_calls(("python", {"code": "price = 10 * rate"})), text("15."))
    cell(ip, '%soba "price it"')
    (nb_dir / "rates.txt").unlink()  # the cell's file is gone: its re-run fails
    shell = restart(ip, nb_dir)
    out = cell(shell, "%soba /rebuild")
    assert "rebuild stopped: the re-run of your cell In [1] failed (1 of 2 run: FileNotFoundError" in out
    assert "nothing rebuilt; still missing: rate, price" in out


def test_changes_in_place_are_rebuilt_with_what_they_changed(ip, nb_dir, scripted):
    """`df["revenue"] = …` binds no name: without it, the rebuilt `df` lacks the column."""
    cell(ip, "rows = [{'price': 2, 'units': 3}, {'price': 5, 'units': 1}]")
    cell(ip, "for row in rows:\n    row['revenue'] = row['price'] * row['units']")
    cell(ip, "rows.append({'price': 1, 'units': 1, 'revenue': 1})")
    cell(ip, "ignored = len(rows)")  # reads rows, changes nothing: not re-run
    scripted.script(tool_calls(("python", {"code": "rows.sort(key=lambda r: r['revenue'])\ntop = rows[-1]['revenue']"})), text("6."))
    cell(ip, '%soba "the top revenue"')
    shell = restart(ip, nb_dir)
    out = cell(shell, "%soba /rebuild")
    assert "rebuilt rows, top (3 cells and 1 call re-run)" in out, out
    assert "len(rows)" not in out
    assert shell.user_ns["top"] == 6 and [r["revenue"] for r in shell.user_ns["rows"]] == [1, 5, 6]
