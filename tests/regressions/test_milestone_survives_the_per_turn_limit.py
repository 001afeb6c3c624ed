"""A milestone (or plan pivot) the agent records is honoured, once, at the next allowed attempt.

Found through the magics: a `checkpoint(kind="milestone")` from the agent was recorded and
then dropped by "one soft compaction attempt per turn already made" at the next preflight
of the same turn (an auto_threshold compaction had run earlier in that turn), so the
milestone never compacted anything.
"""

from __future__ import annotations

import json

import pytest
from conftest import new_shell, shut_down
from llm_server import text, tool_calls

from soba_nb.transcript.entries import CheckpointEntry, CompactionEntry, MessageEntry
from soba_nb.transcript.store import Transcript

LONG_ANSWER = "The data has many columns worth describing. " * 45
"""About 400 tokens."""


def _flight(agent) -> list[dict]:
    path = agent.file.parent / "flight.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _grow_to_the_soft_limit(ip, scripted) -> None:
    ip.run_line_magic("auto_compact", "off")
    engine = ip.magics_manager.registry["SobaMagics"].agent.compactor
    index = 0
    while engine.measure().effective < engine.thresholds.soft_limit:
        scripted.script(text(f"Answer {index}. {LONG_ANSWER}"))
        ip.run_line_magic("soba", f"question {index}")
        index += 1
    ip.run_line_magic("auto_compact", "on")


def _milestone_turn(ip, scripted, kind: str = "milestone") -> CheckpointEntry:
    scripted.script(
        tool_calls(("checkpoint", {"kind": kind, "note": "cleaning done"}), content="Marking it."),
        text("Cleaning is done."),
    )
    ip.run_line_magic("soba", "finish the cleaning and mark the milestone")
    agent = ip.magics_manager.registry["SobaMagics"].agent
    [milestone] = [e for e in Transcript.load(agent.file).path() if isinstance(e, CheckpointEntry) and e.kind == kind]
    return milestone


@pytest.mark.parametrize("kind", ["milestone", "plan_pivot"])
def test_a_milestone_after_an_auto_compaction_in_the_same_turn_runs_next_turn(ip, scripted, kind):
    _grow_to_the_soft_limit(ip, scripted)
    milestone = _milestone_turn(ip, scripted, kind)
    agent = ip.magics_manager.registry["SobaMagics"].agent
    assert [f["trigger"] for f in _flight(agent)] == ["auto_threshold"]  # the turn's one soft attempt
    assert milestone.checkpoint_id in {c.checkpoint_id for c in agent.compactor.tracker.pending_intents}

    scripted.script(text("Next."))
    ip.run_line_magic("soba", "what next?")
    path = Transcript.load(agent.file).path()
    triggers = [f["trigger"] for f in _flight(agent)]
    assert triggers == ["auto_threshold", kind]
    ran_at = max(i for i, e in enumerate(path) if isinstance(e, MessageEntry) and e.content == "what next?")
    consumed = [e for e in path if isinstance(e, CompactionEntry) and milestone.checkpoint_id in e.consumed]
    assert all(path.index(e) > ran_at for e in consumed)
    # The milestone is consumed (the turn just finished leaves its own `turn` intent, by design).
    assert [c.kind for c in agent.compactor.tracker.pending_intents] in ([], ["turn"])

    scripted.script(text("And again."))
    ip.run_line_magic("soba", "anything else?")
    assert [f["trigger"] for f in _flight(agent)].count(kind) == 1  # consumed exactly once


def test_a_pending_milestone_survives_a_restart(ip, nb_dir, scripted):
    _grow_to_the_soft_limit(ip, scripted)
    milestone = _milestone_turn(ip, scripted)
    shut_down(ip)
    ip = new_shell(nb_dir)
    scripted.script(text("Resumed."))
    ip.run_line_magic("soba", "carry on")
    agent = ip.magics_manager.registry["SobaMagics"].agent
    assert [f["trigger"] for f in _flight(agent)] == ["auto_threshold", "milestone"]
    assert milestone.checkpoint_id not in {c.checkpoint_id for c in agent.compactor.tracker.pending_intents}
