"""Check and correct a capsule before it counts (SPEC §14): `%capsule diff`, `%capsule edit` and
`%%capsule amend`, through a real `InteractiveShell` against the loopback LLM server, reading
what the model was sent."""

from __future__ import annotations

import json
import re

import pytest
from IPython.core.error import UsageError
from llm_server import text, tool_calls
from test_magics import some_turns, transcript

from soba_nb.capsule_files.file import current_author
from soba_nb.cli.inspect import describe, render_inspect
from soba_nb.compaction.capsule import SECTION_HEADINGS
from soba_nb.transcript.entries import CapsuleEntry

FIRST_REQUEST = "load data.csv and count the refunds in it"
SECOND_REQUEST = "write the cleaned rows to a new file please"
ORIGINAL_DECISION = "Refunds are part of revenue."
"""What the model's summary got wrong (the user said the opposite): the amendment fixes it."""
AMENDED_DECISION = "Keep refunds out of revenue: finance books them separately."
CLEAN_CODE = "open('clean.csv', 'w').write('id\\n1\\n')"


def summary(decision: str = ORIGINAL_DECISION) -> str:
    """A model summary that quotes the first request and names data.csv, but says nothing of
    the second request, the code that wrote clean.csv, or clean.csv."""
    bodies = {
        "Goal and constraints": f'The user asked: "{FIRST_REQUEST}".',
        "Work done": "- read_file data.csv: 41 refunds found.",
        "Decisions": f"- {decision}",
        "Files read": "- data.csv",
    }
    return "\n\n".join(f"## {h}\n\n{bodies.get(h, '(none)')}" for h in SECTION_HEADINGS) + "\n"


@pytest.fixture
def compacted(ip, nb_dir, scripted, capsys) -> CapsuleEntry:
    """A session whose first two turns (a read, a file written) a `%compact` replaced."""
    (nb_dir / "data.csv").write_text("id,amount\n1,-5\n", encoding="utf-8")
    ip.run_line_magic("auto_compact", "off")
    scripted.script(tool_calls(("read_file", {"path": "data.csv"})), text("41 refunds."))
    ip.run_line_magic("soba", FIRST_REQUEST)
    scripted.script(tool_calls(("python", {"code": CLEAN_CODE})), text("Written."))
    ip.run_line_magic("soba", SECOND_REQUEST)
    some_turns(ip, scripted)
    scripted.summary = text(summary())
    ip.run_line_magic("compact", "")
    [capsule] = [e for e in transcript(ip).path() if isinstance(e, CapsuleEntry)]
    assert ORIGINAL_DECISION in capsule.content
    capsys.readouterr()
    return capsule


def marked(out: str, item: str) -> bool:
    """Whether the listing line of `item` carries the not-in-capsule mark."""
    [line] = [line for line in out.splitlines() if line.startswith("  ") and item in line]
    return line.endswith("✗ not in capsule")


def amended_text(capsule: CapsuleEntry) -> str:
    return capsule.content.replace(ORIGINAL_DECISION, AMENDED_DECISION)


# -- diff -------------------------------------------------------------------------------------


def test_diff_lists_what_the_capsule_replaced_and_marks_what_it_leaves_out(ip, compacted, capsys):
    ip.run_line_magic("capsule", "diff")
    out = capsys.readouterr().out
    assert out.startswith(f"{compacted.checkpoint_id} replaced ")
    assert "not in the capsule" in out.splitlines()[0]
    # Quoted by the capsule: not marked; left out: marked.
    assert not marked(out, FIRST_REQUEST)
    assert not marked(out, "read_file data.csv")
    assert marked(out, "python open('clean.csv'")
    files_read = out.split("files read\n")[1].split("files written\n")[0]
    assert "  data.csv\n" in files_read
    assert marked(out.split("files written\n")[1], "clean.csv")
    # The span ends where the capsule's kept tail starts: the kept turns are not listed.
    kept = [e for e in transcript(ip).path() if e.id == compacted.first_kept_entry_id]
    assert kept and "question 5" not in out
    assert f"%capsule edit {compacted.checkpoint_id}" in out
    # The same by its checkpoint id, and through /capsule.
    ip.run_line_magic("capsule", f"diff {compacted.checkpoint_id}")
    assert capsys.readouterr().out == out


def test_diff_escapes_control_characters(ip, nb_dir, scripted, capsys):
    ip.run_line_magic("auto_compact", "off")
    scripted.script(text("Cleared."))
    ip.run_line_magic("soba", "clear the screen \x1b[2J and ring \x07 now please")
    some_turns(ip, scripted)
    scripted.summary = text(summary())
    ip.run_line_magic("compact", "")
    capsys.readouterr()
    ip.run_line_magic("capsule", "diff")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[2J" in out


def test_diff_without_a_capsule_says_so(ip, scripted, capsys):
    ip.run_line_magic("soba", "hello")
    capsys.readouterr()
    ip.run_line_magic("capsule", "diff")
    assert capsys.readouterr().out == "no capsules on the current path\n"


# -- edit and amend ---------------------------------------------------------------------------


def test_edit_puts_the_capsule_in_the_next_cell_as_an_amend_cell(ip, compacted, capsys):
    ip.run_line_magic("capsule", "edit")
    assert ip.rl_next_input == f"%%capsule amend {compacted.checkpoint_id}\n{compacted.content}"
    out = capsys.readouterr().out
    assert f"%%capsule amend {compacted.checkpoint_id}" in out and "next cell" in out


def test_the_amended_capsule_is_what_the_next_request_carries(ip, compacted, scripted, capsys):
    ip.run_line_magic("capsule", "edit")
    cell = ip.rl_next_input.replace(ORIGINAL_DECISION, AMENDED_DECISION)
    before = len(transcript(ip))
    ip.run_cell(cell)  # the user corrects the cell and runs it
    out = capsys.readouterr().out
    added = transcript(ip).entries[before:]
    assert [type(e) for e in added] == [CapsuleEntry]
    [amended] = added
    assert isinstance(amended, CapsuleEntry)
    assert amended.amends == compacted.checkpoint_id
    assert amended.checkpoint_id != compacted.checkpoint_id
    assert amended.author == current_author()
    same = ("first_kept_entry_id", "trigger", "quality", "rolls_up", "tokens_before", "estimated_before")
    assert {f: getattr(amended, f) for f in same} == {f: getattr(compacted, f) for f in same}
    assert AMENDED_DECISION in amended.content and ORIGINAL_DECISION not in amended.content
    assert amended.tokens_after > 0
    assert f"{amended.checkpoint_id} amends {compacted.checkpoint_id}" in out

    ip.run_line_magic("soba", "how much revenue is left?")
    body = scripted.inference_requests()[-1].body
    sent = json.dumps(body)
    assert AMENDED_DECISION in sent and ORIGINAL_DECISION not in sent
    first = next(m["content"] for m in body["messages"] if m["role"] == "user")
    assert first.startswith("Context Capsule") and f"checkpoint {amended.checkpoint_id}" in first
    # The kept tail follows it, each message once (the capsule entries in the tail are not
    # messages); what the capsule replaced is not sent as messages.
    later = [m["content"] for m in body["messages"][1:] if m["role"] == "user"]
    assert later.count("question 5: describe the data") == 1
    assert "question 0: describe the data" not in later and FIRST_REQUEST not in later

    ip.run_line_magic("capsule", "list")
    listing = capsys.readouterr().out
    assert f"{amended.checkpoint_id} · capsule (user) · " in listing
    assert f"(amends {compacted.checkpoint_id}, by {current_author()})" in listing
    # `soba-nb inspect` lists it too.
    info = describe(transcript(ip))
    assert [(c["checkpointId"], c["amends"]) for c in info["capsules"]][-1] == (amended.checkpoint_id, compacted.checkpoint_id)
    assert f"amends {compacted.checkpoint_id} by {current_author()}" in render_inspect(info)
    # The diff of the amendment checks the amended text against the same span.
    ip.run_line_magic("capsule", "diff")
    assert capsys.readouterr().out.startswith(f"{amended.checkpoint_id} replaced ")


def test_a_later_compaction_rolls_up_the_amended_capsule(ip, compacted, scripted, capsys):
    ip.run_cell_magic("capsule", f"amend {compacted.checkpoint_id}", amended_text(compacted))
    [amended] = [e for e in transcript(ip).path() if isinstance(e, CapsuleEntry) and e.amends]
    asked = len([r for r in scripted.server.requests if r.operation == "compaction"])
    scripted.summary = text(summary(AMENDED_DECISION))
    some_turns(ip, scripted, count=3)
    ip.run_line_magic("compact", "")
    capsules = [e for e in transcript(ip).path() if isinstance(e, CapsuleEntry)]
    after = capsules[capsules.index(amended) + 1]
    assert after.rolls_up == amended.id
    summary_request = json.dumps([r for r in scripted.server.requests if r.operation == "compaction"][asked].body)
    assert AMENDED_DECISION in summary_request
    assert ORIGINAL_DECISION not in summary_request  # the corrected capsule is not shown again


def test_rewind_before_the_amendment_brings_the_original_back(ip, compacted, scripted, capsys):
    ip.run_cell_magic("capsule", f"amend {compacted.checkpoint_id}", amended_text(compacted))
    out = capsys.readouterr().out
    target = re.search(r"%rewind (\S+) goes back to", out)
    assert target is not None
    ip.run_line_magic("rewind", target[1])
    ip.run_line_magic("soba", "and now?")
    sent = json.dumps(scripted.inference_requests()[-1].body)
    assert ORIGINAL_DECISION in sent and AMENDED_DECISION not in sent
    [amended] = [e for e in transcript(ip).entries if isinstance(e, CapsuleEntry) and e.amends]
    ip.run_line_magic("rewind", amended.checkpoint_id)  # and forward again
    ip.run_line_magic("soba", "and after all?")
    sent = json.dumps(scripted.inference_requests()[-1].body)
    assert AMENDED_DECISION in sent and ORIGINAL_DECISION not in sent


@pytest.mark.parametrize(
    ("checkpoint", "cell", "problem"),
    [
        ("{ck}", "## Goal and constraints\n\nOnly a goal.\n", "missing 12 section heading(s): ## Work done"),
        ("{ck}", "   \n", "the cell is empty"),
        ("ck_00000000", "{text}", "no checkpoint ck_00000000"),
        ("{turn}", "{text}", "is a turn checkpoint, not a capsule"),
        ("{ck}", "{same}", "nothing changed"),
    ],
)
def test_a_bad_amendment_is_one_line_and_appends_nothing(ip, compacted, checkpoint, cell, problem):
    turn = next(e.checkpoint_id for e in transcript(ip).path() if getattr(e, "kind", None) == "turn")
    values = {"ck": compacted.checkpoint_id, "turn": turn, "text": amended_text(compacted), "same": compacted.content}
    before = len(transcript(ip))
    with pytest.raises(UsageError) as raised:
        ip.run_cell_magic("capsule", "amend " + checkpoint.format(**values), cell.format(**values))
    message = str(raised.value)
    assert problem in message and "\n" not in message and message.startswith("%capsule amend: ")
    assert len(transcript(ip)) == before


def test_only_the_latest_capsule_can_be_amended(ip, compacted, scripted):
    ip.run_cell_magic("capsule", f"amend {compacted.checkpoint_id}", amended_text(compacted))
    [amended] = [e for e in transcript(ip).path() if isinstance(e, CapsuleEntry) and e.amends]
    before = len(transcript(ip))
    with pytest.raises(UsageError, match=f"not the latest capsule on the current path \\({amended.checkpoint_id} is\\)"):
        ip.run_cell_magic("capsule", f"amend {compacted.checkpoint_id}", amended_text(compacted))
    with pytest.raises(UsageError, match="not the latest capsule"):
        ip.run_line_magic("capsule", f"edit {compacted.checkpoint_id}")
    assert len(transcript(ip)) == before
    # An amendment can itself be corrected.
    again = amended.content.replace(AMENDED_DECISION, "Refunds: see finance's ledger.")
    ip.run_cell_magic("capsule", f"amend {amended.checkpoint_id}", again)
    assert transcript(ip).path()[-1].amends == amended.checkpoint_id  # type: ignore[union-attr]


def test_amend_takes_a_cell_and_only_amend_does(ip, compacted):
    with pytest.raises(UsageError, match="goes in the cell"):
        ip.run_line_magic("capsule", f"amend {compacted.checkpoint_id}")
    with pytest.raises(UsageError, match="only amend takes a cell"):
        ip.run_cell_magic("capsule", "show", "x")
    with pytest.raises(UsageError, match="expected create, export, load, list, show, diff or edit"):
        ip.run_line_magic("capsule", "frob")


def test_a_secret_in_the_amendment_is_redacted(ip, compacted, scripted, monkeypatch):
    monkeypatch.setenv("WAREHOUSE_PASSWORD", "hunter2-very-secret")
    cell = amended_text(compacted).replace(AMENDED_DECISION, "Connect with hunter2-very-secret to the warehouse.")
    ip.run_cell_magic("capsule", f"amend {compacted.checkpoint_id}", cell)
    amended = transcript(ip).path()[-1]
    assert isinstance(amended, CapsuleEntry) and amended.amends
    assert "hunter2-very-secret" not in amended.content
    ip.run_line_magic("soba", "go on")
    assert "hunter2-very-secret" not in json.dumps(scripted.inference_requests()[-1].body)
