"""Rewind and resume across compactions (SPEC §7, §9), at the session level."""

from __future__ import annotations

import pytest
from compaction_support import FakeSummarizer, add_exchange

from soba_nb.agent import assembly
from soba_nb.agent.session import AgentSession, RewindError
from soba_nb.compaction.compactor import SummaryModels
from soba_nb.compaction.outcomes import Outcome
from soba_nb.compaction.triggers import TurnState
from soba_nb.config import build_config
from soba_nb.layout import SessionLayout
from soba_nb.transcript.entries import CapsuleEntry, MessageEntry

CONFIG = build_config([(
    "test",
    {
        "model": {"provider": "openai", "name": "gpt-4o", "contextWindow": 6000, "maxOutputTokens": 500},
        "compaction": {
            "minTokensForAutoCompact": 1500, "minReclaimableTokens": 300, "keepRecentTokens": 600,
            "safetyReserveTokens": 500,
        },
    },
)])


def open_session(tmp_path, *, new: bool = False) -> AgentSession:
    session = assembly.open_session(
        CONFIG, assembly.choose_layout(tmp_path / "nb.soba", new=new), project_root=tmp_path, notebook=str(tmp_path / "nb.ipynb")
    )
    session.compactor.bind(SummaryModels(FakeSummarizer()))
    return session


def contents(session):
    built = session.compactor.model_input()
    return [m.content for m in built.messages]


def compacted_session(tmp_path):
    session = open_session(tmp_path)
    for i in range(8):
        add_exchange(session.transcript, 300, index=i)
    marker = session.compactor.record_checkpoint("user", "before compaction")
    result = session.compactor.compact()
    assert result.outcome is Outcome.COMPLETED
    return session, marker, result


def test_rewind_to_before_a_compaction_gives_back_the_full_context(tmp_path):
    session, marker, result = compacted_session(tmp_path)
    compacted = contents(session)
    assert compacted[0].startswith("Context Capsule")
    session.rewind(marker.checkpoint_id)
    restored = contents(session)
    assert not any(c.startswith("Context Capsule") for c in restored)
    assert any(c.startswith("request 0:") for c in restored)  # the oldest request is back
    assert session.compactor.measure().effective > result.tokens_after
    assert session.capsules() == []
    session.close()


def test_work_after_a_rewind_branches_and_the_old_branch_stays_in_the_file(tmp_path):
    session, marker, _ = compacted_session(tmp_path)
    session.transcript.append(MessageEntry(role="user", content="on the compacted branch"))
    session.rewind(marker.id)
    session.transcript.append(MessageEntry(role="user", content="on the new branch"))
    path_text = [getattr(e, "content", "") for e in session.transcript.path()]
    assert "on the new branch" in path_text and "on the compacted branch" not in path_text
    everything = [getattr(e, "content", "") for e in session.transcript.entries]
    assert "on the compacted branch" in everything
    session.close()


def test_rewind_to_after_a_compaction_keeps_the_capsule(tmp_path):
    session, _, result = compacted_session(tmp_path)
    after = session.transcript.append(MessageEntry(role="user", content="later"))
    session.transcript.append(MessageEntry(role="assistant", content="answer"))
    session.rewind(after.id)
    assert contents(session)[0].startswith("Context Capsule")
    assert [c.checkpoint_id for c in session.capsules()] == [result.checkpoint_id]
    session.close()


def test_rewind_to_an_unknown_target_is_a_clear_error(tmp_path):
    session = open_session(tmp_path)
    with pytest.raises(RewindError, match="neither a checkpoint nor an entry id"):
        session.rewind("ck_nothere")
    session.close()


def test_resume_after_restart_continues_from_the_leaf_without_compacting_again(tmp_path):
    session, _, result = compacted_session(tmp_path)
    before = session.compactor.measure()
    leaf = session.transcript.leaf
    file = session.file
    session.close()

    resumed = open_session(tmp_path)
    assert resumed.file == file and resumed.transcript.leaf == leaf
    assert resumed.compactor.measure().effective == before.effective
    assert contents(resumed)[0].startswith("Context Capsule")
    assert resumed.compactor.preflight(TurnState()) is None
    assert [e.checkpoint_id for e in resumed.transcript.path() if isinstance(e, CapsuleEntry)] == [result.checkpoint_id]
    resumed.close()


def test_new_session_is_a_new_file(tmp_path):
    session, _, _ = compacted_session(tmp_path)
    session.close()
    fresh = open_session(tmp_path, new=True)
    assert fresh.file != session.file
    assert fresh.capsules() == []
    fresh.close()


def test_a_second_kernel_on_the_same_session_gets_a_clear_error(tmp_path):
    from soba_nb.transcript.store import TranscriptLockedError

    first = open_session(tmp_path)
    with pytest.raises(TranscriptLockedError, match="another writer"):
        assembly.open_session(CONFIG, SessionLayout(first.file), project_root=tmp_path)
    first.close()
