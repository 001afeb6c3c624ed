"""No API key, token or secret in any file we write (SPEC §3), whatever path it takes.

Found under attack: keys reached the transcript through a `checkpoint` note, capsule
entries (a model summary that repeated a key, then carried into the deterministic capsule)
and tool-call arguments; `flight.jsonl` through its `reason` (a provider error body echoing
an environment value); and a *file name*: `%capsule create "handoff <key>"` made
`handoff-sk-….capsule.md`. Redaction now happens where each write happens (the store, the
flight recorder, the capsule file writer), so here every byte of every file the session
leaves behind is scanned for the planted secrets.
"""

from __future__ import annotations

import os
from pathlib import Path

from compaction_support import good_summary
from IPython.utils.capture import capture_output
from llm_server import http_error, text, tool_calls

KEY = "sk-proj-Q7pLx2Vb9TnR4kWd8YzH3cFm6Ja1Ue5S"
ENV_NAME = "ACME_SERVICE_TOKEN"
ENV_VALUE = "zqXvTpLmRwNs"
"""A secret with no key shape at all: only its environment variable's name gives it away."""
BEARER = "Bearer qwertyuiopAsdfghJklzxcvbnm"
LONG_ANSWER = "The data has many columns worth describing. " * 45


def every_file(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def leaks(root: Path) -> list[str]:
    found = []
    for path in every_file(root):
        data = path.read_bytes()
        for secret in (KEY, ENV_VALUE, BEARER.split()[1], KEY.lower()):
            if secret.encode() in data or secret in str(path):
                found.append(f"{path}: {secret[:8]}…")
    return found


def test_planted_secrets_never_reach_a_file(ip, nb_dir, scripted, monkeypatch, figures):
    monkeypatch.setenv(ENV_NAME, ENV_VALUE)
    ip.run_line_magic("auto_compact", "off")
    scripted.script(
        tool_calls(
            ("python", {"code": f"client_key = '{KEY}'\nheaders = {{'Authorization': '{BEARER}'}}"}),
            ("checkpoint", {"kind": "milestone", "note": f"client set up with {KEY} and {ENV_VALUE}"}),
            content=f"Using {ENV_VALUE} as the token.",
        ),
        text(f"Done: the key {KEY} works. {LONG_ANSWER}"),
    )
    ip.run_line_magic("soba", f"set up the client with {KEY}; the service token is {ENV_VALUE}")
    for index in range(5):
        scripted.script(text(f"Answer {index}, still {ENV_VALUE}. {LONG_ANSWER}"))
        ip.run_line_magic("soba", f"question {index}")

    # A model capsule that repeats the secrets, then a summary request whose error body
    # echoes the environment value (the fallback's reason once carried it to flight.jsonl).
    scripted.summary = text(good_summary(f"Keep using {KEY} and {ENV_VALUE}."))
    with capture_output():
        ip.run_line_magic("compact", "")
    for index in range(4):
        scripted.script(text(f"More {index}. {LONG_ANSWER}"))
        ip.run_line_magic("soba", f"more {index}")
    scripted.summary = http_error(500, {"error": {"message": f"upstream rejected token {ENV_VALUE}", "type": "server_error"}})
    with capture_output():
        ip.run_line_magic("compact", "")
    with capture_output() as out:
        ip.run_line_magic("capsule", f'create "handoff {KEY}"')
    assert KEY not in out.stdout and "handoff" in out.stdout

    agent = ip.magics_manager.registry["SobaMagics"].agent
    flight = (agent.file.parent / "flight.jsonl").read_text()
    assert '"reason":"fallback_summary_failed"' in flight  # a code, never the error body
    assert any(p.name.endswith(".capsule.md") and "handoff" in p.name for p in every_file(nb_dir))
    files = every_file(nb_dir) + every_file(Path(os.environ["HOME"]))
    found = leaks(nb_dir) + leaks(Path(os.environ["HOME"]))
    figures.add(
        "secrets",
        f"{len(files)} files we wrote, {sum(p.stat().st_size for p in files):,} bytes scanned for 4 planted "
        f"secrets (key, env value, digit-free bearer, lower-cased key) · found {len(found)}",
    )
    assert found == []
