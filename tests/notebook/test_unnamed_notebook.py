"""Under `jupyter nbconvert --execute` and papermill the kernel is not told its notebook (issue
44 item 7).

nbclient starts the kernel in the notebook's folder and sets neither `__session__` nor
`JPY_SESSION_NAME`: the session goes to `untitled.soba/` there, and the first `%soba` says
so in one line, with how to name it. Following that line (`JPY_SESSION_NAME` for the
kernel) puts the session next to the notebook. A real `jupyter nbconvert` run, and a real
`papermill` run (it records the input's path in the output notebook's metadata, never tells the
kernel), against the loopback server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TEST_KEY_ENV, TEST_KEY_VALUE, write_soba_json

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbconvert")
pytest.importorskip("ipykernel")

ANSWER = "Hello from the test server."


def write_notebook(folder: Path) -> Path:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("%load_ext soba_nb"), nbformat.v4.new_code_cell("%soba say hello")]
    path = folder / "report.ipynb"
    nbformat.write(notebook, path)
    return path


def execute(path: Path, home: Path, **extra: str) -> str:
    """`jupyter nbconvert --to notebook --execute` in place; the `%soba` cell's output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOBA_") and k != "JPY_SESSION_NAME"}
    env.update({"HOME": str(home), TEST_KEY_ENV: TEST_KEY_VALUE, **extra})
    jupyter = shutil.which("jupyter")
    command = [jupyter] if jupyter else [sys.executable, "-m", "jupyter"]
    subprocess.run(
        [*command, "nbconvert", "--to", "notebook", "--execute", "--inplace", str(path)],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    cell = nbformat.read(path, as_version=4).cells[1]
    return "".join(o.get("text", "") or str(o.get("data", {}).get("text/plain", "")) for o in cell.outputs)


def sessions(folder: Path) -> list[Path]:
    return [p for p in folder.glob("*.jsonl") if p.name != "flight.jsonl"]


@pytest.fixture
def work(tmp_path: Path, llm_server) -> tuple[Path, Path, Path]:
    """(the notebook's folder with its soba.json, a HOME, the notebook)."""
    folder = tmp_path / "work"
    folder.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    write_soba_json(folder, llm_server.url)
    return folder, home, write_notebook(folder)


def test_nbconvert_says_where_the_session_went_and_how_to_name_it(work):
    folder, home, path = work

    shown = execute(path, home)

    assert ANSWER in shown
    untitled = folder / "untitled.soba"
    assert len(sessions(untitled)) == 1
    (line,) = [line for line in shown.splitlines() if "was not told its notebook" in line]
    assert f"{untitled}/" in line
    assert "JPY_SESSION_NAME" in line and "%soba --session" in line

    shutil.rmtree(untitled)
    named = execute(path, home, JPY_SESSION_NAME=str(path))

    assert ANSWER in named and "was not told its notebook" not in named
    assert len(sessions(folder / "report.soba")) == 1
    assert not untitled.exists()


def test_papermill_says_where_the_session_went_and_how_to_name_it(work):
    papermill = shutil.which("papermill")
    if papermill is None:
        pytest.skip("papermill is not installed (pip install -e '.[test]')")
    folder, home, path = work
    out = folder / "report-run.ipynb"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOBA_") and k != "JPY_SESSION_NAME"}
    env.update({"HOME": str(home), TEST_KEY_ENV: TEST_KEY_VALUE})

    def run(**extra: str) -> str:
        subprocess.run(
            [papermill, str(path), str(out), "-k", "python3", "--cwd", str(folder), "--log-level", "ERROR"],
            cwd=home, env={**env, **extra}, capture_output=True, text=True, timeout=180, check=True,
        )
        cell = nbformat.read(out, as_version=4).cells[1]
        return "".join(o.get("text", "") or str(o.get("data", {}).get("text/plain", "")) for o in cell.outputs)

    shown = run()
    assert ANSWER in shown
    untitled = folder / "untitled.soba"
    assert len(sessions(untitled)) == 1
    (line,) = [line for line in shown.splitlines() if "was not told its notebook" in line]
    assert f"{untitled}/" in line and "papermill" in line and "JPY_SESSION_NAME" in line

    shutil.rmtree(untitled)
    named = run(JPY_SESSION_NAME=str(path))
    assert ANSWER in named and "was not told its notebook" not in named
    assert len(sessions(folder / "report.soba")) == 1
