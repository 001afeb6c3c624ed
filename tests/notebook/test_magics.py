"""The magics through a real `InteractiveShell` against the loopback LLM server (SPEC §9)."""

from __future__ import annotations

import _thread
import json
import re
import threading
import time
from pathlib import Path

import pytest
from compaction_support import good_summary
from conftest import NOTEBOOK_NAME, TEST_KEY_VALUE, new_shell, shut_down, write_soba_json
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

from soba_nb import load_ipython_extension
from soba_nb.notebook.location import locate
from soba_nb.notebook.magics import (
    PROMPT_VALUE_CHARS,
    SobaMagics,
    split_options,
    substitute_variables,
)
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    MessageEntry,
    SkillEntry,
    UsageEntry,
)
from soba_nb.transcript.store import Transcript

MAGIC_NAMES = ("soba", "compact", "budget", "capsule", "auto_compact", "rewind")
LONG_ANSWER = "The data has many columns worth describing. " * 45
"""About 400 tokens."""
TURNS_TO_COMPACT = 6
"""With keepRecentTokens 1,000, six such turns leave enough before the kept window that a
capsule really makes the input smaller (the engine refuses one that would not)."""
WORKED_EXAMPLE = {
    "model": {"contextWindow": 65000, "maxOutputTokens": 8000},
    "compaction": {"safetyReserveTokens": 8192},
}


def magics(ip) -> SobaMagics:
    return ip.magics_manager.registry["SobaMagics"]


def transcript(ip) -> Transcript:
    agent = magics(ip).agent
    assert agent is not None
    return Transcript.load(agent.file)


def user_messages(request) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


def some_turns(ip, scripted, count: int = TURNS_TO_COMPACT) -> None:
    ip.run_line_magic("auto_compact", "off")  # the test decides when to compact
    for index in range(count):
        scripted.script(text(f"Answer {index}. {LONG_ANSWER}", chunks=3))
        ip.run_line_magic("soba", f"question {index}: describe the data")


# -- loading -------------------------------------------------------------------------------


def test_load_registers_magics_and_unload_removes_them(ip, nb_dir):
    line_magics = ip.magics_manager.magics["line"]
    assert all(name in line_magics for name in MAGIC_NAMES)
    assert "soba" in ip.magics_manager.magics["cell"]
    instance = magics(ip)
    assert instance in ip.configurables

    load_ipython_extension(ip)  # loading twice keeps the one instance
    assert magics(ip) is instance
    assert ip.configurables.count(instance) == 1

    ip.run_line_magic("unload_ext", "soba_nb")
    assert not any(name in ip.magics_manager.magics["line"] for name in MAGIC_NAMES)
    assert instance not in ip.configurables
    with pytest.raises(UsageError):
        ip.run_line_magic("soba", "hello")


def test_config_reaches_the_magics_traits(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.max_steps = 1")
    assert magics(ip).max_steps == 1
    scripted.script(tool_calls(("python", {"code": "1 + 1"})))
    with capture_output() as out:
        ip.run_line_magic("soba", "loop once")
    assert "step_limit" in out.stdout


# -- turns ---------------------------------------------------------------------------------


def test_soba_streams_the_answer_and_writes_the_transcript_next_to_the_notebook(ip, nb_dir, scripted):
    scripted.script(text("Hello **world**, the frame has 3 rows.", chunks=5))
    with capture_output() as out:
        ip.run_line_magic("soba", "how many rows?")
    assert "Hello **world**, the frame has 3 rows." in out.stdout
    files = list((nb_dir / "analysis.soba").glob("*.jsonl"))
    assert [f.name for f in files if f.name != "flight.jsonl"] == [magics(ip).agent.file.name]
    messages = [e for e in transcript(ip).path() if isinstance(e, MessageEntry)]
    assert [(m.role, m.content) for m in messages] == [
        ("user", "how many rows?"),
        ("assistant", "Hello **world**, the frame has 3 rows."),
    ]
    header = transcript(ip).header
    assert header is not None and header.notebook == str(nb_dir / NOTEBOOK_NAME)
    assert TEST_KEY_VALUE not in magics(ip).agent.file.read_text()


def test_cell_magic_uses_the_body_as_the_prompt(ip, scripted):
    ip.run_cell_magic("soba", "", "first line\n  second line {not_defined}\n")
    assert user_messages(scripted.inference_requests()[-1]) == ["first line\n  second line {not_defined}"]


def test_tool_calls_show_as_receipts_and_run_in_the_user_namespace(ip, scripted):
    ip.user_ns["rows"] = 21
    scripted.script(tool_calls(("python", {"code": "doubled = rows * 2\nprint(doubled)"})), text("Doubled: 42."))
    with capture_output() as out:
        ip.run_cell("%soba double {rows}")
    assert re.search(r"\[python: .* · ok · \d+\.\d s\]", out.stdout)
    assert "Doubled: 42." in out.stdout
    assert ip.user_ns["doubled"] == 42


def test_variables_are_substituted_only_when_defined(ip, scripted):
    ip.user_ns["n_rows"] = 120000
    ip.user_ns["big"] = "x" * 5000
    ip.run_cell('%soba use {n_rows} with {missing}, {}, {"a": 1}, {{n_rows}} and {big}')
    [prompt] = user_messages(scripted.inference_requests()[-1])
    expected_big = repr("x" * 5000)[:PROMPT_VALUE_CHARS] + "… [clipped]"
    assert prompt == f'use 120000 with {{missing}}, {{}}, {{"a": 1}}, {{{{n_rows}}}} and {expected_big}'


def test_a_lone_defined_name_is_clipped_not_expanded_whole_by_ipython(ip, scripted):
    ip.user_ns["table"] = "row\n" * 2000
    ip.run_cell("%soba describe {table} and cost $5")
    [prompt] = user_messages(scripted.inference_requests()[-1])
    assert prompt.startswith("describe 'row\\nrow") and prompt.endswith("… [clipped] and cost $5")


def test_a_prompt_ending_with_a_question_mark_reaches_soba(ip, scripted):
    result = ip.run_cell("%soba what is in df?")
    assert result.success
    [prompt] = user_messages(scripted.inference_requests()[-1])
    assert prompt == "what is in df?"
    ip.run_cell("%unload_ext soba_nb")
    from soba_nb.notebook.input_transform import protect_question_marks

    assert protect_question_marks not in ip.input_transformers_cleanup


def test_one_pair_of_outer_quotes_is_not_part_of_the_prompt(ip, scripted):
    ip.run_cell('%soba "clean this dataframe and plot the outliers"')
    ip.run_cell("%soba 'it''s' quoted twice inside")
    first, second = (user_messages(r)[-1] for r in scripted.inference_requests()[-2:])
    assert first == "clean this dataframe and plot the outliers"
    assert second == "'it''s' quoted twice inside"


def test_options_come_first_and_the_prompt_stays_verbatim():
    options, prompt = split_options(
        '--model gpt-x --new   what\'s "this"  --not-an-option', frozenset({"--model"})
    )
    assert options == ["--model", "gpt-x", "--new"]
    assert prompt == 'what\'s "this"  --not-an-option'
    assert split_options("-- --new is text", frozenset()) == ([], "--new is text")
    assert substitute_variables("{a}{b}", {"a": [1]}) == "[1]{b}"


# -- bad arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("magic", "line"),
    [
        ("soba", "--bogus hi"),
        ("soba", "--model"),
        ("soba", ""),
        ("soba", "/frobnicate now"),
        ("auto_compact", "maybe"),
        ("rewind", "ck_1 ck_2"),
        ("rewind", "ck_00000000"),
        ("budget", "extra"),
        ("capsule", ""),
        ("capsule", "frob"),
        ("capsule", "export ck_deadbeef"),
        ("capsule", 'create "unclosed'),
        ("capsule", "load missing.capsule.md"),
        ("capsule", "show ck_00000000"),
    ],
)
def test_bad_arguments_are_one_line_usage_errors(ip, magic, line):
    with pytest.raises(UsageError) as raised:
        ip.run_line_magic(magic, line)
    message = str(raised.value)
    assert message and "\n" not in message


def test_a_usage_error_in_a_cell_prints_no_traceback(ip, capsys):
    ip.run_cell("%soba --bogus hi")
    captured = capsys.readouterr()
    assert "UsageError: %soba: unrecognized arguments: --bogus" in captured.err
    assert "Traceback" not in captured.out + captured.err


def test_a_bad_config_is_one_line_naming_the_key(ip, nb_dir, llm_server, capsys):
    write_soba_json(nb_dir, llm_server.url, {"model": {"contextWindow": -5}})
    with pytest.raises(UsageError, match="contextWindow") as raised:
        ip.run_line_magic("budget", "")
    assert "\n" not in str(raised.value)
    ip.run_cell("%soba hello")
    assert "Traceback" not in capsys.readouterr().err


# -- session location, resume, --new, --session ---------------------------------------------


def test_location_from_session_env_vscode_and_fallback(tmp_path):
    (tmp_path / "repo" / "sub").mkdir(parents=True)
    (tmp_path / "repo" / ".git").mkdir()
    sub = tmp_path / "repo" / "sub"
    found = locate({"__session__": str(sub / "a.ipynb")}, environ={}, cwd=tmp_path)
    assert found == (sub / "a.ipynb", sub / "a.soba", tmp_path / "repo")
    from_env = locate({}, environ={"JPY_SESSION_NAME": "sub/b.ipynb"}, cwd=sub)
    assert from_env.notebook == sub / "b.ipynb"  # server-relative path, kernel in its folder
    vscode = locate({"__vsc_ipynb_file__": str(sub / "c.ipynb")}, environ={}, cwd=tmp_path)
    assert vscode.sessions_dir == sub / "c.soba"
    console = locate({"__session__": "console-1-abcd"}, environ={}, cwd=sub)
    assert console == (None, sub / "untitled.soba", tmp_path / "repo")
    override = locate({}, environ={}, cwd=sub, session_file=Path("elsewhere/s.jsonl"))
    assert override.sessions_dir == sub / "elsewhere"


def test_resume_after_a_restart_continues_the_same_transcript(ip, nb_dir, scripted):
    scripted.script(text("Answer one."))
    ip.run_line_magic("soba", "first question")
    first_file = magics(ip).agent.file

    shut_down(ip)  # the kernel restarts
    shell = new_shell(nb_dir)
    scripted.script(text("Answer two."))
    shell.run_line_magic("soba", "second question")

    assert magics(shell).agent.file == first_file
    request = scripted.inference_requests()[-1]
    assert user_messages(request) == ["first question", "second question"]
    assert any(m["role"] == "assistant" and m["content"] == "Answer one." for m in request["messages"])


def test_new_starts_a_fresh_session(ip, scripted):
    ip.run_line_magic("soba", "old question")
    old_file = magics(ip).agent.file
    ip.run_line_magic("soba", "--new fresh question")
    assert magics(ip).agent.file != old_file
    assert user_messages(scripted.inference_requests()[-1]) == ["fresh question"]


def test_model_option_switches_the_model_from_then_on(ip, scripted):
    ip.run_line_magic("soba", "--model gpt-4o-mini hello")
    ip.run_line_magic("soba", "and again")
    assert [r["model"] for r in scripted.inference_requests()] == ["gpt-4o-mini", "gpt-4o-mini"]
    assert magics(ip).agent.config.model.name == "gpt-4o-mini"


def test_session_option_selects_a_transcript_file(ip, nb_dir, scripted):
    with pytest.raises(UsageError, match="does not exist; add --new to start a session there"):
        ip.run_line_magic("soba", "--session elsewhere/mine.jsonl hello there")
    assert not (nb_dir / "elsewhere").exists()
    ip.run_line_magic("soba", "--new --session elsewhere/mine.jsonl hello there")
    ip.run_line_magic("soba", "and again")
    assert magics(ip).agent.file == nb_dir / "elsewhere" / "mine.jsonl"
    assert user_messages(scripted.inference_requests()[-1]) == ["hello there", "and again"]


# -- budget, auto-compact, compact ---------------------------------------------------------


def test_budget_shows_the_engines_figures_for_the_worked_example(ip, nb_dir, llm_server):
    write_soba_json(nb_dir, llm_server.url, WORKED_EXAMPLE)
    with capture_output() as out:
        ip.run_line_magic("budget", "")
    agent = magics(ip).agent
    measured = agent.compactor.measure()
    assert f"Budget: {measured.effective:,} / 48,808 tokens" in out.stdout
    assert "softLimit 39,046" in out.stdout
    assert f"source {measured.source}" in out.stdout and "auto on" in out.stdout
    with capture_output() as slash:
        ip.run_line_magic("soba", "/budget")
    assert slash.stdout == out.stdout


def test_auto_compact_off_turns_soft_triggers_off(ip, scripted):
    with capture_output() as out:
        ip.run_line_magic("auto_compact", "off")
    agent = magics(ip).agent
    assert "auto compaction off" in out.stdout
    assert agent.limits.auto is False and agent.compactor.thresholds.auto is False
    assert agent.compactor.thresholds.hard_limit == agent.config.hard_limit  # the hard limit stays
    ip.run_line_magic("soba", "--new start over")  # the setting outlives the session
    assert magics(ip).agent.compactor.thresholds.auto is False
    ip.run_line_magic("soba", "/auto-compact on")
    assert magics(ip).agent.compactor.thresholds.auto is True


def test_compact_with_nothing_to_compact_prints_skipped(ip, scripted, capsys):
    ip.run_line_magic("compact", "")
    assert capsys.readouterr().out.startswith("skipped: ")
    ip.run_line_magic("soba", "one short question")
    capsys.readouterr()
    ip.run_line_magic("compact", "")
    out = capsys.readouterr().out
    assert "skipped: nothing to compact" in out
    assert not any(isinstance(e, CapsuleEntry) for e in transcript(ip).path())
    # in plain words: what is kept, what the session has, and what to do instead
    keep = magics(ip).agent.config.compaction.keep_recent_tokens
    said = re.search(r"the last ([\d,]+) tokens are kept whole \(compaction.keepRecentTokens\) and the session has ([\d,]+); nothing older to compact\n", out)
    assert said and said.group(1) == f"{keep:,}" and 0 < int(said.group(2).replace(",", "")) < keep, out
    assert "empty" not in out and '%capsule create "TITLE" writes a capsule file without compacting' in out
    ip.run_line_magic("budget", "")  # its last attempt, in the same words
    assert said.group(0) in capsys.readouterr().out


def test_compact_after_a_few_turns_appends_a_capsule_and_prints_the_result(ip, nb_dir, scripted, capsys):
    some_turns(ip, scripted)
    capsys.readouterr()
    ip.run_line_magic("compact", "keep the column notes")
    out = capsys.readouterr().out
    [capsule] = [e for e in transcript(ip).path() if isinstance(e, CapsuleEntry)]
    assert f"Compacted (user) · {capsule.tokens_before:,} → {capsule.tokens_after:,} tokens" in out
    assert capsule.checkpoint_id in out and capsule.quality == "full"
    summary_request = [r for r in scripted.server.requests if r.operation == "compaction"][-1]
    assert "keep the column notes" in json.dumps(summary_request.body)
    assert (nb_dir / ".soba" / "memory" / f"{capsule.checkpoint_id}.capsule.md").is_file()
    assert "mirrored to project memory" in out

    ip.run_line_magic("soba", "next question")
    carried = json.dumps(scripted.inference_requests()[-1].body)
    assert "Keep cleaning the dataframe." in carried  # the capsule reaches the model
    assert "Answer 0." not in carried  # what the capsule replaced is not sent again…
    # …but the user's requests are, verbatim, in the capsule, marked done (SPEC §14)
    assert carried.count("question 0: describe the data") == 1 and "done:" in carried


def test_slash_compact_and_a_degraded_capsule_says_fallback(ip, scripted, capsys):
    some_turns(ip, scripted)
    scripted.summary = text("Error: the model is overloaded")
    capsys.readouterr()
    ip.run_line_magic("soba", "/compact")
    out = capsys.readouterr().out
    assert "Compacted (user)" in out and "fallback" in out
    assert "mirrored" not in out  # degraded capsules stay in their session


# -- rewind ---------------------------------------------------------------------------------


def test_rewind_moves_the_leaf_and_later_work_branches(ip, scripted, capsys):
    ip.run_line_magic("soba", "first")
    ip.run_line_magic("soba", "second")
    turns = [e for e in transcript(ip).path() if isinstance(e, CheckpointEntry) and e.kind == "turn"]
    ip.run_line_magic("rewind", turns[0].checkpoint_id)
    assert f"rewound to {turns[0].checkpoint_id}" in capsys.readouterr().out
    ip.run_line_magic("soba", "third")
    assert user_messages(scripted.inference_requests()[-1]) == ["first", "third"]
    ip.run_line_magic("soba", f"/rewind {turns[1].checkpoint_id}")  # the old branch is still there
    ip.run_line_magic("soba", "fourth")
    assert user_messages(scripted.inference_requests()[-1]) == ["first", "second", "fourth"]


# -- capsules -------------------------------------------------------------------------------


def test_capsule_commands(ip, nb_dir, scripted, capsys):
    some_turns(ip, scripted)
    ip.run_line_magic("compact", "")
    [capsule] = [e for e in transcript(ip).path() if isinstance(e, CapsuleEntry)]
    ck = capsule.checkpoint_id
    capsys.readouterr()

    ip.run_line_magic("capsule", "list")
    assert ck in capsys.readouterr().out
    ip.run_line_magic("capsule", "show")
    assert "## Goal and constraints" in capsys.readouterr().out
    ip.run_line_magic("capsule", "list --memory")
    assert f"{ck}.capsule.md" in capsys.readouterr().out

    ip.run_line_magic("capsule", f"export {ck} handoff.capsule.md")
    assert (nb_dir / "handoff.capsule.md").is_file()
    with pytest.raises(UsageError, match="already exists"):
        ip.run_line_magic("capsule", f"export {ck} handoff.capsule.md")
    ip.run_line_magic("soba", f"/capsule export {ck} handoff.capsule.md --force")

    entries_before = len(transcript(ip))
    ip.run_line_magic("capsule", 'create "Churn model — handoff"')
    created = nb_dir / "churn-model-handoff.capsule.md"
    assert created.is_file() and "## Goal and constraints" in created.read_text()
    # create leaves the conversation unchanged: it records a user checkpoint naming the file,
    # and the usage of its summary request (SPEC §11: compaction requests are priced too)
    added = transcript(ip).entries[entries_before:]
    assert sorted(type(e).__name__ for e in added) == ["CheckpointEntry", "UsageEntry"]
    assert [e.operation for e in added if isinstance(e, UsageEntry)] == ["compaction"]
    assert "quality full" in capsys.readouterr().out

    ip.run_line_magic("soba", "--new")
    ip.run_line_magic("capsule", f"load {created.name}")
    assert "Keep cleaning the dataframe." in capsys.readouterr().out  # shows what was loaded
    [loaded] = [e for e in transcript(ip).path() if isinstance(e, CapsuleEntry)]
    assert loaded.trigger == "user" and loaded.source == str(created)
    ip.run_line_magic("soba", "continue")
    assert "Keep cleaning the dataframe." in json.dumps(scripted.inference_requests()[-1].body)


def test_skill_option_activates_a_skill(ip, nb_dir, scripted, capsys):
    skill = nb_dir / ".soba" / "skills" / "tidy"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("Always use tidy column names.", encoding="utf-8")
    ip.run_line_magic("soba", "--skill tidy clean the columns")
    assert "skill tidy active" in capsys.readouterr().out
    assert any(isinstance(e, SkillEntry) and e.name == "tidy" for e in transcript(ip).path())
    assert "Always use tidy column names." in json.dumps(scripted.inference_requests()[-1].body)
    with pytest.raises(UsageError, match="not found"):
        ip.run_line_magic("soba", "--skill nope hello")


# -- cancel ---------------------------------------------------------------------------------


def _interrupt_when(condition, delay_s: float = 0.15) -> threading.Event:
    """Interrupt the main thread (as a kernel interrupt does) once `condition` holds; the
    returned event says it did (never fired on timeout, so a failure cannot hit pytest)."""
    fired = threading.Event()

    def run() -> None:
        deadline = time.monotonic() + 5
        while not condition():
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        time.sleep(delay_s)
        fired.set()
        _thread.interrupt_main()

    threading.Thread(target=run, daemon=True).start()
    return fired


def test_interrupting_a_turn_cancels_cleanly_and_the_next_turn_works(ip, scripted, capsys):
    scripted.script(text("word " * 60, chunks=60, chunk_delay_s=0.05))
    fired = _interrupt_when(lambda: len(scripted.inference_requests()) >= 1)
    ip.run_line_magic("soba", "a long answer please")
    assert fired.is_set()
    assert "cancelled" in capsys.readouterr().out
    assert magics(ip)._cancel is None
    scripted.script(text("Back to work."))
    ip.run_line_magic("soba", "are you there?")
    assert "Back to work." in capsys.readouterr().out
    assert user_messages(scripted.inference_requests()[-1])[-1] == "are you there?"


def test_interrupting_a_compaction_appends_no_capsule(ip, scripted, capsys):
    some_turns(ip, scripted)
    scripted.summary = text(good_summary(), delay_s=3)
    requests = scripted.server.requests
    fired = _interrupt_when(
        lambda: any(r.operation == "compaction" for r in scripted.server.requests[len(requests) :])
    )
    capsys.readouterr()
    ip.run_line_magic("compact", "")
    assert fired.is_set()
    assert "cancelled" in capsys.readouterr().out
    assert not any(isinstance(e, CapsuleEntry) for e in transcript(ip).path())
    ip.run_line_magic("soba", "still fine?")
    assert user_messages(scripted.inference_requests()[-1])[-1] == "still fine?"


def test_cancel_option_stops_a_turn_running_in_another_thread(ip, scripted, capsys):
    ip.run_line_magic("soba", "--cancel")
    assert "nothing is running" in capsys.readouterr().out
    scripted.script(text("slow " * 80, chunks=80, chunk_delay_s=0.05))
    instance = magics(ip)
    results = []
    worker = threading.Thread(target=lambda: results.append(instance.run_prompt("slow please")))
    worker.start()
    assert scripted.server.wait_until(lambda: len(scripted.inference_requests()) >= 1)
    ip.run_line_magic("soba", "--cancel")
    worker.join(timeout=10)
    assert "cancel requested" in capsys.readouterr().out
    assert results[0].status == "cancelled"


# -- plain-text parity ------------------------------------------------------------------------


def test_rich_output_carries_the_same_text_as_plain(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.display_mode = 'rich'")
    scripted.script(tool_calls(("python", {"code": "print('hi')"})), text("Done: **hi** printed.", chunks=4))
    with capture_output() as cap:
        ip.run_line_magic("soba", "say hi")
        ip.run_line_magic("budget", "")
    bundles = [output.data for output in cap.outputs]
    assert bundles and all("text/plain" in b and not b["text/plain"].startswith("<") for b in bundles)
    receipts = [b for b in bundles if "<details" in b.get("text/html", "")]
    assert receipts[-1]["text/plain"].startswith("[python: ") and "· ok ·" in receipts[-1]["text/plain"]
    answers = [b for b in bundles if "text/markdown" in b]
    assert answers[-1]["text/markdown"] == answers[-1]["text/plain"] == "Done: **hi** printed."
    budget = bundles[-1]
    assert set(budget) == {"text/html", "text/plain"}  # a static snapshot, no widget
    assert "Budget: " in budget["text/plain"] and "/ 5,000 tokens" in budget["text/plain"]


# -- %soba /fix and %soba /code (SPEC §10) ---------------------------------------------------------


def run_cell(ip, source: str):
    """A cell as a kernel runs it: its events fire and it gets an execution count."""
    return ip.run_cell(source, store_history=True)


def test_fix_sends_the_failing_cell_and_its_traceback_and_proposes_the_corrected_cell(ip, scripted):
    run_cell(ip, "sales = {'amount': [120, 80, 45]}")
    run_cell(ip, "def total(column):\n    return sum(sales[column])\n\nrevenue = total('revenue')")
    run_cell(ip, "note = 'a later cell that works'")
    corrected = "def total(column):\n    return sum(sales[column])\n\nrevenue = total('amount')"
    scripted.script(tool_calls(("add_cell", {"source": corrected})), text("The key is 'amount', not 'revenue'."))
    with capture_output() as shown:
        run_cell(ip, "%soba /fix keep the function")
    first = scripted.inference_requests()[0]
    request = user_messages(first)[-1]
    # The cells block ahead carries the failed cell: the request names it and repeats nothing.
    assert request.startswith("Fix the notebook cell In [2] above, which failed.")
    assert "revenue = total('revenue')" not in request and "Also: keep the function" in request
    sent = "\n".join(user_messages(first))
    assert sent.count("revenue = total('revenue')") == 1 and sent.count("KeyError: 'revenue'") == 1
    assert "Traceback" in sent and 'File "In [2]", line 2, in total' in sent
    assert sent.index("KeyError: 'revenue'") < sent.index("Fix the notebook cell")
    assert ip.rl_next_input == corrected  # proposed below the running cell, not run
    assert "revenue" not in ip.user_ns and corrected in shown.stdout


def test_fix_fences_a_cell_that_holds_backticks(ip, nb_dir, scripted):
    # No cells block (contextTokens 0): the request itself carries the cell, fenced.
    soba_json = nb_dir / "soba.json"
    soba_json.write_text(soba_json.read_text().replace('"compaction"', '"notebook": {"contextTokens": 0}, "compaction"'))
    run_cell(ip, "fence = '````'\nraise ValueError('``` in the message')")
    scripted.script(text("Fine."))
    run_cell(ip, "%soba /fix")
    request = user_messages(scripted.inference_requests()[-1])[-1]
    assert "`````python\nfence = '````'\nraise ValueError('``` in the message')\n`````" in request
    assert "````\nValueError: ``` in the message\n" in request


def test_fix_with_no_failed_cell_says_so_in_one_line_and_sends_nothing(ip, scripted):
    run_cell(ip, "a = 1")
    with capture_output() as shown:
        run_cell(ip, "%soba /fix")
    assert shown.stdout.strip().splitlines() == ["nothing to fix: no cell has raised since %load_ext soba_nb in this kernel"]
    assert scripted.server.requests == []


def test_code_writes_the_successful_python_calls_of_the_current_path(ip, nb_dir, scripted):
    scripted.script(
        tool_calls(("python", {"code": "prices = [3, 4, 5]"}), ("python", {"code": "prices.total()"})),
        text("Loaded."),
        tool_calls(("python", {"code": "abandoned = sum(prices)"})),
        text("On a branch."),
        tool_calls(("python", {"code": "mean = sum(prices) / len(prices)\nmean"})),
        text("Done."),
    )
    ip.run_line_magic("soba", "load the prices")
    ip.run_line_magic("soba", "work we will rewind")
    turns = [e for e in transcript(ip).path() if isinstance(e, CheckpointEntry) and e.kind == "turn"]
    ip.run_line_magic("rewind", turns[0].checkpoint_id)
    ip.run_line_magic("soba", "the mean price")
    with capture_output() as shown:
        ip.run_line_magic("soba", "/code")
    cells = [cell.strip() for cell in shown.stdout.split("# %%\n")[1:]]
    assert [cell.splitlines()[0].split(" · ")[1] for cell in cells] == ["for: load the prices", "for: the mean price"]
    assert cells[0].endswith("prices = [3, 4, 5]") and cells[1].endswith("mean = sum(prices) / len(prices)\nmean")
    assert "prices.total()" not in shown.stdout and "abandoned" not in shown.stdout

    import nbformat

    out = nb_dir / "the steps.ipynb"
    with capture_output() as shown:
        ip.run_line_magic("soba", '/code "the steps.ipynb"')
    assert shown.stdout.strip() == "wrote the code of 2 python calls to the steps.ipynb"
    nbformat.validate(nbformat.read(out, as_version=4))
    with pytest.raises(UsageError, match="already exists; add --force"):
        ip.run_line_magic("soba", '/code "the steps.ipynb"')
    out.write_text("{}")
    ip.run_line_magic("soba", '/code "the steps.ipynb" --force')
    nbformat.validate(nbformat.read(out, as_version=4))
    with pytest.raises(UsageError, match="is a folder"):
        ip.run_line_magic("soba", f"/code {nb_dir}")
