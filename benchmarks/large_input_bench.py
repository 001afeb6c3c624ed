"""Large inputs: redaction throughput, a 50 MB message, 100 MB of shell output.

Rows of `benchmarks/run.py` (issue 14, item 3), each measured in a fresh process so peak RSS
(`VmHWM`) is the operation's own:

- redaction: `redact` over 50 MB of typical tool output (CSV rows, log lines, a few
  secret-looking values), MB/s (target ≥ 50 MB/s), and over logs whose every third line logs
  `token_count=`, `key_count=` or `passes=` (names with a secret-name word in them);
- a 50 MB message: a session appends one 50 MB user message (redacted and written once),
  then measures and assembles its model input as a preflight does (counting it for the first
  time), then a second process resumes the session (the count read back); seconds and peak
  RSS (target: seconds, not minutes — at most 60 s);
- 100 MB of shell output: the `shell` tool runs a command that writes 100 MB; what comes back
  is its head and tail and a note (target: at most 10 s, and the process no bigger than the
  output would make it).

A child prints one JSON object:

    python benchmarks/large_input_bench.py redaction|redaction-token|redaction-key|redaction-pass|message|resume|shell FOLDER
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    from benchmarks.generate import open_session
    from benchmarks.resume_bench import _max_rss, run_child
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    from generate import open_session  # type: ignore[no-redef]
    from resume_bench import _max_rss, run_child  # type: ignore[no-redef]

MB = 1_000_000
REDACTION_MB = 50
REDACTION_TARGET_MB_S = 50.0
MESSAGE_MB = 50
MESSAGE_TARGET_S = 60.0
SHELL_MB = 100
SHELL_TARGET_S = 10.0
SEED = 14
SCRIPT = Path(__file__)


def tool_output(size: int, seed: int = SEED, *, counter: str = "step_count") -> str:
    """`size` characters of what tools print: CSV rows, log lines, now and then a value a
    redactor must look at twice (an assignment to a secret name, a URL). `counter`: the name
    logged on a third of the lines (one with a secret-name word in it, like `key_count`, is
    looked at by the redactor each time)."""
    rng = random.Random(seed)
    lines: list[str] = []
    total = 0
    while total < size:
        kind = rng.random()
        if kind < 0.6:
            line = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},north,c{rng.randint(1, 60):02d},{rng.uniform(0, 1e6):.1f}"
        elif kind < 0.95:
            line = f"INFO step {rng.randint(1, 10**6)} loss={rng.random():.4f} lr=0.001 {counter}={rng.randint(1, 9999)}"
        elif kind < 0.98:
            line = f"GET https://example.org/api/v1/items?page={rng.randint(1, 99)} 200"
        else:
            line = f"password = hunter{rng.randint(100, 999)}xyz"
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)[:size]


# -- the child processes ----------------------------------------------------------------------


def redaction_child(folder: Path, counter: str = "step_count") -> dict[str, Any]:
    from soba_nb.redact import redact

    text = tool_output(REDACTION_MB * MB, counter=counter)
    redact(text[:1000])  # the patterns compiled, the environment read
    start = time.perf_counter()
    redacted = redact(text)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "chars": len(text), "changed": redacted != text, "rss": _max_rss()}


def message_child(folder: Path) -> dict[str, Any]:
    from soba_nb.transcript.entries import MessageEntry

    text = "Here is the whole log; find what failed:\n" + tool_output(MESSAGE_MB * MB)
    rss_before = _max_rss()
    start = time.perf_counter()
    session = open_session(folder / "session.jsonl")
    session.transcript.append(MessageEntry(role="user", content=text))
    appended = time.perf_counter()
    measurement = session.compactor.measure()
    measured = time.perf_counter()
    built = session.compactor.model_input()
    done = time.perf_counter()
    session.close()
    return {
        "append": appended - start, "measure": measured - appended, "model_input": done - measured,
        "tokens": measurement.effective, "messages": len(built.messages), "rss": _max_rss(), "rss_before": rss_before,
        "file": (folder / "session.jsonl").stat().st_size,
    }  # fmt: skip


def resume_child(folder: Path) -> dict[str, Any]:
    start = time.perf_counter()
    session = open_session(folder / "session.jsonl")
    measurement = session.compactor.measure()
    session.compactor.model_input()
    seconds = time.perf_counter() - start
    session.close()
    return {"seconds": seconds, "tokens": measurement.effective, "rss": _max_rss()}


def shell_child(folder: Path) -> dict[str, Any]:
    from soba_nb.agent.tools import run_tool
    from soba_nb.agent.tools.base import ToolContext

    context = ToolContext(project_root=folder, namespace={})
    command = f"yes 'a line of build output, long enough to be typical' | head -c {SHELL_MB * MB}"
    rss_before = _max_rss()
    start = time.perf_counter()
    outcome = run_tool("shell", json.dumps({"command": command, "timeout_s": 120}), context)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "chars": len(outcome.content), "error": outcome.is_error,
            "rss": _max_rss(), "rss_before": rss_before}  # fmt: skip


CHILDREN: dict[str, Callable[[Path], dict[str, Any]]] = {
    "redaction": redaction_child, "message": message_child, "resume": resume_child, "shell": shell_child,
    "redaction-token": lambda folder: redaction_child(folder, counter="token_count"),
    "redaction-key": lambda folder: redaction_child(folder, counter="key_count"),
    "redaction-pass": lambda folder: redaction_child(folder, counter="passes"),
}  # fmt: skip


# -- the rows ----------------------------------------------------------------------------------


def register(benchmark: Callable[[str], Callable[[Any], Any]], row: type, ms: Callable[[float], str], mib: Callable[[float], str]) -> None:
    """Register the large-input rows into run.py's table."""

    @benchmark("large inputs")
    def large_inputs(workspace: Any) -> list[Any]:
        with tempfile.TemporaryDirectory(dir=workspace.folder) as scratch:
            folder = Path(scratch)
            redaction = run_child(SCRIPT, "redaction", str(folder))
            dense = {name: run_child(SCRIPT, f"redaction-{name}", str(folder)) for name in ("token", "key", "pass")}
            message = run_child(SCRIPT, "message", str(folder))
            resumed = run_child(SCRIPT, "resume", str(folder))
            shell = run_child(SCRIPT, "shell", str(folder))
        rate = redaction["chars"] / MB / redaction["seconds"]
        dense_rates = {name: run["chars"] / MB / run["seconds"] for name, run in dense.items()}
        first = message["append"] + message["measure"] + message["model_input"]
        return [
            row("redaction, typical tool output", 1, f"{rate:,.0f} MB/s ({REDACTION_MB} MB in {ms(redaction['seconds'])}; "
                f"peak RSS {mib(redaction['rss'])})", "", "", f"≥ {REDACTION_TARGET_MB_S:g} MB/s",
                rate >= REDACTION_TARGET_MB_S, None),
            *(
                row(f"redaction, a log with `{logged}=` on every third line", 1,
                    f"{dense_rates[name]:,.0f} MB/s ({REDACTION_MB} MB in {ms(dense[name]['seconds'])}; {why})",
                    "", "", f"≥ {REDACTION_TARGET_MB_S:g} MB/s", dense_rates[name] >= REDACTION_TARGET_MB_S, None)
                for name, logged, why in (
                    ("token", "token_count", "`token` with words after it names no secret: not looked at"),
                    ("key", "key_count", "`key` names a secret only after api/private/access/secret: not looked at"),
                    ("pass", "passes", "`pass` names a secret only as password/passwd/passphrase: not looked at"),
                )
            ),
            row(f"a {MESSAGE_MB} MB message, appended then a preflight", 1,
                f"{ms(first)} (append {ms(message['append'])} + measure {ms(message['measure'])} + model input "
                f"{ms(message['model_input'])}; {message['tokens']:,} tokens; peak RSS {mib(message['rss'])}, "
                f"{mib(message['rss_before'])} before)", "", "", f"≤ {MESSAGE_TARGET_S:g} s", first <= MESSAGE_TARGET_S,
                message["file"]),
            row(f"… the session resumed after the {MESSAGE_MB} MB message", 1,
                f"{ms(resumed['seconds'])} (open + measure + model input; peak RSS {mib(resumed['rss'])})", "", "",
                f"≤ {MESSAGE_TARGET_S:g} s", resumed["seconds"] <= MESSAGE_TARGET_S, message["file"]),
            row(f"{SHELL_MB} MB of shell output through the shell tool", 1,
                f"{ms(shell['seconds'])} ({shell['chars']:,} characters back; peak RSS {mib(shell['rss'])}, "
                f"{mib(shell['rss_before'])} before)", "", "", f"≤ {SHELL_TARGET_S:g} s", shell["seconds"] <= SHELL_TARGET_S, None),
        ]


if __name__ == "__main__":
    result = CHILDREN[sys.argv[1]](Path(sys.argv[2]))
    print(json.dumps(result))
