"""A `.capsule.md` file is checked whole and believed in nothing it can lie about.

Found under attack: editing `tokens: 105` to `tokens: 1` (or the title, or the source) was
accepted, and a 10 MB capsule was then shown as "1 tokens"; `%capsule load /dev/zero` ended
in a MemoryError traceback.
"""

from __future__ import annotations

import os
import time

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.transcript.entries import CapsuleEntry
from soba_nb.transcript.store import Transcript

LONG_ANSWER = "The data has many columns worth describing. " * 45


@pytest.fixture
def exported(ip, nb_dir, scripted):
    ip.run_line_magic("auto_compact", "off")
    for index in range(6):
        scripted.script(text(f"Answer {index}. {LONG_ANSWER}"))
        ip.run_line_magic("soba", f"question {index}")
    with capture_output():
        ip.run_line_magic("compact", "")
    agent = ip.magics_manager.registry["SobaMagics"].agent
    [capsule] = [e for e in Transcript.load(agent.file).path() if isinstance(e, CapsuleEntry)]
    target = nb_dir / "handoff.capsule.md"
    ip.run_line_magic("capsule", f"export {capsule.checkpoint_id} {target}")
    return target


def _entries(ip) -> int:
    return len(Transcript.load(ip.magics_manager.registry["SobaMagics"].agent.file))


@pytest.mark.parametrize(
    ("field", "edit"),
    [("tokens", lambda t: t.replace("tokens: ", "tokens: 1", 1)), ("title", lambda t: t.replace('title: "', 'title: "Trusted ', 1)),
     ("source", lambda t: t.replace('source-notebook: "', 'source-notebook: "/elsewhere', 1))],
)
def test_an_edited_front_matter_is_refused(ip, exported, field, edit):
    exported.write_text(edit(exported.read_text()))
    before = _entries(ip)
    with pytest.raises(UsageError, match="content hash mismatch"):
        ip.run_line_magic("capsule", f"load {exported}")
    assert _entries(ip) == before


def test_the_token_count_is_recounted_not_read(ip, nb_dir, exported):
    # A version-1 file (its hash covered only the body) may say anything in its front matter.
    lines = exported.read_text().split("\n")
    body = exported.read_text().split("\n---\n", 1)[1]
    import hashlib

    legacy = [
        "soba-capsule: 1" if line.startswith("soba-capsule:")
        else "tokens: 1" if line.startswith("tokens:")
        else f'sha256: "{hashlib.sha256(body.encode()).hexdigest()}"' if line.startswith("sha256:")
        else line
        for line in lines[: lines.index("---", 1) + 1]
    ]
    exported.write_text("\n".join(legacy) + "\n" + body)
    with capture_output() as out:
        ip.run_line_magic("capsule", f"load {exported}")
    agent = ip.magics_manager.registry["SobaMagics"].agent
    loaded = [e for e in Transcript.load(agent.file).path() if isinstance(e, CapsuleEntry)][-1]
    assert loaded.tokens_after == agent.counter.count_text(loaded.content) > 50
    assert f"({loaded.tokens_after:,} tokens" in out.stdout


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "folder"])
def test_a_file_that_is_not_a_regular_file_is_refused_at_once(ip, nb_dir, special):
    if special == "fifo":
        os.mkfifo(nb_dir / "pipe.capsule.md")
        special = str(nb_dir / "pipe.capsule.md")
    elif special == "folder":
        special = str(nb_dir)
    started = time.monotonic()
    with pytest.raises(UsageError) as caught:
        ip.run_line_magic("capsule", f"load {special}")
    assert time.monotonic() - started < 2
    message = str(caught.value)
    assert "\n" not in message and special in message
    assert "not a regular file" in message or "is a folder" in message


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(ip, nb_dir):
    from soba_nb.capsule_files.file import MAX_FILE_BYTES

    huge = nb_dir / "huge.capsule.md"
    with huge.open("wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)  # sparse: the size is all there is to see
    with pytest.raises(UsageError) as caught:
        ip.run_line_magic("capsule", f"load {huge}")
    message = str(caught.value)
    assert "\n" not in message and f"is at most {MAX_FILE_BYTES:,}" in message
