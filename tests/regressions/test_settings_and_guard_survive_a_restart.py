"""`%auto_compact off` and the loop guard's pause survive a kernel restart.

Found through the magics: both were in memory only, so a kernel restart turned auto back on,
`soba-nb budget` reported "auto on" for a session where it was off, and a paused guard
forgot its three fruitless attempts and tried again at once.
"""

from __future__ import annotations

import json

from compaction_support import good_summary, words
from conftest import SMALL_LIMITS, new_shell, shut_down, write_soba_json
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.cli import main as cli_main
from soba_nb.compaction.triggers import LOOP_GUARD_FAILURES

LONG_ANSWER = "The data has many columns worth describing. " * 45
"""About 400 tokens."""


def restart(ip, nb_dir):
    shut_down(ip)
    return new_shell(nb_dir)


def session_file(ip):
    return ip.magics_manager.registry["SobaMagics"].agent.file


def test_auto_compact_off_is_kept_by_the_session(ip, nb_dir, scripted, capsys):
    ip.run_line_magic("auto_compact", "off")
    scripted.script(text("Noted."))
    ip.run_line_magic("soba", "remember this")
    path = session_file(ip)

    ip = restart(ip, nb_dir)
    with capture_output() as out:
        ip.run_line_magic("budget", "")
    assert "auto off" in out.stdout
    assert ip.magics_manager.registry["SobaMagics"].agent.compactor.thresholds.auto is False

    capsys.readouterr()
    assert cli_main(["budget", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["auto"] is False and "session setting" in report["autoSource"]

    ip.run_line_magic("auto_compact", "on")
    ip = restart(ip, nb_dir)
    assert ip.magics_manager.registry["SobaMagics"].agent is None
    with capture_output() as out:
        ip.run_line_magic("budget", "")
    assert "auto on" in out.stdout


def test_the_loop_guards_pause_holds_after_a_restart(ip, nb_dir, scripted):
    # Every soft attempt ends "skipped": the summary is cut short (over twice maxOutputTokens)
    # and the deterministic capsule that replaces it reclaims about a quarter, under this
    # floor (set here: how much a fallback reclaims moves with the tool schemas' size).
    write_soba_json(nb_dir, scripted.server.url, {**SMALL_LIMITS, "compaction": {**SMALL_LIMITS["compaction"], "minSavingsRatio": 0.4}})
    scripted.summary = text(good_summary(words(2500)))
    ip.run_line_magic("auto_compact", "off")
    engine = ip.magics_manager.registry["SobaMagics"].agent.compactor
    index = 0
    while engine.measure().effective < engine.thresholds.soft_limit:
        scripted.script(text(f"Answer {index}. {LONG_ANSWER}"))
        ip.run_line_magic("soba", f"question {index}")
        index += 1
    assert engine.measure().effective < engine.thresholds.hard_limit - 200
    ip.run_line_magic("auto_compact", "on")
    attempts = 0
    for index in range(LOOP_GUARD_FAILURES):
        before = len([r for r in scripted.server.requests if r.operation == "compaction"])
        scripted.script(text("Short answer."))
        ip.run_line_magic("soba", f"small question {index}")
        attempts += len([r for r in scripted.server.requests if r.operation == "compaction"]) - before
    assert attempts == LOOP_GUARD_FAILURES  # one fruitless soft attempt per turn

    ip = restart(ip, nb_dir)
    with capture_output() as out:
        ip.run_line_magic("budget", "")
    assert "Soft triggers paused" in out.stdout
    before = len([r for r in scripted.server.requests if r.operation == "compaction"])
    scripted.script(text("Still short."))
    ip.run_line_magic("soba", "one more small question")
    assert len([r for r in scripted.server.requests if r.operation == "compaction"]) == before
