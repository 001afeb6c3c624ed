"""Servers the tests start die with the test process, even when it is killed.

Every fixture that starts a server stops it when its block ends; a pytest killed outright
(SIGKILL, an out-of-memory kill, a CI job cut off) runs no finalizer, and its llama.cpp,
LiteLLM, Jupyter and JupyterHub servers lived on, holding ports, memory and both cores for the
next run. `tied_to_this_process` starts a command under util-linux's `setpriv --pdeathsig
TERM`: the kernel sends it SIGTERM when the process that started it ends, however it ends.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

SETPRIV = shutil.which("setpriv")


def tied_to_this_process(command: Sequence[str]) -> list[str]:
    """`command`, sent SIGTERM by the kernel when this process ends (as is without `setpriv`)."""
    if SETPRIV is None:
        return list(command)
    return [SETPRIV, "--pdeathsig", "TERM", "--", *command]
