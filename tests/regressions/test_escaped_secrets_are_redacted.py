"""Secrets are redacted in every form they take in text (SPEC §12), not only raw.

Found under attack: after the model ran `print(json.dumps(dict(os.environ)))`, the
JSON-escaped, `repr` and bytes-literal forms of environment secrets (`'Pa\\\\ss"w0rd!Xy9'`,
`b'p\\xc3\\xa4ssw…'`) and a half-redacted `"[redacted]"w0rd!Xy9"` were in the transcript,
capsule entries, `.capsule.md`, the agents-md handoff, project memory and five later request
bodies. Each planted value here has distinctive pieces on both sides of the characters that
escaping changes, so every file and request body is scanned for those pieces: whatever the
escaping, a leak shows.
"""

from __future__ import annotations

import os
from pathlib import Path

from compaction_support import good_summary
from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

QUOTED = 'Qz7Kp\\mW9"tR4!vX8'
"""A backslash and a double quote: JSON and repr escape both."""
UNICODE = "Zeb9Qwx-äöü-Tr7Lmn"
"""Non-ASCII: `ascii()`, `json.dumps` and bytes literals escape it."""
SINGLE = "Hy6'Jcv3Pq-Wo2Ksz"
"""A single quote: repr escapes it when the value also holds a double quote."""
PIECES = ("Qz7Kp", "tR4!vX8", "Zeb9Qwx", "Tr7Lmn", "Hy6", "Jcv3Pq-Wo2Ksz")
PRINTS = (
    "import json, os\n"
    "print(json.dumps(dict(os.environ)))\n"
    "print(repr(dict(os.environ)))\n"
    "print(json.dumps(json.dumps(dict(os.environ))))\n"
    "print(os.environ['ACME_DB_PASSWORD'].encode())\n"
    "print(os.environ['ACME_UNICODE_SECRET'].encode())\n"
    "print(ascii(os.environ['ACME_UNICODE_SECRET']))\n"
    "print({'q': os.environ['ACME_SINGLE_TOKEN'] + '\"'})"
)


def leaks(data: bytes, where: str) -> list[str]:
    return [f"{where}: {piece}" for piece in PIECES if piece.encode() in data]


def test_escaped_forms_of_secrets_never_reach_a_file_or_a_later_request(ip, nb_dir, scripted, monkeypatch, figures):
    monkeypatch.setenv("ACME_DB_PASSWORD", QUOTED)
    monkeypatch.setenv("ACME_UNICODE_SECRET", UNICODE)
    monkeypatch.setenv("ACME_SINGLE_TOKEN", SINGLE)
    ip.run_line_magic("auto_compact", "off")
    scripted.script(tool_calls(("python", {"code": PRINTS})), text("Printed the environment."))
    ip.run_line_magic("soba", "show me the environment")
    ran = len(scripted.inference_requests())
    for index in range(4):
        scripted.script(text(f"Answer {index}. " + "Plenty of words about the data. " * 40))
        ip.run_line_magic("soba", f"question {index}")
    # A model summary that repeats the escaped forms (as a model quoting its input would).
    scripted.summary = text(good_summary(f"Use {QUOTED!r} and {UNICODE.encode()!r} and {UNICODE!a}."))
    with capture_output():
        ip.run_line_magic("compact", "")
        ip.run_line_magic("capsule", 'create "handoff"')
    agent = ip.magics_manager.registry["SobaMagics"].agent
    checkpoint = agent.capsules()[-1].checkpoint_id
    with capture_output():
        ip.run_line_magic("capsule", f"export {checkpoint} handoff-agents.md --format agents-md")
    scripted.script(text("One more."))
    ip.run_line_magic("soba", "one more")

    files = [p for root in (nb_dir, Path(os.environ["HOME"])) for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "AGENTS.md" or p.name == "handoff-agents.md" for p in files)
    assert any(".soba/memory" in str(p) for p in files)  # the explicit %compact was mirrored
    found = [leak for p in files for leak in leaks(p.read_bytes(), str(p.relative_to(p.anchor)))]
    later = scripted.server.requests[ran:]
    found += [leak for r in later for leak in leaks(r.raw, f"request {r.path} {r.operation}")]
    figures.add(
        "escaped secrets",
        f"3 env secrets printed 7 ways (JSON, JSON twice, repr, bytes, ascii) · {len(files)} files and "
        f"{len(later)} later request bodies scanned · found {len(found)}",
    )
    assert found == [], found
