"""The user's kernel outlives the embedded model: kill the model mid-answer, the variables stay.

Found by a new user: llama.cpp, built for another CPU, segfaulted at the first decode inside
the notebook kernel, which died and took the user's variables with it. The model now runs
in its own process; here a real Jupyter kernel (nbclient) runs `%soba` on the embedded
model while the test kills the model process with SIGKILL (as the out-of-memory killer
would). The cell ends with a one-line error, the next cell still sees `x`, and the next
`%soba` starts the model again.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from soba_nb.providers.local_model import local_model_available

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytestmark = pytest.mark.skipif(not local_model_available(), reason="the `local` extra is not installed")

CELL_TIMEOUT_S = 300
ENGINE_MARK = "soba_nb.engine"


def output_text(output: object) -> str:
    if output.output_type == "stream":  # type: ignore[attr-defined]
        return str(output.text)  # type: ignore[attr-defined]
    data = getattr(output, "data", {}) or {}
    return str(data.get("text/plain", ""))


def engines_of(parent: int) -> list[int]:
    """Engine processes started by `parent` (their `--parent` argument)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if ENGINE_MARK in words and "--parent" in words and words[words.index("--parent") + 1] == str(parent):
            found.append(int(entry.name))
    return found


def kill_the_model_once_it_answers(client: object, killed: list[int], stop: threading.Event) -> None:
    """Wait for the kernel's engine to be serving a request for a moment, then SIGKILL it."""
    while not stop.is_set():
        manager = getattr(client, "km", None)
        process = getattr(getattr(manager, "provisioner", None), "process", None)
        if process is not None:
            engines = engines_of(process.pid)
            if engines:
                stop.wait(12)  # loaded (a few seconds) and in the middle of the long answer
                for pid in engines_of(process.pid):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                return
        stop.wait(0.2)


def test_killing_the_model_mid_answer_leaves_the_kernel_and_its_variables(tmp_path, monkeypatch):
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    for variable in [v for v in os.environ if v.startswith("SOBA_")]:
        monkeypatch.delenv(variable)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = tmp_path / "work" / "survive.ipynb"
    path.parent.mkdir(parents=True)
    cells = [
        "%load_ext soba_nb\nx = 41",
        "%soba Write a very long story about a dragon, a knight and a lost castle, with many chapters.",
        "print(x + 1)",
        "%soba Say hello in one short sentence.",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    nbformat.write(notebook, path)
    monkeypatch.setenv("JPY_SESSION_NAME", str(path))
    client = nbclient.NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=kill_the_model_once_it_answers, args=(client, killed, stop), daemon=True)
    killer.start()
    started = time.monotonic()
    try:
        client.execute()
    finally:
        stop.set()
        killer.join(5)
        manager = client.km
        if manager is not None and manager.has_kernel:
            manager.shutdown_kernel(now=True)
    outputs = ["".join(output_text(o) for o in cell.outputs) for cell in notebook.cells]
    errors = [o for cell in notebook.cells for o in cell.outputs if o.output_type == "error"]
    assert killed, f"the model process was never seen: {outputs}"
    assert errors == [], errors
    assert "killed (SIGKILL: out of memory, or stopped from outside)" in outputs[1]
    assert "kernel and your variables are fine" in outputs[1]
    assert outputs[2].strip() == "42"  # the kernel lived on, and so did x
    assert outputs[3].strip() and "failed" not in outputs[3]  # the model started again
    assert time.monotonic() - started < 4 * CELL_TIMEOUT_S
