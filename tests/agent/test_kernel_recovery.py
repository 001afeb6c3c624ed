"""Issue 13: capsules that know the kernel — kernel state with provenance in every capsule,
the restart note and `%soba /rebuild`, `%checkpoint` and the `%rewind` list (through the
magics in a real InteractiveShell against the loopback model server; a restart is a new
shell on the same session, and `test_kernel_restart_process.py` does it with two kernel
processes)."""

from __future__ import annotations

import json
import re

import pytest
from compaction_support import good_summary
from conftest import TEST_KEY_VALUE, new_shell, shut_down
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

from soba_nb.agent.provenance import trace
from soba_nb.agent.rebuild import plan
from soba_nb.compaction.capsule import SECTION_HEADINGS, parse_capsule
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
)

BUILD_DF = "import pandas as pd\ndf = pd.DataFrame({'units': [1.0, 2.0, 3.0], 'region': ['N', 'S', 'N']})\ntotal = float(df.units.sum())\n"


def magics(ip):
    return ip.magics_manager.registry["SobaMagics"]


def python(code: str):
    return tool_calls(("python", {"code": code}))


def call_entry(ip, code_fragment: str) -> ToolCallEntry:
    calls = [e for e in magics(ip).agent.transcript.entries if isinstance(e, ToolCallEntry)]
    return next(c for c in calls if code_fragment in json.loads(c.arguments)["code"])


def summary_saying_none_about_the_kernel() -> str:
    return good_summary()  # every section but two is "(none)", Kernel state included


LONG_ANSWER = "The figures hold up across every region and month we checked. " * 40


def pad(ip, scripted, turns: int = 4) -> None:
    """Turns long enough that `%compact` has history before the kept tail to summarize."""
    for index in range(turns):
        scripted.script(text(f"Answer {index}. {LONG_ANSWER}"))
        run(ip, f"question {index}")


def compact(ip) -> CapsuleEntry:
    with capture_output() as cap:
        ip.run_line_magic("compact", "")
    capsules = [e for e in magics(ip).agent.transcript.entries if isinstance(e, CapsuleEntry)]
    assert capsules, cap.stdout
    return capsules[-1]


def run(ip, line: str) -> str:
    with capture_output() as cap:
        ip.run_line_magic("soba", line)
    return cap.stdout


# -- kernel state in every capsule ------------------------------------------------------------


def test_a_model_capsule_gets_our_kernel_state_with_provenance(ip, scripted):
    ip.user_ns["notes"] = "the user's own variable"
    scripted.script(python(BUILD_DF), text("Built df."))
    run(ip, "build the table")
    pad(ip, scripted)
    scripted.summary = text(summary_saying_none_about_the_kernel())
    capsule = compact(ip)
    assert capsule.quality == "full"  # the model's capsule, not the fallback
    lines = parse_capsule(capsule.content).kernel_state.splitlines()
    # The agent's variables first (most recently used first), with their columns, and that the
    # agent built them (no entry id: the model sees none it could look for).
    region = ip.user_ns["df"].dtypes.iloc[1]
    assert lines[0] == f"- df: DataFrame 3×2 · columns: units float64, region {region} · built by the agent"
    assert lines[1] == "- total: float · built by the agent"
    assert lines[2] == "- notes: str[23]"  # then the user's own, never a value
    assert "the user's own variable" not in capsule.content and "(none)" not in "\n".join(lines)


def test_the_summary_request_leaves_the_kernel_state_to_us(ip, scripted, llm_server):
    pad(ip, scripted)
    compact(ip)
    request = [r for r in llm_server.requests if r.operation == "compaction"][-1]
    assert "(filled in by soba)" in json.dumps(request.body)


def test_kernel_state_is_bounded_and_counts_the_rest(ip, scripted):
    for index in range(30):
        ip.user_ns[f"v{index:02d}"] = index
    scripted.script(text("Fine."))
    run(ip, "hello")
    from soba_nb.agent.kernel_state import kernel_state

    lines = kernel_state(ip.user_ns, magics(ip).agent.provenance())
    assert len(lines) == 21 and lines[-1] == "+10 more"


# -- restart: the note, the model input, /rebuild ---------------------------------------------


def restart(ip, nb_dir):
    """A kernel restart: the session's transcript stays, the namespace is new."""
    shut_down(ip)
    return new_shell(nb_dir)


def test_after_a_restart_the_cell_and_the_model_hear_what_is_gone(ip, nb_dir, scripted):
    scripted.script(python(BUILD_DF), text("Built df."))
    run(ip, "build the table")
    producer = "`import pandas as pd…`"  # a call is named by its code, as its receipt showed it

    shell = restart(ip, nb_dir)
    scripted.script(text("Sure."))
    out = run(shell, "what is the total")
    expected = f"kernel was restarted: df, total are gone; they were built by the agent's python call {producer}"
    assert expected in out and "%soba /rebuild" in out
    sent = scripted.inference_requests()[-1]
    notes = [m["content"] for m in sent["messages"] if m["role"] == "user" and "[system note]" in m["content"]]
    assert len(notes) == 1 and expected in notes[0]
    assert sent["messages"][-1]["content"] == "what is the total"  # the request itself is last

    scripted.script(text("Again."))
    assert "gone" not in run(shell, "and the mean")  # said once, not every turn


def test_rebuild_reruns_the_producing_code_in_order_with_receipts(ip, nb_dir, scripted):
    scripted.script(
        python("import pandas as pd\nraw = pd.DataFrame({'units': [1.0, None, 3.0]})\n"),
        python("clean = raw.dropna()\nrows = len(clean)\n"),
        python("print('just looking', rows)\n"),
        text("Cleaned."),
    )
    run(ip, "load and clean")
    shell = restart(ip, nb_dir)
    out = run(shell, "/rebuild")
    assert re.search(r"python: import pandas as pd… · ok", out)
    assert re.search(r"python: clean = raw.dropna\(\)… · ok", out)
    assert "just looking" not in out  # a call that built nothing is not re-run
    assert "rebuilt rows, clean, raw (2 calls re-run)" in out
    assert shell.user_ns["rows"] == 2 and len(shell.user_ns["clean"]) == 2

    entries = magics(shell).agent.transcript.entries
    reruns = [e for e in entries if isinstance(e, ToolCallEntry) and e.call_id.startswith("rebuild_")]
    results = {e.call_id: e for e in entries if isinstance(e, ToolResultEntry)}
    assert len(reruns) == 2 and all(not results[c.call_id].is_error for c in reruns)
    notes = [e.content for e in entries if isinstance(e, MessageEntry) and e.role == "system"]
    assert notes[-1] == "rebuilt rows, clean, raw (2 calls re-run)"
    assert run(shell, "/rebuild").strip() == "nothing to rebuild: every variable the session built is defined"


def test_rebuild_reruns_a_call_written_in_ipython_syntax(ip, nb_dir, scripted):
    """The python tool runs what a cell runs (SPEC §15): `listing = !echo …` binds a variable,
    so a restart loses it and /rebuild runs it again through the shell's transformers."""
    scripted.script(python("listing = !echo sales.csv\ncount = len(listing)\n"), text("Listed."))
    run(ip, "list the data")
    assert ip.user_ns["count"] == 1
    shell = restart(ip, nb_dir)
    out = run(shell, "/rebuild")
    assert "rebuilt listing, count (1 call re-run)" in out
    assert list(shell.user_ns["listing"]) == ["sales.csv"] and shell.user_ns["count"] == 1


def test_rebuild_stops_at_the_first_error_and_says_what_is_missing(ip, nb_dir, scripted):
    ip.user_ns["factor"] = 3  # the user's variable: gone after a restart, and not ours to rebuild
    scripted.script(python("base = 2\n"), python("scaled = base * factor\n"), python("final = scaled + 1\n"), text("Done."))
    run(ip, "compute")
    shell = restart(ip, nb_dir)
    out = run(shell, "/rebuild")
    failing = "`scaled = base * factor`"
    assert (
        f"rebuild stopped: the re-run of the python call {failing} failed (2 of 3 run: NameError: name 'factor' "
        "is not defined); rebuilt base; still missing: scaled, final"
    ) in out
    assert shell.user_ns["base"] == 2 and "scaled" not in shell.user_ns


def test_a_deleted_variable_is_no_longer_defined_not_a_restart(ip, scripted):
    scripted.script(python("answer = 42\n"), text("Set."))
    run(ip, "set it")
    del ip.user_ns["answer"]
    scripted.script(text("Ok."))
    out = run(ip, "go on")
    assert "no longer defined in the kernel: answer; it was built by the agent's python call" in out
    assert "restarted" not in out


def test_the_rebuild_plan_follows_what_the_calls_read():
    def call(call_id: str, code: str) -> list:
        return [
            ToolCallEntry(call_id=call_id, name="python", arguments=json.dumps({"code": code})),
            ToolResultEntry(call_id=call_id, name="python", content="ok"),
        ]

    entries = call("a", "raw = load()") + call("b", "df = clean(raw)") + call("c", "model = fit(df)") + call("d", "raw = 5")
    provenance = trace(entries)
    assert [c.call_id for c in plan(provenance, {}, ["model"])] == ["b", "c", "d"]  # raw now comes from d
    assert [c.call_id for c in plan(provenance, {"df": 1}, ["model"])] == ["c"]
    failed = call("e", "x = 1")
    failed[1] = ToolResultEntry(call_id="e", name="python", content="error", is_error=True)
    assert "x" not in trace(entries + failed).producers  # a call that raised built nothing


# -- checkpoints a person can use -------------------------------------------------------------


def test_checkpoint_magic_result_lines_rewind_list_and_completion(ip, scripted):
    with capture_output() as cap:
        ip.run_line_magic("checkpoint", "before feature work")
    [user] = [e for e in magics(ip).agent.transcript.entries if isinstance(e, CheckpointEntry)]
    assert (user.kind, user.note, user.intent) == ("user", "before feature work", False)
    assert cap.stdout.strip() == f"checkpoint {user.checkpoint_id} (user) · before feature work"

    scripted.script(text("Features added."))
    out = run(ip, "add the features")
    turn = [e for e in magics(ip).agent.transcript.entries if isinstance(e, CheckpointEntry)][-1]
    assert turn.kind == "turn" and f"completed · {turn.checkpoint_id} · 1 step" in out

    with capture_output() as cap:
        ip.run_line_magic("rewind", "")
    listed = cap.stdout.splitlines()
    assert re.fullmatch(rf"{user.checkpoint_id} · user · \d\d:\d\d · before feature work", listed[0])
    assert re.fullmatch(rf'{turn.checkpoint_id} · turn · \d\d:\d\d · "add the features"', listed[1])

    _, matches = ip.complete("ck_", "%rewind ck_")
    assert matches[:2] == [turn.checkpoint_id, user.checkpoint_id]  # newest first

    with capture_output():
        ip.run_line_magic("rewind", user.checkpoint_id)
    with capture_output() as cap:
        ip.run_line_magic("rewind", "")
    assert cap.stdout.splitlines()[1].endswith("· other branch")


def test_checkpoint_kinds_and_bad_input(ip):
    with capture_output() as cap:
        ip.run_line_magic("checkpoint", "milestone baseline trained, AUC 0.81")
    [entry] = [e for e in magics(ip).agent.transcript.entries if isinstance(e, CheckpointEntry)]
    assert (entry.kind, entry.note, entry.intent) == ("milestone", "baseline trained, AUC 0.81", True)
    assert "(the next turn compacts first)" in cap.stdout
    with pytest.raises(UsageError, match=r"^%checkpoint: give a note"):
        ip.run_line_magic("checkpoint", "  ")
    with pytest.raises(UsageError, match="/rebuild takes no arguments"):
        ip.run_line_magic("soba", "/rebuild now")


def test_no_secret_reaches_the_kernel_state(ip, scripted):
    ip.user_ns["api_key"] = TEST_KEY_VALUE
    pad(ip, scripted)
    compact(ip)
    transcript = magics(ip).agent.transcript.file.read_text(encoding="utf-8")
    assert TEST_KEY_VALUE not in transcript and "api_key: str[" in transcript


def test_every_section_heading_survives_our_kernel_state(ip, scripted):
    scripted.script(python("x = 1\n"), text("Ok."))
    run(ip, "set x")
    pad(ip, scripted)
    capsule = compact(ip)
    assert all(f"## {heading}" in capsule.content for heading in SECTION_HEADINGS)
