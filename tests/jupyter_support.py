"""Real Jupyter servers and a real browser for the browser tests.

`jupyter_server` starts `python -m jupyterlab` (JupyterLab 4) or `python -m notebook`
(Notebook 7) on a free loopback port, with a random token, in an environment from
`server_env` (Jupyter's own folders in a temp folder, no news toast, the soba_nb under test
importable; `isolated_env` adds its own HOME, no SOBA_* variables and the installed
labextensions), and always stops it. `browser_page` opens a page in Debian's chromium driven by
Playwright. `wait_for_kernel_idle` and `run_all_cells` drive a notebook in both frontends.
`require_browser` skips a test, with the reason, without chromium or Playwright.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from child_processes import stop_process_group, tied_to_this_process

import soba_nb

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO_ROOT = Path(soba_nb.__file__).resolve().parents[1]
"""The folder holding the soba_nb under test: the kernels import it from there."""
SOBA_LABEXTENSION = "soba-nb-labextension"
LABEXTENSION_BUILD = "bash labextension/build.sh && pip install --no-deps -e ."
"""How to build and install the labextension (said when a test skips without it)."""
EXPOSE_APP = "--LabApp.expose_app_in_browser=True"
"""JupyterLab option: the page gets `window.jupyterapp` (its commands, shell, registry)."""
SERVER_START_TIMEOUT_S = 60
SERVER_STOP_TIMEOUT_S = 10
UI_TIMEOUT_MS = 30_000
RUN_ALL_ATTEMPTS = 5
RUN_START_WAIT_MS = 3_000
NOT_RUN_PROMPT = re.compile(r"^\[[\s\u00a0]*\]:$")
"""The input prompt of a cell that has not run (and is not queued)."""
JUPYTER_FOLDERS = {
    "JUPYTER_CONFIG_DIR": "config",
    "JUPYTER_RUNTIME_DIR": "runtime",
    "JUPYTERLAB_SETTINGS_DIR": "settings",
    "JUPYTERLAB_WORKSPACES_DIR": "workspaces",
    "IPYTHONDIR": "ipython",
}
"""Environment variable → folder (in the server's temp folder): no user config, settings,
workspaces or runtime files. The data folders (installed labextensions) stay as they are."""
WIDGETS_EXTENSION = "@jupyter-widgets/jupyterlab-manager"
NOTEBOOK_EXPOSE_APP = "--JupyterNotebookApp.expose_app_in_browser=True"
"""Notebook 7's option for `window.jupyterapp` (JupyterLab's is `EXPOSE_APP`)."""


# -- skip rules ----------------------------------------------------------------------------


def require_browser() -> None:
    """Skip the test, with the reason, without /usr/bin/chromium or Playwright."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (Debian: apt-get install chromium)")
    pytest.importorskip(
        "playwright.sync_api", reason="Playwright is missing (pip install playwright)"
    )


# -- the server ----------------------------------------------------------------------------


@dataclass(frozen=True)
class JupyterServer:
    base_url: str
    token: str
    root: Path
    env: dict[str, str]
    """The server's environment, which its kernels inherit."""

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}?token={self.token}"


def free_port() -> int:
    """A loopback port nothing listens on (for now)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def server_env(
    tmp: Path, base: Mapping[str, str], folders: Mapping[str, str] = JUPYTER_FOLDERS
) -> dict[str, str]:
    """`base` with each variable of `folders` pointing at its own (new) folder in `tmp`, no
    "get notified about Jupyter news?" toast over the page (and no fetch for it), and the
    soba_nb under test first on PYTHONPATH."""
    env = dict(base)
    for name, folder in folders.items():
        env[name] = str(tmp / folder)
        (tmp / folder).mkdir(parents=True, exist_ok=True)
    announcements = Path(env["JUPYTERLAB_SETTINGS_DIR"]) / "@jupyterlab" / "apputils-extension"
    announcements.mkdir(parents=True)
    (announcements / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def installed_data_dirs(*extensions: str) -> list[str]:
    """The Jupyter data folders that hold these prebuilt labextensions."""
    from jupyter_core.paths import jupyter_path

    found: list[str] = []
    for folder in jupyter_path("labextensions"):
        if any((Path(folder) / name / "package.json").is_file() for name in extensions):
            found.append(str(Path(folder).parent))
    return found


def isolated_env(tmp: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """A server's (and so its kernels') environment: nothing from the user's Jupyter or soba
    settings (its own HOME and Jupyter folders in `tmp`, no SOBA_* variables), the prebuilt
    extensions (ours, the widget manager) visible wherever they are installed, the soba_nb
    under test importable, and `extra` (e.g. the test API key)."""
    base = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("SOBA_") and name != "JPY_SESSION_NAME"
    }
    folders = {"HOME": "home", **JUPYTER_FOLDERS, "JUPYTER_DATA_DIR": "data"}
    env = server_env(tmp, base, folders)
    # A user data folder holding them is hidden by the isolated JUPYTER_DATA_DIR otherwise.
    shared = installed_data_dirs(SOBA_LABEXTENSION, WIDGETS_EXTENSION)
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [*shared, env.get("JUPYTER_PATH")]))
    env.update(extra)
    return env


def wait_until_ready(process: subprocess.Popen[bytes], server: JupyterServer, log: Path) -> None:
    """Poll `/api/status` until it answers; fail (with the server's log) if the server exits
    or is not ready after SERVER_START_TIMEOUT_S."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the Jupyter server exited with {process.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(server.url("/api/status"), timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    pytest.fail(
        f"the Jupyter server is not ready after {SERVER_START_TIMEOUT_S} s:\n{log.read_text()}"
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate (the server shuts its kernels down), then kill its process group: kernels it
    could not stop die with it."""
    stop_process_group(process, SERVER_STOP_TIMEOUT_S)


@contextlib.contextmanager
def jupyter_server(
    module: str, tmp: Path, root: Path, env: dict[str, str], extra_args: Sequence[str] = ()
) -> Iterator[JupyterServer]:
    """`python -m jupyterlab` or `python -m notebook` serving `root` on a free port, with a
    random token and the environment `env` (see `server_env`), its log in `tmp`; ready when
    entered, always stopped on exit. `extra_args` go on the command line (e.g.
    `EXPOSE_APP`)."""
    # The page gets `window.jupyterapp` always: `wait_for_kernel_idle` reads the kernel from it.
    expose = EXPOSE_APP if module == "jupyterlab" else NOTEBOOK_EXPOSE_APP
    extra_args = [*extra_args, *([expose] if expose not in extra_args else [])]
    port = free_port()
    server = JupyterServer(f"http://127.0.0.1:{port}", secrets.token_hex(16), root, env)
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / f"{module}.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            tied_to_this_process([
                sys.executable,
                "-m",
                module,
                "--no-browser",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={server.token}",
                f"--ServerApp.root_dir={root}",
                "--ServerApp.disable_check_xsrf=True",
                # JupyterLab's server extension serves the news and update checks in both
                # frontends. (These are not traits of Notebook 7's JupyterNotebookApp: given
                # there, they made its config shim drop that app's whole section.)
                "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                # CI and these machines run as root; the server refuses that unless told.
                *(["--allow-root"] if os.geteuid() == 0 else []),
                *extra_args,
            ]),
            cwd=root,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until_ready(process, server, log)
        yield server
    finally:
        stop(process)


def write_code_notebook(path: Path, sources: Sequence[str]) -> None:
    """A Python 3 notebook (nbformat 4.5) of code cells with these sources, none run yet."""
    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": f"cell-{index}",
                "metadata": {},
                "outputs": [],
                "source": source,
            }
            for index, source in enumerate(sources)
        ],
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(notebook), encoding="utf-8")


# -- the browser ---------------------------------------------------------------------------


@contextlib.contextmanager
def browser_page(viewport: Any) -> Iterator[Any]:
    """A page of headless chromium (Playwright) with this viewport and UI_TIMEOUT_MS as its
    default timeout; the browser is always closed."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            page = browser.new_page(viewport=viewport)
            page.set_default_timeout(UI_TIMEOUT_MS)
            yield page
        finally:
            browser.close()


def cell(page: Any, index: int) -> Any:
    """The notebook's cell at `index` (JupyterLab and Notebook 7 alike)."""
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def choose_from_menu(page: Any, menu: str, item: str, *, timeout: float | None = None) -> None:
    """Open `menu` of the menu bar and click its `item` (waiting up to `timeout` ms for it)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=menu).first.click()
    page.get_by_text(item, exact=True).click(timeout=timeout)


KERNEL_ATTACHED = """
() => {
  const app = window.jupyterapp;
  const widget = app?.shell?.currentWidget;
  return !widget?.sessionContext || Boolean(widget.sessionContext.session?.kernel);
}
"""


def wait_for_kernel_idle(page: Any) -> None:
    """The notebook is shown and the toolbar's execution indicator says idle.

    The indicator can say idle before the notebook has a kernel attached: `run_all_cells`
    checks that the run did start.
    """
    cell(page, 0).wait_for()
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for()
    # Where the page exposes the app: wait until the notebook's kernel is attached too (a Run
    # All before that opens JupyterLab's "Select Kernel" dialog).
    page.wait_for_function(KERNEL_ATTACHED, timeout=UI_TIMEOUT_MS)


def dismiss_kernel_dialog(page: Any) -> None:
    """Accept the dialog JupyterLab opens when cells were run with no kernel attached yet
    ("Select Kernel", its default: the notebook's kernel), as a user would; it covers the page
    and would take the next click (seen on a loaded machine, after a first Run All ran nothing)."""
    dialog = page.locator(".jp-Dialog")
    if dialog.count() and dialog.first.is_visible():
        print(f"a dialog was open: {' '.join((dialog.first.text_content() or '').split())[:200]}; accepted")
        dialog.first.locator(".jp-mod-accept").click()
        dialog.first.wait_for(state="hidden")


def run_all_cells(page: Any) -> None:
    """Run > Run All Cells from the menu bar (JupyterLab and Notebook 7 alike).

    Cells run before the kernel is attached are skipped silently (their prompt stays `[ ]:`):
    if the first cell has not started within RUN_START_WAIT_MS, Run All Cells is chosen again.
    """
    from playwright.sync_api import expect

    prompt = cell(page, 0).locator(".jp-InputPrompt")
    for _attempt in range(RUN_ALL_ATTEMPTS):
        dismiss_kernel_dialog(page)
        cell(page, 0).click()
        choose_from_menu(page, "Run", "Run All Cells")
        try:
            expect(prompt).not_to_have_text(NOT_RUN_PROMPT, timeout=RUN_START_WAIT_MS)
            return
        except AssertionError:
            print("Run All Cells ran nothing (no kernel attached yet): again")
    pytest.fail(f"Run All Cells ran nothing in {RUN_ALL_ATTEMPTS} attempts")
