"""The fact-retention benchmark (benchmarks/retention.py): its generator plants what it says,
its scorer tells a kept fact from a lost one, and the deterministic capsule keeps every
planted file, command outcome, dataframe and the latest request (SPEC §4: "every file
touched, every command run and its last outcome, and the latest user goal survive it").

No embedded model here: those methods take minutes and are the benchmark's business.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.retention_facts import TARGET_KINDS, Fact, Kind, score, shape_forms, survives
from benchmarks.retention_methods import (
    CLOUD,
    LOCAL,
    Profile,
    compact_along,
    compact_once,
    history_tokens,
    write,
)
from benchmarks.retention_plan import LINT_COMMAND, TEST_COMMAND, generate_session
from benchmarks.retention_sessions import SyntheticSession, write_session
from soba_nb.transcript.entries import MessageEntry, SessionEntry, ToolCallEntry, ToolResultEntry
from soba_nb.transcript.store import Transcript

SEED = 7
SMALL_SESSION_TOKENS = 40_000


@pytest.fixture(scope="module")
def session() -> SyntheticSession:
    return generate_session(SEED, SMALL_SESSION_TOKENS)


@pytest.fixture(scope="module")
def written(session: SyntheticSession, tmp_path_factory: pytest.TempPathFactory) -> Transcript:
    path = tmp_path_factory.mktemp("retention") / "plain.jsonl"
    with Transcript.open(path, create_header=SessionEntry(model="openai/gpt-4o-mini")) as transcript:
        write_session(transcript, session)
    return Transcript.load(path)


def _runs(transcript: Transcript, name: str) -> list[tuple[str, ToolResultEntry]]:
    """(command or code, result) of every `name` call, in order."""
    results = {e.call_id: e for e in transcript.path() if isinstance(e, ToolResultEntry)}
    key = "command" if name == "shell" else "code"
    return [
        (json.loads(e.arguments)[key], results[e.call_id])
        for e in transcript.path()
        if isinstance(e, ToolCallEntry) and e.name == name
    ]


def _paths(transcript: Transcript, *tools: str) -> set[str]:
    return {json.loads(e.arguments)["path"] for e in transcript.path() if isinstance(e, ToolCallEntry) and e.name in tools}


# -- the generator --------------------------------------------------------------------------


def test_same_seed_same_session(session: SyntheticSession) -> None:
    again = generate_session(SEED, SMALL_SESSION_TOKENS)
    assert again.facts == session.facts
    assert [t.request for t in again.turns] == [t.request for t in session.turns]
    assert generate_session(SEED + 1, SMALL_SESSION_TOKENS).facts != session.facts


def test_every_kind_is_planted(session: SyntheticSession) -> None:
    assert all(session.facts_of(kind) for kind in Kind)


def test_files_and_runs_are_in_the_transcript_as_planted(session: SyntheticSession, written: Transcript) -> None:
    read, modified = _paths(written, "read_file"), _paths(written, "write_file", "edit_file")
    for fact in session.facts_of(Kind.FILES_READ):
        assert fact.label in read and fact.label not in modified
    python_runs = _runs(written, "python")
    python_writes = {path for code, _ in python_runs for path in modified | {"data/processed/features.parquet"} if path in code}
    for fact in session.facts_of(Kind.FILES_MODIFIED):
        assert fact.label in modified | python_writes
    runs = _runs(written, "shell") + python_runs
    for fact in [*session.facts_of(Kind.COMMANDS), *session.facts_of(Kind.BLOCKERS)]:
        if fact.check != "outcome":
            continue
        mine = [result for command, result in runs if command == fact.groups[0][0]]
        assert mine, fact.label
        assert mine[-1].is_error is (fact.outcome == "failed"), fact.label


def test_one_command_failed_then_passed_and_one_still_fails(written: Transcript) -> None:
    shell = _runs(written, "shell")
    tests = [result.is_error for command, result in shell if command == TEST_COMMAND]
    lint = [result.is_error for command, result in shell if command == LINT_COMMAND]
    assert tests[0] and not tests[-1]
    assert lint and all(lint)


def test_keys_occur_only_where_planted(session: SyntheticSession, written: Transcript) -> None:
    """A key found by chance would flatter every method."""
    users = [e.content.lower() for e in written.path() if isinstance(e, MessageEntry) and e.role == "user"]
    goal = session.facts_of(Kind.GOAL)[0].groups[0][0].lower()
    assert [goal in text for text in users] == [True] + [False] * (len(users) - 1)
    outputs = "\n".join(e.content for e in written.path() if isinstance(e, ToolResultEntry))
    for fact in session.facts_of(Kind.FILES_READ) + session.facts_of(Kind.BLOCKERS):
        assert fact.groups[0][0] not in outputs, fact.label


def test_latest_request_is_the_last_user_message(session: SyntheticSession, written: Transcript) -> None:
    users = [e.content for e in written.path() if isinstance(e, MessageEntry) and e.role == "user"]
    assert users[-1] == session.latest_request == session.facts_of(Kind.LATEST_REQUEST)[0].label


def test_the_kernel_holds_dataframes_of_the_planted_shapes(session: SyntheticSession) -> None:
    namespace = session.namespace()
    for frame in session.frames:
        assert namespace[frame.name].shape == (frame.rows, len(frame.columns))
    assert {f.groups[0][0] for f in session.facts_of(Kind.DATAFRAMES)} == {f.name for f in session.frames}


def test_session_is_long(session: SyntheticSession) -> None:
    assert len(session.turns) > 12


# -- the scorer -----------------------------------------------------------------------------

LINT_FAILED = Fact(Kind.COMMANDS, "make lint", (("make lint",),), check="outcome", outcome="failed")
TESTS_PASSED = Fact(Kind.COMMANDS, "pytest", (("python -m pytest -q",),), check="outcome", outcome="ok")
FRAME = Fact(Kind.DATAFRAMES, "df", (("sales",), shape_forms(3000, 5)), window=160)


@pytest.mark.parametrize(
    ("fact", "text", "kept"),
    [
        (LINT_FAILED, "- shell `make lint` → exit status 2", True),
        (LINT_FAILED, "- shell `make lint` → exit status 0", False),
        (LINT_FAILED, "- shell `make build` → exit status 2", False),
        (LINT_FAILED, '{"command": "make lint"}\nTool result (shell, call c1, error):\nexit status: 2', True),
        (LINT_FAILED, "make lint failed twice; later: make lint → exit status 0", False),
        (TESTS_PASSED, "- shell `python -m pytest -q` → exit status 1\n- shell `python -m pytest -q` → exit status 0", True),
        (TESTS_PASSED, "- shell `python -m pytest -q` → exit status 0\n- shell `python -m pytest -q` → exit status 1", False),
        (TESTS_PASSED, "- shell `python -m pytest -q` (no outcome) \n- shell `make lint` → exit status 0", False),
        (FRAME, "- sales: DataFrame 3000×5 · float32×5", True),
        (FRAME, "sales.shape\nresult: (3000, 5)", True),
        (FRAME, "- sales: DataFrame 3000×6", False),
        (FRAME, "- sales: DataFrame\n" + "x" * 400 + " 3000×5", False),
    ],
)
def test_scoring_finds_what_is_there_and_misses_what_is_not(fact: Fact, text: str, kept: bool) -> None:
    assert survives(fact, text, ["make lint", "python -m pytest -q", "make build"]) is kept


def test_score_counts_per_kind(session: SyntheticSession) -> None:
    everything = "\n".join(
        " ".join(option for group in fact.groups for option in group[:1]) + (" → exit status 0" if fact.outcome == "ok" else " → exit status 1")
        for fact in session.facts
    )
    assert score(session.facts, everything).lost == ()
    without = everything.replace(session.facts_of(Kind.FILES_READ)[0].label, "")
    lost = score(session.facts, without)
    assert lost.percent(Kind.FILES_READ) is not None and lost.percent(Kind.FILES_READ) < 100
    assert [f.label for f in lost.lost] == [session.facts_of(Kind.FILES_READ)[0].label]


# -- the deterministic capsule through the product's compaction path ------------------------


@pytest.mark.parametrize("profile", [LOCAL, CLOUD], ids=["local-8k", "cloud-128k"])
def test_deterministic_capsule_keeps_every_target_fact(session: SyntheticSession, tmp_path: Path, profile: Profile) -> None:
    config = profile.config()
    path = write(session, tmp_path / "session.jsonl", config)
    run = compact_once(path, "deterministic", config, session.namespace())
    assert run.compactions == 1 and run.tokens_after < run.tokens_before
    result = score(session.facts, run.text)
    lost = [f"{f.kind.value}: {f.label}" for f in result.lost if f.kind in TARGET_KINDS]
    assert lost == []


def test_deterministic_capsule_keeps_every_target_fact_across_auto_compactions(session: SyntheticSession, tmp_path: Path) -> None:
    config = LOCAL.config()
    before = history_tokens(write(session, tmp_path / "plain.jsonl", config), config)
    run = compact_along(session, tmp_path / "along.jsonl", config, session.namespace(), before)
    assert run.compactions > 1
    result = score(session.facts, run.text)
    lost = [f"{f.kind.value}: {f.label}" for f in result.lost if f.kind in TARGET_KINDS]
    assert lost == []
