"""SPEC §9: in JupyterLab the budget monitor sits in the right sidebar.

The kernel side (`soba_nb.notebook.comm`) is tested in a real kernel, the sidebar's part played
by a jupyter_client that opens comms; the sidebar itself in a real JupyterLab server driven by Debian's chromium through Playwright: a notebook
publishes a snapshot, a barrier's progress and its result, and the "soba budget" panel shows
the figures, the live line the kernel words and the result line (and the status bar
`soba 41.2k / 48.8k · $0.0123`, then `soba compacting 82%`), the session's cost line, and shows
them again after a page reload.
Before the notebook loads the extension, the panel's buttons say to load it.

The browser test is skipped (with the reason) without /usr/bin/chromium, Playwright, or the
built extension (`bash labextension/build.sh && pip install --no-deps -e .`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import forget
from jupyter_support import (
    LABEXTENSION_BUILD,
    SOBA_LABEXTENSION,
    JupyterServer,
    browser_page,
    choose_from_menu,
    jupyter_server,
    require_browser,
    run_all_cells,
    server_env,
    wait_for_kernel_idle,
    write_code_notebook,
)

from soba_nb.notebook import comm as monitor_comm
from soba_nb.notebook.comm import TARGET_NAME, publish

SCREENSHOT = Path("/tmp/soba-sidebar.png")
VIEWPORT: Any = {"width": 1400, "height": 800}
PALETTE_ATTEMPTS = 5
PALETTE_WAIT_MS = 2_000
BARRIER_SECONDS = 4
"""How long the notebook's fake barrier stays at 82 %: long enough to see the live line."""

HARD_LIMIT = 48_808
SOFT_LIMIT = 39_046
EFFECTIVE = 41_210
COST_LINE = (
    "Cost: $0.0123 this session (inference $0.0100 · compaction $0.0023) · prices: model.pricing (soba.json)"
)
SNAPSHOT = {
    "type": "snapshot",
    "effective": EFFECTIVE,
    "hardLimit": HARD_LIMIT,
    "softLimit": SOFT_LIMIT,
    "source": "provider_usage",
    "auto": True,
    "lastResult": None,
    "degraded": False,
    "provider": "openai/gpt-4o-mini",
    "session": "budget.soba/s1.jsonl",
    "cost": COST_LINE,
}
LIVE_LINE = "Compacting context before response · 82%"
PROGRESS = {"type": "progress", "percent": 82, "trigger": "auto_threshold", "line": LIVE_LINE}
RESULT_LINE = (
    "Compacted (auto_threshold) · 41,210 → 9,876 tokens · reclaimed 76% · ckpt-0001 · fallback"
)
RESULT = {"type": "result", "line": RESULT_LINE, "outcome": "completed", "degraded": True}
STATUS_TEXT = "soba 41.2k / 48.8k · $0.0123"
NOT_LOADED = "run %load_ext soba_nb in this notebook first"


# --- kernel side: a real ipykernel, the frontend played by a jupyter_client --------------


class Kernel:
    """A kernel and a client that plays the sidebar: runs code, opens comms, reads iopub."""

    def __init__(self, manager: Any, client: Any) -> None:
        self.manager = manager
        self.client = client

    def run(self, code: str) -> list[dict[str, Any]]:
        """Run `code` (it must succeed); the iopub messages of that request."""
        messages: list[dict[str, Any]] = []
        reply = self.client.execute_interactive(
            code, timeout=KERNEL_TIMEOUT_S, output_hook=messages.append
        )
        errors = [m["content"] for m in messages if m["msg_type"] == "error"]
        assert reply["content"]["status"] == "ok", errors
        return messages

    def open_comm(self, comm_id: str) -> None:
        content = {"comm_id": comm_id, "target_name": TARGET_NAME, "data": {"type": "refresh"}}
        self.client.shell_channel.send(self.client.session.msg("comm_open", content))

    def send(self, comm_id: str, data: dict[str, Any]) -> None:
        content = {"comm_id": comm_id, "data": data}
        self.client.shell_channel.send(self.client.session.msg("comm_msg", content))

    def comm_traffic(self, comm_id: str, count: int) -> list[tuple[str, dict[str, Any]]]:
        """The next `count` comm_msg / comm_close messages on `comm_id`: (type, data)."""
        found: list[tuple[str, dict[str, Any]]] = []
        while len(found) < count:
            message = self.client.get_iopub_msg(timeout=KERNEL_TIMEOUT_S)
            content = message["content"]
            if (
                message["msg_type"] in {"comm_msg", "comm_close"}
                and content.get("comm_id") == comm_id
            ):
                found.append((message["msg_type"], content.get("data") or {}))
        return found


KERNEL_TIMEOUT_S = 60


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    """A fresh python3 kernel (this interpreter's ipykernel) in a temp folder; always stopped."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        yield Kernel(manager, client)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


PUBLISH = "from soba_nb.notebook.comm import publish\n"


@pytest.mark.timeout(120)
def test_the_kernel_never_opens_a_comm_itself(kernel: Kernel) -> None:
    """No frontend asked: nothing goes out (nbclient would log "No handler found")."""
    kernel.run("%load_ext soba_nb")
    messages = kernel.run(PUBLISH + f"print(publish({SNAPSHOT!r}), publish({PROGRESS!r}))")
    assert [m for m in messages if m["msg_type"].startswith("comm_")] == []
    printed = "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")
    assert printed.strip() == "False False"


@pytest.mark.timeout(120)
def test_a_frontend_comm_gets_the_last_snapshot_then_every_message(kernel: Kernel) -> None:
    kernel.run("%load_ext soba_nb")
    kernel.run(PUBLISH + f"publish({SNAPSHOT!r})")
    kernel.open_comm("tab-1")
    assert kernel.comm_traffic("tab-1", 1) == [("comm_msg", SNAPSHOT)]  # what it missed

    kernel.open_comm("tab-2")  # a second tab on the same kernel follows too
    assert kernel.comm_traffic("tab-2", 1) == [("comm_msg", SNAPSHOT)]
    messages = kernel.run(PUBLISH + f"assert publish({PROGRESS!r}) and publish({RESULT!r})")
    on_tab_1 = [m["content"]["data"] for m in messages if m["content"].get("comm_id") == "tab-1"]
    on_tab_2 = [m["content"]["data"] for m in messages if m["content"].get("comm_id") == "tab-2"]
    assert on_tab_1 == on_tab_2 == [PROGRESS, RESULT]  # sent within the cell that ran them

    kernel.send("tab-1", {"type": "refresh"})
    assert kernel.comm_traffic("tab-1", 2) == [("comm_msg", SNAPSHOT), ("comm_msg", RESULT)]

    messages = kernel.run("%unload_ext soba_nb")  # the target goes, and so do the comms
    closed = {m["content"]["comm_id"] for m in messages if m["msg_type"] == "comm_close"}
    assert closed == {"tab-1", "tab-2"}
    kernel.open_comm("tab-3")
    assert kernel.comm_traffic("tab-3", 1) == [("comm_close", {})]


@pytest.mark.timeout(120)
def test_without_the_extension_the_kernel_refuses_the_comm(kernel: Kernel) -> None:
    kernel.open_comm("early")
    assert kernel.comm_traffic("early", 1) == [("comm_close", {})]


@pytest.mark.timeout(120)
def test_a_notebook_run_by_nbclient_logs_no_comm_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import nbformat
    from nbclient import NotebookClient

    cells = ["%load_ext soba_nb", PUBLISH + f"publish({SNAPSHOT!r})\npublish({RESULT!r})"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    with caplog.at_level("DEBUG"):
        NotebookClient(
            notebook,
            timeout=KERNEL_TIMEOUT_S,
            kernel_name="python3",
            resources={"metadata": {"path": str(tmp_path)}},
        ).execute()
    assert "comm target" not in caplog.text
    [result] = notebook.cells[1].outputs  # nobody opened a comm: nothing was sent
    assert result["data"]["text/plain"] == "False"


def test_publish_outside_a_kernel_does_nothing() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        assert publish(SNAPSHOT) is False
    finally:
        forget(shell)
        InteractiveShell.clear_instance()


class BrokenComm:
    """An ipykernel comm whose iopub socket is gone."""

    def send(self, data: dict[str, Any]) -> None:
        raise RuntimeError("iopub is gone")

    def on_close(self, callback: Any) -> None:
        pass

    def on_msg(self, callback: Any) -> None:
        pass


def test_publish_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitor_comm, "_comms", [])
    monitor_comm._opened(BrokenComm(), {})
    assert publish(SNAPSHOT) is False
    assert publish({"type": "unknown"}) is False
    assert publish("not a message") is False  # type: ignore[arg-type]


# --- the sidebar in JupyterLab -----------------------------------------------------------


def _extension_installed() -> bool:
    listing = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = (listing.stdout + listing.stderr).splitlines()
    return any(SOBA_LABEXTENSION in line and "enabled" in line and "OK" in line for line in lines)


NOTEBOOK_CELLS = (
    "%load_ext soba_nb",
    # The sidebar opened its comm before this cell ran, so the snapshot reaches it at once.
    f"from soba_nb.notebook.comm import publish\nassert publish({SNAPSHOT!r})",
    f"import time\nassert publish({PROGRESS!r})\ntime.sleep({BARRIER_SECONDS})\nassert publish({RESULT!r})",
)
"""A notebook whose cells publish what the budget monitor would during a barrier."""


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterServer]:
    """`jupyter lab` on a free port, with a token, in a temp folder; always stopped."""
    require_browser()
    if not _extension_installed():
        pytest.skip(f"{SOBA_LABEXTENSION} is not installed in JupyterLab ({LABEXTENSION_BUILD})")
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "root"
    root.mkdir()
    write_code_notebook(root / "budget.ipynb", NOTEBOOK_CELLS)
    env = server_env(tmp, os.environ)
    with jupyter_server("jupyterlab", tmp, root, env) as lab:
        yield lab


@pytest.mark.timeout(180)
def test_sidebar_shows_the_budget_the_barrier_and_the_result(lab_server: JupyterServer) -> None:
    from playwright.sync_api import expect

    with browser_page(VIEWPORT) as page:
        page.goto(lab_server.url("/lab/tree/budget.ipynb"))
        wait_for_kernel_idle(page)

        panel = _open_panel(page)
        expect(panel).to_contain_text("Run %budget or %soba in this notebook")

        # soba_nb is not loaded in the kernel yet: no control target.
        panel.locator(".soba-Budget-compact").click()
        expect(panel.locator(".soba-Budget-answer")).to_have_text(NOT_LOADED)
        expect(panel.locator(".soba-Budget-answer")).to_have_attribute("data-ok", "false")

        run_all_cells(page)
        expect(panel).to_contain_text("41,210 / 48,808 tokens")
        expect(panel).to_contain_text("soft threshold 39,046 · hard limit 48,808")
        expect(panel).to_contain_text("provider usage")
        expect(panel.locator(".soba-Budget-auto")).to_contain_text("on")
        expect(panel.locator(".soba-Budget-cost")).to_have_text(COST_LINE)  # as the kernel words it
        expect(panel.locator(".soba-Budget-fill")).to_have_attribute("data-level", "soft")

        status = page.locator(".soba-StatusItem")
        expect(panel.locator(".soba-Budget-live")).to_have_text(LIVE_LINE)  # as the kernel words it
        expect(status).to_have_text("soba compacting 82%")
        expect(panel).to_contain_text(RESULT_LINE, timeout=(BARRIER_SECONDS + 10) * 1000)
        expect(panel.locator(".soba-Budget-live")).to_have_count(0)
        expect(status).to_have_text(STATUS_TEXT)
        expect(status).to_have_attribute("data-level", "soft")

        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT))

        # A reloaded page sees the kernel still holds a comm (soba is loaded) and opens its own.
        page.reload()
        wait_for_kernel_idle(page)
        panel = _open_panel(page)
        expect(panel).to_contain_text("41,210 / 48,808 tokens")
        expect(panel).to_contain_text(RESULT_LINE)

        # A restarted kernel starts a new session: nothing to show until it publishes.
        _restart_kernel(page)
        expect(panel).to_contain_text("Run %budget or %soba in this notebook")
        run_all_cells(page)
        expect(panel).to_contain_text("41,210 / 48,808 tokens")


def _open_panel(page: Any) -> Any:
    """Open the panel with "soba: show budget" from the command palette."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    panel = page.locator("#soba-budget-panel")
    palette_input = page.locator(".lm-CommandPalette-input")
    # Right after a page load JupyterLab may still move the focus (restoring the layout,
    # activating the notebook), and the modal palette closes when it loses the focus.
    for _attempt in range(PALETTE_ATTEMPTS):
        try:
            choose_from_menu(page, "View", "Activate Command Palette", timeout=PALETTE_WAIT_MS)
            palette_input.fill("soba: show budget", timeout=PALETTE_WAIT_MS)
            page.locator(
                ".lm-CommandPalette-item.lm-mod-active[data-command='soba:show-budget']"
            ).wait_for(timeout=PALETTE_WAIT_MS)
            page.keyboard.press("Enter")
            panel.wait_for(state="visible", timeout=PALETTE_WAIT_MS)
            return panel
        except PlaywrightTimeoutError:
            page.keyboard.press("Escape")
    pytest.fail(f"'soba: show budget' did not open the panel in {PALETTE_ATTEMPTS} attempts")


def _restart_kernel(page: Any) -> None:
    """Kernel > Restart Kernel…, confirmed, then wait until the new kernel is idle."""
    choose_from_menu(page, "Kernel", "Restart Kernel…")
    page.locator(".jp-Dialog .jp-mod-accept").click()
    page.locator(".jp-Dialog").wait_for(state="detached")
    page.locator(".jp-StatusBar-TextItem", has_text="| Idle").first.wait_for()
