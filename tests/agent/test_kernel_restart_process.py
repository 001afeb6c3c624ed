"""Issue 13, with real kernel processes: a notebook's session resumed by a second kernel
(a restart) hears which variables are gone and who built them, tells the model, and
`%soba /rebuild` brings them back. Two nbclient runs in the same folder against the loopback
model server; the second kernel knows nothing but the transcript."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from conftest import TEST_KEY_ENV, TEST_KEY_VALUE, write_soba_json
from llm_server import LLMServer, text, tool_calls
from test_examples import LIMITS, NotebookModel, cell_text, run_notebook, summary_text

from soba_nb.compaction.capsule import parse_capsule
from soba_nb.transcript.entries import CapsuleEntry
from soba_nb.transcript.store import Transcript

BUILD = "import pandas as pd\ndf = pd.DataFrame({'units': [1, 2, 3]})\ntotal = int(df.units.sum())\n"


def write_notebook(path: Path, cells: list[str]) -> Path:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    nbformat.write(notebook, path)
    return path


@pytest.fixture
def folder(tmp_path: Path, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in [v for v in __import__("os").environ if v.startswith("SOBA_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(TEST_KEY_ENV, TEST_KEY_VALUE)
    work = tmp_path / "work"
    work.mkdir()
    write_soba_json(work, llm_server.url, LIMITS)
    return work


@pytest.mark.timeout(300)
def test_a_second_kernel_hears_what_is_gone_and_rebuilds_it(folder, llm_server, monkeypatch):
    model = NotebookModel(llm_server, summary_text({"Goal and constraints": "Total the units."}))
    long_answer = "Built `df`; the total is 6. " + "Each region and month checks out. " * 150
    model.script(tool_calls(("python", {"code": BUILD})), text(long_answer), text("The mean is 2. " + "It holds in every region. " * 40))
    first = write_notebook(
        folder / "analysis.ipynb", ["%load_ext soba_nb", "%soba build the table", "%soba and the mean", "%compact"]
    )
    monkeypatch.setenv("SOBA_COMPACTION_KEEP_RECENT_TOKENS", "200")  # a short session: keep a short tail
    ran = run_notebook(first, monkeypatch)
    assert "Compacted (user)" in cell_text(ran.cells[3]), cell_text(ran.cells[3])

    [session] = [p for p in (folder / "analysis.soba").glob("*.jsonl") if p.name != "flight.jsonl"]
    transcript = Transcript.load(session)
    producer = "`import pandas as pd…`"  # named by its code, as its receipt showed it
    [capsule] = [e for e in transcript.entries if isinstance(e, CapsuleEntry)]
    kernel = parse_capsule(capsule.content).kernel_state
    assert "- df: DataFrame 3×1 · columns: units int64 · built by the agent" in kernel.splitlines()

    # The same notebook in a new kernel process (a restart): the session resumes.
    model.script(text("I will rebuild it first."))
    second = write_notebook(
        folder / "analysis.ipynb",
        ["%load_ext soba_nb", "%soba what is the total", "%soba /rebuild", "print(df.shape, total)"],
    )
    ran = run_notebook(second, monkeypatch)
    said = cell_text(ran.cells[1])
    expected = f"kernel was restarted: df, total are gone; they were built by the agent's python call {producer}"
    assert expected in said, said
    last = model.requests("inference")[-1]
    assert any(expected in json.dumps(m, ensure_ascii=False) for m in last["messages"] if m["role"] == "user")
    rebuilt = cell_text(ran.cells[2])
    assert "python: import pandas as pd… · ok" in rebuilt and "rebuilt df, total (1 call re-run)" in rebuilt
    assert cell_text(ran.cells[3]).strip() == "(3, 1) 6"
