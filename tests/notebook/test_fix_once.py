"""`%soba /fix` sends the failed cell once (SPEC §15), read from the request bodies the loopback
server received: the cell's source and traceback are in the cells block or in the request, never
both; library frames show short paths, never the install prefix; the request describes the
frames the cell names (shapes, columns and dtypes, never values)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pandas
import pytest
from conftest import write_soba_json
from llm_server import LLMServer, text, tool_calls
from test_cells import execute, real_kernel

from soba_nb.notebook.cell_text import short_path, short_paths
from soba_nb.transcript.entries import CellsEntry, MessageEntry, UsageEntry

ROOMY = {"model": {"contextWindow": 65000, "maxOutputTokens": 4000}, "compaction": {"safetyReserveTokens": 4000}}
"""A window nothing in these tests comes near: no compaction moves the cells around."""
LOAD = 'import pandas as pd\ndf = pd.read_csv("sales.csv", parse_dates=["day"])'
DESCRIBE = "df.describe()"
FAILING = 'df.groupby("regon")["amount"].sum()'
FAILED_WITH = "KeyError: 'regon'"
DATA_LINE = re.compile(
    r"^df: DataFrame 1,000 × 3 — columns: region \(str\), amount \(float64\), day \(datetime64\[\w+\]\)$", re.MULTILINE
)
LIBRARY_FOLDER = str(Path(pandas.__file__).resolve().parent.parent)
"""Where pandas is installed (`…/site-packages`): no request may spell it."""


def run(ip, source: str):
    """A cell as a kernel runs it: its events fire and it gets an execution count."""
    return ip.run_cell(source, store_history=True)


def sent_text(request) -> str:
    """Everything the request's messages say, as the model reads it."""
    return "\n".join(str(message.get("content")) for message in request["messages"])


def last_user_message(request) -> str:
    return [m["content"] for m in request["messages"] if m["role"] == "user"][-1]


def write_sales_csv(folder: Path) -> None:
    rows = ["region,amount,day"] + [
        f"{('North', 'South', 'East', 'West')[i % 4]},{(i * 37) % 500 + 0.5},2024-01-{i % 28 + 1:02d}" for i in range(1000)
    ]
    (folder / "sales.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")


def standard_scenario(ip, nb_dir: Path) -> None:
    """A CSV read with pandas, `describe()`, then a groupby on a misspelt column."""
    write_sales_csv(nb_dir)
    assert run(ip, LOAD).success and run(ip, DESCRIBE).success
    assert not run(ip, FAILING).success


def fix_turn_requests(ip, scripted) -> list:
    """`%soba /fix`, the model checking once with python and then answering; the turn's requests."""
    before = len(scripted.inference_requests())
    scripted.script(
        tool_calls(("python", {"code": "print(df.columns.tolist())"}), content="Checking the columns."),
        text('The column is `region`: `df.groupby("region")["amount"].sum()`.'),
    )
    run(ip, "%soba /fix")
    requests = scripted.inference_requests()[before:]
    assert len(requests) == 2
    return requests


def roomy(nb_dir: Path, scripted, notebook: dict | None = None) -> None:
    path = write_soba_json(nb_dir, scripted.server.url, ROOMY)
    if notebook is not None:
        config = json.loads(path.read_text())
        config["notebook"] = notebook
        path.write_text(json.dumps(config))


def test_the_failed_cell_reaches_every_request_of_the_turn_once(ip, nb_dir, scripted):
    roomy(nb_dir, scripted)
    standard_scenario(ip, nb_dir)
    requests = fix_turn_requests(ip, scripted)
    for request in requests:
        sent = sent_text(request)
        assert sent.count(FAILING) == 1 and sent.count(FAILED_WITH) == 1 and sent.count("Traceback") == 1
        assert LIBRARY_FOLDER not in request.raw.decode() and "site-packages" not in request.raw.decode()
        assert "pandas/core/" in sent  # the library's frames are there, under short paths
        assert len(DATA_LINE.findall(sent)) == 1
    first = requests[0]
    fix = last_user_message(first)
    assert fix.startswith("Fix the notebook cell In [3] above, which failed.") and "add_cell" in fix
    assert FAILING not in fix and FAILED_WITH not in fix  # it is in the cells block, ahead
    assert DATA_LINE.search(fix)
    assert sent_text(first).index(FAILED_WITH) < sent_text(first).index("Fix the notebook cell")
    path = ip.magics_manager.registry["SobaMagics"].agent.transcript.path()
    [message] = [e for e in path if isinstance(e, MessageEntry) and e.role == "user"]
    assert message.typed == "/fix" and message.content == fix


def test_a_cell_that_failed_before_the_previous_turn_is_carried_in_the_request(ip, nb_dir, scripted):
    roomy(nb_dir, scripted)
    standard_scenario(ip, nb_dir)
    scripted.script(text("Sales by region, and a typo to fix."))
    run(ip, "%soba what is in this notebook?")  # this turn's block carried the failed cell
    requests = fix_turn_requests(ip, scripted)
    fix = last_user_message(requests[0])
    assert fix.startswith("Fix the notebook cell In [3], which failed. Its source:")
    assert FAILING in fix and FAILED_WITH in fix and "Traceback" in fix
    assert 'File "pandas/core/groupby/grouper.py", line ' in fix and LIBRARY_FOLDER not in fix
    assert DATA_LINE.search(fix)
    path = ip.magics_manager.registry["SobaMagics"].agent.transcript.path()
    assert len([e for e in path if isinstance(e, CellsEntry)]) == 1  # no cell ran since the first turn


@pytest.mark.parametrize("context_tokens", [0, 120], ids=["cells-block-off", "block-too-small-for-the-cell"])
def test_without_the_cell_in_the_block_the_request_carries_it_once(ip, nb_dir, scripted, context_tokens):
    roomy(nb_dir, scripted, {"contextTokens": context_tokens})
    standard_scenario(ip, nb_dir)
    requests = fix_turn_requests(ip, scripted)
    fix = last_user_message(requests[0])
    assert fix.startswith("Fix the notebook cell In [3], which failed. Its source:")
    assert f"```python\n{FAILING}\n```" in fix and FAILED_WITH in fix and "Traceback" in fix
    assert DATA_LINE.search(fix)
    for request in requests:
        assert LIBRARY_FOLDER not in request.raw.decode()
        if context_tokens == 0:
            assert sent_text(request).count(FAILING) == 1


def test_the_data_lines_are_bounded_and_name_no_values(ip, nb_dir, scripted):
    roomy(nb_dir, scripted)
    run(ip, "import numpy as np, pandas as pd\naccounts = pd.DataFrame({'token': ['zz' + '-hidden-' + 'value']})")
    run(ip, "wide = pd.DataFrame({f'c{i}': [i] for i in range(40)})\nmatrix = np.zeros((3, 4))\nplain = [1, 2]")
    names = " + ".join(f"t{i}" for i in range(10))
    run(ip, "\n".join(f"t{i} = pd.Series([1.5, 2.5], name='s{i}')" for i in range(10)))
    assert not run(ip, f"accounts.token + wide + matrix + plain + {names} + missing_name").success
    scripted.script(text("`missing_name` is not defined."))
    run(ip, "%soba /fix")
    fix = last_user_message(scripted.inference_requests()[-1])
    data = fix.split("The data it names, as the kernel holds it now:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert data[0] == "accounts: DataFrame 1 × 1 — columns: token (str)"
    assert data[1].startswith("wide: DataFrame 1 × 40 — columns: c0 (int64), c1 (int64)")
    assert data[1].endswith("c29 (int64), … and 10 more")
    assert data[2] == "matrix: ndarray 3 × 4 (float64)"
    assert data[3:8] == [f"t{i}: Series 2 (float64) — name: s{i}" for i in range(5)]
    assert data[8:] == ["… and 5 more"]  # 8 names at most; `plain` is no frame
    assert "zz-hidden-value" not in scripted.inference_requests()[-1].raw.decode()


FIX_OVER_A_QUESTION = 120
"""What a /fix request may cost over a plain question about the same cells: its instructions and
the data line (about 90 tokens), not the cell and its traceback again (about 300 more)."""


def test_fix_request_size_in_the_standard_scenario(ip, nb_dir, scripted, capsys):
    """The first /fix request of the standard scenario, as soba counts it (o200k_base for gpt-4o),
    against a plain question in a session of its own that carries the same cells."""
    roomy(nb_dir, scripted)
    standard_scenario(ip, nb_dir)
    scripted.script(text("The column is `region`."))
    run(ip, "%soba why does the cell above fail?")
    question = first_sent_tokens(ip)
    run(ip, "%soba --new")  # a new session's first turn carries the same last cells
    fix_turn_requests(ip, scripted)
    fix = first_sent_tokens(ip)
    with capsys.disabled():
        print(f"\n/fix first request: {fix:,} tokens; the same cells with a plain question: {question:,}")
    assert fix - question < FIX_OVER_A_QUESTION


def first_sent_tokens(ip) -> int:
    """The current session's first request, as soba counted what it sent."""
    agent = ip.magics_manager.registry["SobaMagics"].agent
    sent = [e.sent_tokens for e in agent.transcript.path() if isinstance(e, UsageEntry)]
    assert sent and sent[0] is not None
    return sent[0]


# -- short paths, in both traceback shapes -------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "shown"),
    [
        ("/usr/lib/python3/dist-packages/pandas/core/frame.py", "pandas/core/frame.py"),
        ("/home/u/.venv/lib/python3.12/site-packages/pandas/core/frame.py", "pandas/core/frame.py"),
        ("C:\\Users\\u\\.venv\\Lib\\site-packages\\numpy\\core\\fromnumeric.py", "numpy/core/fromnumeric.py"),
        (os.path.join(os.path.dirname(os.__file__), "json", "decoder.py"), "json/decoder.py"),
        (os.path.join(sys.prefix, "share", "tool.py"), "share/tool.py"),
        ("<frozen runpy>", "<frozen runpy>"),
        ("/srv/elsewhere/helpers.py", "/srv/elsewhere/helpers.py"),
    ],
)
def test_a_library_frame_is_named_by_its_short_path(filename, shown):
    assert short_path(filename) == shown


def test_a_users_module_is_named_relative_to_the_project_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert short_path(str(tmp_path / "lib" / "cleaning.py")) == "lib/cleaning.py"


def test_both_traceback_shapes_lose_the_install_prefix():
    ipython = "File /usr/lib/python3/dist-packages/pandas/core/frame.py:13788, in DataFrame.groupby(self, by, level)"
    python = '  File "/home/u/.venv/lib/python3.12/site-packages/pandas/core/frame.py", line 13788, in groupby'
    assert short_paths(ipython) == "File pandas/core/frame.py:13788, in DataFrame.groupby(self, by, level)"
    assert short_paths(python) == '  File "pandas/core/frame.py", line 13788, in groupby'
    assert short_paths(short_paths(python)) == short_paths(python)


def test_a_recorded_traceback_names_library_frames_by_short_paths(ip):
    assert not run(ip, "import json\njson.loads('{')").success
    error = ip.magics_manager.registry["SobaMagics"].holder.recorder.latest_error().error
    assert 'File "json/decoder.py", line ' in error and 'File "In [1]", line 2, in <module>\n' in error
    assert sys.prefix not in error and os.path.dirname(os.__file__) not in error
    assert "json.loads('{')" not in error  # the cell's own line: its source goes beside the error


# -- under a real kernel ---------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_real_kernels_fix_request_has_short_paths_and_the_cell_once(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    with LLMServer() as server:
        write_soba_json(project, server.url, ROOMY)
        server.script(text("The column is `region`."))
        write_sales_csv(project)
        with real_kernel(project) as client:
            for source in (LOAD, DESCRIBE):
                assert execute(client, source)[0]["content"]["status"] == "ok"
            reply, messages = execute(client, FAILING)
            assert reply["content"]["status"] == "error"
            count = reply["content"]["execution_count"]
            shown = [m["content"]["traceback"] for m in messages if m["msg_type"] == "error"]
            assert any(LIBRARY_FOLDER in line for line in shown[0])  # the frontend still shows the full paths
            execute(client, "%soba /fix")
        [request] = [r for r in server.requests if r.operation == "inference"]
    sent, raw = sent_text(request), request.raw.decode()
    assert sent.count(FAILING) == 1 and sent.count(FAILED_WITH) == 1
    assert f'File "In [{count}]", line 1, in <module>' in sent and 'File "pandas/core/groupby/grouper.py", line ' in sent
    assert LIBRARY_FOLDER not in raw and "site-packages" not in raw and "ipykernel" not in raw
    assert f"Fix the notebook cell In [{count}] above, which failed." in sent
    assert re.search(r"^df: DataFrame 1,000 × 3 — columns: region \(str\), amount \(float64\)", sent, re.MULTILINE)
