"""Issue 13, item 4 (`%capsule list`): the checkpoints and capsules on the current path, newest
last, each with its id, kind, local time and note; bounded, with a count of the earlier ones."""

from __future__ import annotations

import re

from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

from soba_nb.capsule_files.file import CapsuleFile, CapsuleMetadata, write_capsule_file
from soba_nb.compaction.capsule import Capsule, render_capsule
from soba_nb.notebook.checkpoints import local_time
from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry
from soba_nb.transcript.store import Transcript

LONG_ANSWER = "The data has many columns worth describing. " * 45


def _agent(ip):
    return ip.magics_manager.registry["SobaMagics"].get_session()


def _list(ip, arguments: str = "") -> list[str]:
    with capture_output() as out:
        ip.run_line_magic("capsule", f"list {arguments}".strip())
    return out.stdout.splitlines()


def _kind_and_note(line: str) -> str:
    """A listed line without its checkpoint id and time."""
    _, kind, _, *note = line.split(" · ")
    return " · ".join([kind, *note])


def _marked(ip) -> list[CheckpointEntry | CapsuleEntry]:
    path = Transcript.load(_agent(ip).file).path()
    return [e for e in path if isinstance(e, CheckpointEntry | CapsuleEntry)]


def test_turns_milestones_capsules_and_loads_are_listed_newest_last(ip, nb_dir, scripted):
    ip.run_line_magic("auto_compact", "off")
    scripted.script(
        tool_calls(("checkpoint", {"kind": "milestone", "note": "sales.csv cleaned, 0 rows dropped"})),
        text("Cleaned."),
    )
    ip.run_line_magic("soba", "clean the sales data")
    for index in range(6):
        scripted.script(text(f"Answer {index}. {LONG_ANSWER}"))
        ip.run_line_magic("soba", f"question {index}: describe the data")
    with capture_output():
        ip.run_line_magic("compact", "")
    body = render_capsule(Capsule(goal_and_constraints="Fit the churn model."))
    meta = CapsuleMetadata(title="Churn handoff", checkpoint="ck_00c0ffee", quality="full", tokens=1, trigger="user")
    write_capsule_file(nb_dir / "churn.capsule.md", CapsuleFile(metadata=meta, body=body))
    with capture_output():
        ip.run_line_magic("capsule", "load churn.capsule.md")

    lines = _list(ip)

    marked = _marked(ip)
    assert [line.split(" · ")[0] for line in lines] == [e.checkpoint_id for e in marked]
    for line, entry in zip(lines, marked, strict=True):
        assert line.split(" · ")[2] == local_time(entry.timestamp)
        assert re.search(r"\d\d:\d\d", line.split(" · ")[2])
    milestone, first_turn, *turns, compacted, loaded = map(_kind_and_note, lines)
    assert milestone == "milestone · sales.csv cleaned, 0 rows dropped"
    assert first_turn == 'turn · "clean the sales data"'
    assert turns == [f'turn · "question {index}: describe the data"' for index in range(6)]
    capsule = next(e for e in marked if isinstance(e, CapsuleEntry) and e.source is None)
    assert compacted == (
        f"capsule (user) · {capsule.tokens_before:,} → {capsule.tokens_after:,} tokens · full"
    )
    assert loaded == "loaded · 'Churn handoff' · from churn.capsule.md · full"


def test_the_list_is_bounded_and_all_shows_every_one(ip, nb_dir):
    agent = _agent(ip)
    for index in range(25):
        agent.transcript.append(CheckpointEntry(kind="user", note=f"bookmark {index}"))
    lines = _list(ip)
    assert lines[0] == "… 5 earlier (%capsule list --all shows them)"
    assert len(lines) == 21
    assert _kind_and_note(lines[1]) == "user · bookmark 5"
    assert _kind_and_note(lines[-1]) == "user · bookmark 24"
    every = _list(ip, "--all")
    assert len(every) == 25 and every[0].endswith("bookmark 0")


def test_only_the_current_path_is_listed(ip, nb_dir, scripted):
    ip.run_line_magic("soba", "first")
    ip.run_line_magic("soba", "second")
    first, second = _marked(ip)
    with capture_output():
        ip.run_line_magic("rewind", first.checkpoint_id)
    listed = "\n".join(_list(ip))
    assert first.checkpoint_id in listed and second.checkpoint_id not in listed


def test_an_empty_session_says_so_and_memory_is_still_listed(ip, nb_dir):
    assert _list(ip) == ["no checkpoints or capsules on the current path yet"]
    assert _list(ip, "--memory")[0].startswith("project memory is empty")
