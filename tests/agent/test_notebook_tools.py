"""The notebook tools (SPEC §10): `read_cells`, `read_notebook`, `add_cell` — through a real
InteractiveShell, and the proposed cell as the `set_next_input` payload of a real kernel's
execute_reply (what JupyterLab, Notebook 7 and VS Code insert below the running cell)."""

from __future__ import annotations

import json
import os
import re

import pytest
from conftest import TEST_KEY_ENV, TEST_KEY_VALUE, write_soba_json
from IPython.utils.capture import capture_output
from llm_server import LLMServer, text, tool_calls

from soba_nb.transcript.entries import ToolResultEntry


def results(ip) -> list[ToolResultEntry]:
    agent = ip.magics_manager.registry["SobaMagics"].agent
    return [e for e in agent.transcript.path() if isinstance(e, ToolResultEntry)]


def test_read_cells_by_execution_count(ip, scripted):
    for source in ("a = 1", "b = a + 1", "c = b / 0", "d = 4"):
        ip.run_cell(source, store_history=True)
    scripted.script(
        tool_calls(("read_cells", {"first": 2, "last": 3}), ("read_cells", {}), ("read_cells", {"first": 40})),
        text("Read."),
    )
    ip.run_line_magic("soba", "look at cells 2 and 3")
    some, default, none = results(ip)[-3:]
    assert "In [2]" in some.content and "In [3]" in some.content and "In [1]" not in some.content
    assert "ZeroDivisionError" in some.content
    assert re.findall(r"^In \[(\d+)\]:$", default.content, re.M) == ["1", "2", "3", "4"]
    assert none.content.startswith("no recorded cells")


def test_read_notebook_shows_cells_outputs_and_names_images(ip, nb_dir, scripted):
    notebook = {
        "nbformat": 4, "nbformat_minor": 5, "metadata": {},
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# Sales\n", "Monthly revenue."]},
            {"cell_type": "code", "metadata": {}, "execution_count": 3, "source": "df.plot()",
             "outputs": [{"output_type": "display_data", "metadata": {}, "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure size 640x480>"}},
                         {"output_type": "error", "ename": "KeyError", "evalue": "'revenue'", "traceback": []}]},
        ],
    }
    (nb_dir / "report.ipynb").write_text(json.dumps(notebook))
    scripted.script(
        tool_calls(("read_notebook", {"path": "report.ipynb"}), ("read_notebook", {"path": "../outside.ipynb"}), ("read_notebook", {"path": "soba.json"})),
        text("Read."),
    )
    ip.run_line_magic("soba", "read the report")
    good, outside, not_a_notebook = results(ip)[-3:]
    assert "[markdown]\n# Sales" in good.content and "In [3]" in good.content and "df.plot()" in good.content
    assert "[image: image/png]" in good.content and "iVBORw0KGgo" not in good.content
    assert "raised KeyError: 'revenue'" in good.content
    assert outside.is_error and "outside the project" in outside.content
    assert not_a_notebook.is_error and "not a notebook" in not_a_notebook.content


def test_add_cell_proposes_without_running_and_shows_the_source(ip, scripted):
    fixed = "sales['amount'].sum()"
    scripted.script(tool_calls(("add_cell", {"source": "sales['revenue'].sum()"}), ("add_cell", {"source": fixed})), text("Proposed."))
    with capture_output() as out:
        ip.run_line_magic("soba", "fix it")
    assert "Proposed code cell" in out.stdout and fixed in out.stdout and "sales['revenue'].sum()" in out.stdout
    assert ip.rl_next_input == fixed  # the last one goes below the running cell
    assert "sales" not in ip.user_ns  # nothing ran
    assert all(not r.is_error for r in results(ip)[-2:])


@pytest.mark.timeout(180)
def test_a_real_kernel_answers_with_the_set_next_input_payload(tmp_path, monkeypatch):
    from jupyter_client.manager import start_new_kernel

    project = tmp_path / "project"
    project.mkdir()
    with LLMServer() as server:
        write_soba_json(project, server.url)
        proposed = "revenue = sales['amount'].sum()\nrevenue"
        server.script(tool_calls(("add_cell", {"source": proposed})), text("Here is the corrected cell."))
        env = {**os.environ, TEST_KEY_ENV: TEST_KEY_VALUE, "HOME": str(tmp_path)}
        env = {k: v for k, v in env.items() if not k.startswith("SOBA_") and k != "JPY_SESSION_NAME"}
        manager, client = start_new_kernel(kernel_name="python3", cwd=str(project), env=env)
        try:
            client.execute_interactive("%load_ext soba_nb", timeout=60)
            reply = client.execute_interactive("%soba fix the cell above", timeout=120)
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    payloads = reply["content"].get("payload") or []
    assert [p for p in payloads if p.get("source") == "set_next_input"] == [
        {"source": "set_next_input", "text": proposed, "replace": False}
    ]
