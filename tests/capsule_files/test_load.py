"""Issue 13, item 3: `%capsule load` into a session that has history hides none of it.

What the model receives is read from the real requests the loopback server recorded."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from compaction_support import good_summary
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.capsule_files.file import CapsuleFile, CapsuleMetadata, write_capsule_file
from soba_nb.compaction.capsule import SECTION_HEADINGS, Capsule, parse_capsule, render_capsule
from soba_nb.compaction.model_input import HANDOFF_FRAME
from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry, MessageEntry
from soba_nb.transcript.store import Transcript

MARKER = "Fit the churn model on the March extract."
LONG_ANSWER = "The data has many columns worth describing. " * 45
"""About 400 tokens: six such turns leave something to compact (tests/notebook/test_magics.py)."""


def _agent(ip):
    return ip.magics_manager.registry["SobaMagics"].get_session()


def _path(ip) -> list:
    return Transcript.load(_agent(ip).file).path()


def _capsules(ip) -> list[CapsuleEntry]:
    return [e for e in _path(ip) if isinstance(e, CapsuleEntry)]


def _conversation(request) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in request["messages"] if m["role"] != "system"]


def _handoff_file(folder: Path, *, goal: str = MARKER, work: str = "- trained a baseline") -> Path:
    body = render_capsule(Capsule(goal_and_constraints=goal, work_done=work, next_steps="- tune the model"))
    meta = CapsuleMetadata(title="Churn handoff", checkpoint="ck_00c0ffee", quality="full", tokens=1, trigger="user")
    return write_capsule_file(folder / "churn.capsule.md", CapsuleFile(metadata=meta, body=body), force=True)


def _load(ip, argument: str) -> list[str]:
    with capture_output() as out:
        ip.run_line_magic("capsule", f"load {argument}")
    return out.stdout.splitlines()


def test_the_earlier_work_stays_in_the_request_and_rewind_gets_back(ip, nb_dir, scripted):
    scripted.script(text("Answer one."), text("Answer two."))
    ip.run_line_magic("soba", "first question")
    ip.run_line_magic("soba", "second question")
    before_load = _conversation(scripted.inference_requests()[-1])
    handoff = _handoff_file(nb_dir)

    lines = _load(ip, handoff.name)

    [loaded] = _capsules(ip)
    first_user = next(e for e in _path(ip) if isinstance(e, MessageEntry) and e.role == "user")
    assert loaded.first_kept_entry_id == first_user.id and loaded.rolls_up is None
    assert loaded.content == handoff.read_text(encoding="utf-8").split("---\n\n", 1)[1]
    assert lines[0] == (
        f"loaded 'Churn handoff' from {handoff} as {loaded.checkpoint_id} "
        f"({loaded.tokens_after:,} tokens · quality full · unsigned), next to this session's work"
    )
    rewind = re.fullmatch(
        r"the 4 earlier entries of this session stay in model input after it · "
        r"%rewind (\S+) gets back to before the load",
        lines[1],
    )
    assert rewind, lines[1]
    assert lines[2] == "## Goal and constraints"  # then the capsule itself
    parent = Transcript.load(_agent(ip).file).get(loaded.parent_id)
    assert isinstance(parent, CheckpointEntry) and rewind[1] == parent.checkpoint_id  # the last turn's

    # The next request: the loaded capsule (framed as data), then everything the model saw before.
    scripted.script(text("Answer three."))
    ip.run_line_magic("soba", "third question")
    after = _conversation(scripted.inference_requests()[-1])
    assert after[0] == ("user", HANDOFF_FRAME.format(source=handoff) + loaded.content)
    assert after[1:] == [*before_load, ("assistant", "Answer two."), ("user", "third question")]

    # %rewind to the named checkpoint: the session as it was before the load.
    with capture_output():
        ip.run_line_magic("rewind", rewind[1])
    scripted.script(text("Answer four."))
    ip.run_line_magic("soba", "fourth question")
    again = _conversation(scripted.inference_requests()[-1])
    assert MARKER not in str(again)
    assert again == [*before_load, ("assistant", "Answer two."), ("user", "fourth question")]


def test_a_capsule_already_on_the_path_is_rolled_into_the_loaded_one(ip, nb_dir, scripted):
    ip.run_line_magic("auto_compact", "off")
    for index in range(6):
        scripted.script(text(f"Answer {index}. {LONG_ANSWER}"))
        ip.run_line_magic("soba", f"question {index}: describe the data")
    with capture_output():
        ip.run_line_magic("compact", "")
    [own] = _capsules(ip)
    assert "Keep cleaning the dataframe." in own.content  # the summary the server wrote
    scripted.script(text("Answer after."))
    ip.run_line_magic("soba", "after the compaction")
    before_load = _conversation(scripted.inference_requests()[-1])
    assert before_load[0][1].endswith(own.content)  # the session's capsule, then its tail

    lines = _load(ip, str(_handoff_file(nb_dir)))

    loaded = _capsules(ip)[-1]
    assert loaded.rolls_up == own.id and loaded.first_kept_entry_id == own.first_kept_entry_id
    assert f"this session's capsule {own.checkpoint_id} is rolled into it" in lines[1]
    capsule = parse_capsule(loaded.content)  # still a whole capsule: 13 sections
    goal = capsule.goal_and_constraints
    assert goal.index(f"From this session before the load (capsule {own.checkpoint_id}):") < goal.index(
        "Keep cleaning the dataframe."
    ) < goal.index("From the loaded handoff (churn.capsule.md):") < goal.index(MARKER)
    assert "- loaded data.csv" in capsule.work_done and "- trained a baseline" in capsule.work_done
    assert capsule.next_steps == "From the loaded handoff (churn.capsule.md):\n\n- tune the model"

    scripted.script(text("Answer next."))
    ip.run_line_magic("soba", "next question")
    after = _conversation(scripted.inference_requests()[-1])
    assert after[0][1].startswith(HANDOFF_FRAME.format(source=nb_dir / "churn.capsule.md"))
    assert "Keep cleaning the dataframe." in after[0][1] and MARKER in after[0][1]
    # The kept tail of the session's capsule and everything after it, unchanged.
    assert after[1:] == [*before_load[1:], ("assistant", "Answer after."), ("user", "next question")]


def test_the_next_compaction_folds_the_kept_work_and_the_loaded_capsule(ip, nb_dir, scripted):
    ip.run_line_magic("auto_compact", "off")
    for index in range(6):
        scripted.script(text(f"Answer {index}. {LONG_ANSWER}"))
        ip.run_line_magic("soba", f"question {index} about churn")
    _load(ip, str(_handoff_file(nb_dir)))
    scripted.summary = text(good_summary("Carry on with churn."))
    with capture_output() as out:
        ip.run_line_magic("compact", "")
    assert "Compacted (user)" in out.stdout
    [summary_request] = [r for r in scripted.server.requests if r.operation == "compaction"]
    sent = str(summary_request["messages"])
    assert "question 0 about churn" in sent and MARKER in sent  # neither is lost
    newest = _capsules(ip)[-1]
    assert newest.source is None and newest.rolls_up == _capsules(ip)[-2].id


def test_loading_into_an_empty_session_starts_from_the_capsule_alone(ip, nb_dir, scripted):
    handoff = _handoff_file(nb_dir)
    lines = _load(ip, handoff.name)
    [loaded] = _capsules(ip)
    assert loaded.first_kept_entry_id is None and loaded.rolls_up is None
    assert lines[:2] == [  # one line, as before this session had history to speak of
        f"loaded 'Churn handoff' from {handoff} as {loaded.checkpoint_id} "
        f"({loaded.tokens_after:,} tokens · quality full · unsigned); the next turn starts from it",
        "## Goal and constraints",  # then the capsule itself
    ]
    scripted.script(text("Sure."))
    ip.run_line_magic("soba", "go on")
    assert _conversation(scripted.inference_requests()[-1]) == [
        ("user", HANDOFF_FRAME.format(source=handoff) + loaded.content),
        ("user", "go on"),
    ]


def test_a_capsule_too_large_for_the_session_is_refused(ip, nb_dir):
    # The test limits: hardLimit 5,000 tokens; a loaded capsule may take half of it.
    big = _handoff_file(nb_dir, work="\n".join(f"- step {n}: cleaned another column" for n in range(600)))
    before = _agent(ip).file.read_bytes()
    with pytest.raises(UsageError) as raised:
        ip.run_line_magic("capsule", f"load {big.name}")
    message = str(raised.value)
    assert "\n" not in message and str(big) in message
    assert re.search(r"is [\d,]+ tokens; a capsule loaded into this session may take at most 2,500", message)
    assert _agent(ip).file.read_bytes() == before


def test_sections_of_the_loaded_file_all_reach_the_model(ip, nb_dir, scripted):
    scripted.script(text("Answer one."))
    ip.run_line_magic("soba", "first question")
    _load(ip, str(_handoff_file(nb_dir)))
    scripted.script(text("ok"))
    ip.run_line_magic("soba", "next")
    first = _conversation(scripted.inference_requests()[-1])[0][1]
    assert [h for h in SECTION_HEADINGS if f"## {h}\n" in first] == list(SECTION_HEADINGS)
