"""`%soba /code` exports code that runs on its own (issue 44 item 1).

A realistic session in a real InteractiveShell: the user's cells import pandas, seed numpy,
write and load a CSV, use IPython syntax (`%time`, `!echo`), raise once, `display` a table and
hold a secret; the agent's `python` call builds a monthly table from the user's `sales`; a
cell after the turn uses what the agent built. The exported script is then run by a fresh
interpreter (`python session_code.py`) in the notebook's folder, with the CSV files deleted:
it must rebuild them, byte for byte, and print what the kernel printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from conftest import new_shell, shut_down
from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

from soba_nb.agent.code_export import export_code, session_code
from soba_nb.agent.script_python import plain_python
from soba_nb.cli import main
from soba_nb.transcript.entries import CellRecord, CellsEntry, CellSourcesEntry, MessageEntry

SECRET = "sk-proj-a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
AGENT_CODE = (
    "monthly = sales.groupby('month')['amount'].sum()\n"
    "monthly.to_csv('monthly.csv')\n"
    "print('busiest', monthly.idxmax())"
)


def run_cell(ip: Any, source: str) -> Any:
    """A cell as a kernel runs it: its events fire and it gets an execution count."""
    return ip.run_cell(source, store_history=True)


def run_script(folder: Any, name: str) -> subprocess.CompletedProcess[str]:
    """`python NAME` in a fresh interpreter, in the notebook's folder; it must exit 0."""
    ran = subprocess.run([sys.executable, name], cwd=folder, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    return ran


def agent_of(ip: Any) -> Any:
    return ip.magics_manager.registry["SobaMagics"].agent


def realistic_session(ip: Any, scripted: Any) -> None:
    run_cell(ip, "import numpy as np\nimport pandas as pd\nnp.random.seed(7)")
    run_cell(
        ip,
        "months = np.repeat(['2026-01', '2026-02', '2026-03'], 5)\n"
        "pd.DataFrame({'month': months, 'amount': np.random.randint(10, 100, 15)}).to_csv('sales.csv', index=False)",
    )
    run_cell(ip, "sales = pd.read_csv('sales.csv')\n%time rows = len(sales)\n!echo loaded")
    run_cell(ip, "sales['revenue'].sum()")  # raises KeyError: the script must not replay it
    run_cell(ip, f"token = '{SECRET}'\ndisplay(sales.head(2))")
    scripted.script(tool_calls(("python", {"code": AGENT_CODE})), text("2026-02 is the busiest month."))
    with capture_output():
        run_cell(ip, '%soba "monthly totals: which month is busiest?"')
    run_cell(ip, "best = monthly.idxmax()\nprint('best month', best, 'of', rows, 'rows')")


def test_the_exported_script_runs_alone_and_reproduces_the_session(ip, nb_dir, scripted):
    realistic_session(ip, scripted)
    busiest = ip.user_ns["monthly"].idxmax()
    with capture_output() as shown:
        run_cell(ip, "%soba /code session_code.py")
    assert shown.stdout.strip() == "wrote the code of 5 cells of yours and 1 python call to session_code.py"
    script = (nb_dir / "session_code.py").read_text()
    # `soba-nb code` reads the same transcript from outside the kernel: the same script.
    assert main(["code", str(agent_of(ip).file), str(nb_dir / "from_cli.py")]) == 0
    assert (nb_dir / "from_cli.py").read_text() == script
    monthly_csv = (nb_dir / "monthly.csv").read_bytes()
    sales_csv = (nb_dir / "sales.csv").read_bytes()
    (nb_dir / "monthly.csv").unlink()
    (nb_dir / "sales.csv").unlink()

    ran = run_script(nb_dir, "session_code.py")

    assert ran.stdout.splitlines()[-2:] == [f"busiest {busiest}", f"best month {busiest} of 15 rows"]
    assert (nb_dir / "sales.csv").read_bytes() == sales_csv  # the seed cell came along
    assert (nb_dir / "monthly.csv").read_bytes() == monthly_csv
    # What the script says of itself, and what it left out.
    assert SECRET not in script and "token = '[redacted]'" in script
    steps = script.split("# %%\n")[1:]
    assert [step.splitlines()[0] for step in steps] == [
        "# In [1] · your cell",
        "# In [2] · your cell",
        "# In [3] · your cell",
        "# In [5] · your cell",
        f"# call {_call_id(ip)} · for: monthly totals: which month is busiest?",
        "# In [7] · your cell",
    ]
    assert "sales['revenue']" not in script
    assert "rows = len(sales)  # IPython only, left out: %time\npass  # IPython only, left out: !echo loaded" in script
    header = script.split("# %%")[0]
    flat = " ".join(line.removeprefix("#").strip() for line in header.splitlines() if line.startswith("#"))
    assert "python <this file>" in flat
    assert "cells that raised: In [4]" in flat
    assert "IPython-only lines left out (each marked where it was): %time, !echo loaded" in flat
    assert "Needs the packages: numpy " in flat and "pandas " in flat
    assert "Writes: sales.csv, monthly.csv" in flat
    assert "Secrets were written as [redacted] in: In [5]" in flat
    assert "\nfrom IPython.display import display\n" in header


def _call_id(ip: Any) -> str:
    from soba_nb.transcript.entries import ToolCallEntry

    return next(e.call_id for e in agent_of(ip).transcript.path() if isinstance(e, ToolCallEntry))


def test_the_transcript_keeps_every_cell_whole_and_the_model_reads_each_once(ip, nb_dir, scripted):
    long_cell = "values = [\n" + "".join(f"    {n},  # a long list the model's view clips\n" for n in range(400)) + "]"
    run_cell(ip, long_cell)
    realistic_session(ip, scripted)
    with capture_output():
        run_cell(ip, "%soba /code")
    entries = [e for e in agent_of(ip).transcript.path() if isinstance(e, CellSourcesEntry)]
    first, after_turn = entries
    # The first record of the session in this kernel holds every cell the kernel ran, whole;
    # the model's view of that turn held the last five, the long one clipped or left out.
    assert [c.execution_count for c in first.cells] == [1, 2, 3, 4, 5, 6]
    assert first.cells[0].source == long_cell
    assert [c.outcome for c in first.cells] == ["ok", "ok", "ok", "ok", "error", "ok"]
    assert SECRET not in json.dumps([c.source for c in first.cells])
    assert [c.execution_count for c in after_turn.cells] == [8]  # In [7] is the %soba turn
    request = json.dumps(scripted.inference_requests()[0].body)
    assert request.count("np.random.seed(7)") == 1  # the cells block only: cell_sources is not sent


def test_cells_run_before_soba_was_loaded_are_exported_and_marked(nb_dir, scripted):
    shell = new_shell(nb_dir, load=False)  # as a kernel before `%load_ext soba_nb`
    try:
        shell.run_cell("base = 40", store_history=True)
        shell.run_cell("%load_ext soba_nb\nbonus = 2", store_history=True)
        with capture_output():
            shell.run_cell("%checkpoint beside code\nbonus = bonus * 1", store_history=True)
        scripted.script(tool_calls(("python", {"code": "answer = base + bonus\nprint(answer)"})), text("42."))
        with capture_output():
            shell.run_cell('%soba "add them"', store_history=True)
            shell.run_cell("%soba /code out.py", store_history=True)
        script = (nb_dir / "out.py").read_text()
        assert "# In [1] · your cell (ran before or with %load_ext soba_nb: whether it raised was not recorded)\nbase = 40" in script
        assert "pass  # IPython only, left out: %load_ext soba_nb\nbonus = 2" in script
        # A cell with soba's magics beside its code, after the load: how it ended was seen.
        assert "# In [3] · your cell\npass  # IPython only, left out: %checkpoint beside code\nbonus = bonus * 1" in script
        ran = run_script(nb_dir, "out.py")
        assert ran.stdout.strip() == "42"
    finally:
        shut_down(shell)


def test_a_session_recorded_before_whole_sources_falls_back_to_the_model_view():
    path = [
        CellsEntry(cells=[
            CellRecord(execution_count=1, source="x = 1"),
            CellRecord(execution_count=2, source="y = [\n[… 900 characters clipped …]\n]"),
            CellRecord(execution_count=3, source="x.oops", outcome="error", error="AttributeError"),
        ]),
        MessageEntry(role="user", content="go"),
    ]
    found = session_code(path)
    assert [step.label for step in found.steps] == ["In [1]"]
    assert found.clipped == ["In [2]"] and found.raised == ["In [3]"] and found.from_model_view
    script = export_code(path, None, title="t").text
    assert "before whole cell sources were" in script and "recorded only clipped: In [2]" in script


def test_ipython_syntax_becomes_plain_python_that_compiles():
    loop = plain_python("for name in names:\n    !echo {name}\n    files = !ls\n    %time n = len(name)\nnames?\n%pip install polars==1.0")
    assert loop.text == (
        "for name in names:\n"
        "    pass  # IPython only, left out: !echo {name}\n"
        "    pass  # IPython only, left out: files = !ls\n"
        "    n = len(name)  # IPython only, left out: %time\n"
        "pass  # IPython only, left out: names?\n"
        "pass  # IPython only, left out: %pip install polars==1.0"
    )
    assert loop.installs == ["polars==1.0"] and not loop.whole_left_out
    timed = plain_python("%%time\ntotal = sum(range(10))")
    assert timed.text == "# IPython only, left out: %%time\ntotal = sum(range(10))"
    bash = plain_python("%%bash\nls -la\nfor f in *; do echo $f; done")
    assert bash.whole_left_out and bash.text.splitlines()[1:] == ["# %%bash", "# ls -la", "# for f in *; do echo $f; done"]
    compile(bash.text, "cell", "exec")
    assert plain_python("x = 1\nx").text == "x = 1\nx"


def test_a_rewind_keeps_the_cells_that_ran_in_the_export_and_the_rebuild(ip, nb_dir, scripted):
    """`%rewind` takes the conversation back, not the kernel: a cell run after the checkpoint
    still ran, and the later work may use what it made."""
    from soba_nb.transcript.entries import CheckpointEntry

    run_cell(ip, "base = 10")
    scripted.script(text("Noted."))
    with capture_output():
        run_cell(ip, '%soba "remember base"')
    [turn] = [e for e in agent_of(ip).transcript.path() if isinstance(e, CheckpointEntry) and e.kind == "turn"]
    run_cell(ip, "extra = base + 5")  # recorded at the next turn's start, on the branch the rewind leaves
    scripted.script(tool_calls(("python", {"code": "undone = 1"})), text("Done."))
    with capture_output():
        run_cell(ip, '%soba "work we will rewind"')
        run_cell(ip, f"%rewind {turn.checkpoint_id}")
    scripted.script(tool_calls(("python", {"code": "total = extra * 2\nprint(total)"})), text("30."))
    with capture_output():
        run_cell(ip, '%soba "double extra"')
        run_cell(ip, "%soba /code out.py")
    script = (nb_dir / "out.py").read_text()
    assert "extra = base + 5" in script and "undone = 1" not in script  # the cell stays; the rewound call goes
    ran = run_script(nb_dir, "out.py")
    assert ran.stdout.strip() == "30"

    shut_down(ip)
    shell = new_shell(nb_dir)
    with capture_output() as shown:
        shell.run_cell("%soba /rebuild", store_history=True)
    assert "rebuilt total, extra (2 cells and 1 call re-run)" in shown.stdout, shown.stdout
    assert shell.user_ns["total"] == 30


def test_after_a_restart_and_a_rebuild_each_step_is_exported_once(ip, nb_dir, scripted):
    run_cell(ip, "total = 1")
    scripted.script(tool_calls(("python", {"code": "doubled = total * 2"})), text("Doubled."))
    with capture_output():
        run_cell(ip, '%soba "double it"')
    shut_down(ip)
    shell = new_shell(nb_dir)  # a restart: /rebuild re-runs In [1] and the call
    try:
        with capture_output():
            shell.run_cell("%soba /rebuild", store_history=True)
        shell.run_cell("print(doubled + 1)", store_history=True)
        with capture_output():
            shell.run_cell("%soba /code out.py", store_history=True)
        script = (nb_dir / "out.py").read_text()
        assert script.count("total = 1") == 1 and script.count("doubled = total * 2") == 1  # re-runs are not steps
        assert "# (another kernel from here: its cells are numbered from 1 again)\n# In [2] · your cell\nprint(doubled + 1)" in script
        ran = run_script(nb_dir, "out.py")
        assert ran.stdout.strip() == "3"
    finally:
        shut_down(shell)


def test_sources_keep_their_execution_counts_when_ipython_skips_one(ip, nb_dir, scripted):
    """IPython keeps no history for `exit`/`quit()` though the count goes on: its history list
    then drifts from the counts. The recorder keeps sources by count."""
    run_cell(ip, "a = 1")
    ip.run_cell("quit()", store_history=True)  # In [2]: counted, not in IPython's history list
    ip.exit_now = False
    run_cell(ip, "b = a + 1")
    scripted.script(tool_calls(("python", {"code": "print(b * 10)"})), text("20."))
    with capture_output():
        run_cell(ip, '%soba "times ten"')
        run_cell(ip, "%soba /code out.py")
    script = (nb_dir / "out.py").read_text()
    assert "# In [1] · your cell\na = 1" in script and "# In [3] · your cell\nb = a + 1" in script
    assert "quit()" not in script  # it ends a kernel: a script replaying it would stop there
    ran = run_script(nb_dir, "out.py")
    assert ran.stdout.strip() == "20"
