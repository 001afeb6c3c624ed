"""`soba-nb code SESSION [OUT] [--force]` (SPEC §10, "The agent's code, reproducible"): the
code of the python calls on the current path that ran without error, in order, as a
percent-format script or a notebook — on real transcript files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from soba_nb.cli import main
from soba_nb.transcript.entries import MessageEntry, SessionEntry, ToolCallEntry, ToolResultEntry
from soba_nb.transcript.store import Transcript


def call(store: Transcript, call_id: str, code: str, *, error: bool = False, name: str = "python") -> None:
    store.append(ToolCallEntry(call_id=call_id, name=name, arguments=json.dumps({"code": code})))
    store.append(ToolResultEntry(call_id=call_id, name=name, content="error: boom" if error else "(no output)", is_error=error))


@pytest.fixture
def session(tmp_path: Path) -> Path:
    """Two requests on the current path and one on a branch left by a rewind; the server
    numbers its calls afresh every turn (`call_0` twice), as some local servers do."""
    path = tmp_path / "analysis.soba" / "s1.jsonl"
    with Transcript.open(path, create_header=SessionEntry(notebook="analysis.ipynb", model="openai/gpt-4o")) as store:
        store.append(MessageEntry(role="user", content="Load the sales data"))
        call(store, "call_0", "import pandas as pd\nsales = pd.read_csv('sales.csv')")
        call(store, "call_1", "sales.revenue.sum()", error=True)
        call(store, "call_2", "ls", name="shell")
        done = store.append(MessageEntry(role="assistant", content="Loaded."))
        store.append(MessageEntry(role="user", content="Try a branch we will rewind"))
        call(store, "call_0", "abandoned = True")
        store.rewind(done.id)
        store.append(MessageEntry(role="user", content="Total the amount column"))
        call(store, "call_0", "boom()", error=True)
        call(store, "call_1", "total = sales['amount'].sum()\ntotal")
        store.append(MessageEntry(role="assistant", content="Done."))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cells_of(script: str) -> list[str]:
    return [cell.strip() for cell in script.split("# %%\n")[1:]]


def test_the_script_has_a_cell_per_successful_call_on_the_current_path(capsys, session):
    code, out, err = run(capsys, "code", str(session))
    assert code == 0, err
    cells = cells_of(out)
    assert cells == [
        "# call call_0 · for: Load the sales data\nimport pandas as pd\nsales = pd.read_csv('sales.csv')",
        "# call call_1 · for: Total the amount column\ntotal = sales['amount'].sum()\ntotal",
    ]
    assert "sales.revenue.sum()" not in out and "boom()" not in out  # failed calls left out
    assert "abandoned" not in out  # the rewound branch is not the current path
    assert "ls" not in re.sub(r"^#.*$", "", out, flags=re.M)  # shell calls are not python


def test_an_ipynb_out_is_a_valid_notebook(capsys, session, tmp_path):
    out_file = tmp_path / "steps.ipynb"
    code, out, err = run(capsys, "code", str(session), str(out_file))
    assert code == 0, err
    assert out.strip() == f"wrote the code of 2 python calls to {out_file}"
    notebook = nbformat.read(out_file, as_version=4)
    nbformat.validate(notebook)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.source.splitlines()[0] for cell in code_cells] == [
        "# call call_0 · for: Load the sales data",
        "# call call_1 · for: Total the amount column",
    ]
    assert code_cells[1].source.endswith("total = sales['amount'].sum()\ntotal")


def test_an_existing_out_is_refused_without_force_and_written_with_it(capsys, session, tmp_path):
    out_file = tmp_path / "steps.py"
    out_file.write_text("# my own notes\n")
    code, out, err = run(capsys, "code", str(session), str(out_file))
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and "already exists" in err and "--force" in err
    assert out_file.read_text() == "# my own notes\n"
    code, out, err = run(capsys, "code", str(session), str(out_file), "--force")
    assert code == 0, err
    assert cells_of(out_file.read_text())[0].startswith("# call call_0")


def test_an_out_that_is_a_folder_is_one_line_of_error(capsys, session, tmp_path):
    code, out, err = run(capsys, "code", str(session), str(tmp_path))
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and "is a folder" in err
