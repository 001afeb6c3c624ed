"""Build the JupyterLab sidebar while soba-nb is installed (hatch-jupyter-builder's build
function, see `[tool.hatch.build.hooks.jupyter-builder]` in pyproject.toml).

As in every extension made from JupyterLab's template, `pip install .` or `pip install -e .`
builds the frontend (`npm ci`, `tsc`, `jupyter-builder`) into `soba_nb/labextension/`, which
the wheel then installs where JupyterLab finds prebuilt extensions — so the sidebar comes with
the install. Where node ≥ 20.19 and npm are missing, or the build fails (no npm registry),
the install goes on without the sidebar and prints why (pip shows a build step's output only
with `-v`): everything else works, `%budget` renders under the cell, and `soba-nb doctor` tells
whether the sidebar is installed.

A build that is already up to date (its output newer than every source) is not run again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUTPUT = HERE.parent / "soba_nb" / "labextension"
SOURCES = ("src", "style", "package.json", "package-lock.json", "tsconfig.json", "install.json")
NODE_MINIMUM = (20, 19)
SKIPPED = (
    "soba-nb: the JupyterLab sidebar was not built ({why}); everything else works. "
    "With node >= 20.19 and npm on the PATH, reinstall (pip install -e .) or run bash labextension/build.sh"
)


def build(target_name: str, version: str, **_: object) -> None:
    """Build the extension unless it is up to date; never fail the install for it."""
    if _up_to_date():
        return
    why = _cannot_build()
    if why is None:
        why = _run()
    if why is not None:
        print(SKIPPED.format(why=why), file=sys.stderr)


def _up_to_date() -> bool:
    built = OUTPUT / "package.json"
    if not built.is_file():
        return False
    newest = 0.0
    for name in SOURCES:
        path = HERE / name
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        newest = max([newest, *(p.stat().st_mtime for p in files)])
    return built.stat().st_mtime >= newest


def _cannot_build() -> str | None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return "node and npm are not on the PATH"
    try:
        shown = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "node does not run"
    found = re.match(r"v(\d+)\.(\d+)", shown.strip())
    if found is None or (int(found[1]), int(found[2])) < NODE_MINIMUM:
        return f"node {shown.strip()} is older than 20.19"
    return None


def _run() -> str | None:
    npm = shutil.which("npm")
    assert npm is not None
    # `jupyter-builder` comes with JupyterLab in this (build) environment: its scripts first.
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    for step in (["ci", "--no-audit", "--no-fund"], ["run", "build:prod"]):
        done = subprocess.run([npm, *step], cwd=HERE, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return f"npm {' '.join(step)} failed: {last[0][:200]}"
    return None
