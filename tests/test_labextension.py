"""SPEC §9: in JupyterLab the budget monitor sits in the right sidebar.

The kernel side (`soba_nb.notebook.comm.publish`) is tested with a fake kernel; the sidebar
itself in a real JupyterLab server driven by Debian's chromium through Playwright: a notebook
publishes a snapshot, a barrier's progress and its result, and the "soba budget" panel shows
the figures, the live line and the result line, and shows them again after a page reload.

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
}
PROGRESS = {"type": "progress", "percent": 82, "trigger": "auto_threshold"}
RESULT_LINE = (
    "Compacted (auto_threshold) · 41,210 → 9,876 tokens · reclaimed 76% · ckpt-0001 · fallback"
)
RESULT = {"type": "result", "line": RESULT_LINE, "degraded": True}


# --- kernel side -------------------------------------------------------------------------


class FakeComm:
    """Records what `publish` sends; `close_from_frontend` plays a frontend without the target."""

    def __init__(self, target_name: str, data: dict[str, Any]) -> None:
        self.target_name = target_name
        self.sent = [data]
        self._closed = False
        self._on_close: Any = None
        self._on_msg: Any = None

    def send(self, data: dict[str, Any]) -> None:
        self.sent.append(data)

    def on_close(self, callback: Any) -> None:
        self._on_close = callback

    def on_msg(self, callback: Any) -> None:
        self._on_msg = callback

    def close_from_frontend(self) -> None:
        self._closed = True
        self._on_close({})

    def receive(self, data: dict[str, Any]) -> None:
        self._on_msg({"content": {"data": data}})


@pytest.fixture
def fake_kernel(monkeypatch: pytest.MonkeyPatch) -> list[FakeComm]:
    """A shell with a kernel attribute (as in ipykernel) and the comms `publish` opens."""
    import comm
    from IPython.core import getipython

    opened: list[FakeComm] = []

    def create_comm(target_name: str, data: dict[str, Any]) -> FakeComm:
        opened.append(FakeComm(target_name, data))
        return opened[-1]

    shell = type("KernelShell", (), {"kernel": object()})()
    monkeypatch.setattr(getipython, "get_ipython", lambda: shell)
    monkeypatch.setattr(comm, "create_comm", create_comm)
    monkeypatch.setattr(monitor_comm, "_comms", {})
    monkeypatch.setattr(monitor_comm, "_last_snapshot", None)
    monkeypatch.setattr(monitor_comm, "_last_result", None)
    return opened


def test_publish_outside_a_kernel_does_nothing() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.instance()
    try:
        assert publish(SNAPSHOT) is False
    finally:
        InteractiveShell.clear_instance()


def test_publish_reuses_one_comm_and_reopens_after_the_frontend_closes_it(
    fake_kernel: list[FakeComm],
) -> None:
    assert publish(SNAPSHOT) and publish(PROGRESS)
    assert len(fake_kernel) == 1
    assert fake_kernel[0].target_name == TARGET_NAME
    assert fake_kernel[0].sent == [SNAPSHOT, PROGRESS]

    fake_kernel[0].close_from_frontend()
    assert publish(RESULT)
    assert len(fake_kernel) == 2
    assert fake_kernel[1].sent == [RESULT]


def test_a_refresh_request_resends_the_last_snapshot_and_result(
    fake_kernel: list[FakeComm],
) -> None:
    publish(SNAPSHOT)
    publish(PROGRESS)
    publish(RESULT)
    fake_kernel[0].receive({"type": "refresh"})
    assert fake_kernel[0].sent[-2:] == [SNAPSHOT, RESULT]


def test_publish_never_raises(fake_kernel: list[FakeComm], monkeypatch: pytest.MonkeyPatch) -> None:
    import comm

    def broken(**_: Any) -> None:
        raise RuntimeError("iopub is gone")

    monkeypatch.setattr(comm, "create_comm", broken)
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

        run_all_cells(page)
        expect(panel).to_contain_text("41,210 / 48,808 tokens")
        expect(panel).to_contain_text("soft threshold 39,046 · hard limit 48,808")
        expect(panel).to_contain_text("provider usage")
        expect(panel.locator(".soba-Budget-auto")).to_contain_text("on")
        expect(panel.locator(".soba-Budget-fill")).to_have_attribute("data-level", "soft")

        expect(panel).to_contain_text("Compacting context before response · 82%")
        expect(panel).to_contain_text(RESULT_LINE, timeout=(BARRIER_SECONDS + 10) * 1000)
        expect(panel.locator(".soba-Budget-live")).to_have_count(0)
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT))

        # A reloaded page adopts the kernel's open comm and asks for the last snapshot.
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
