"""SPEC §9 CLI: `soba-nb inspect`, `verify` and `budget` on real transcript files."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from soba_nb import cli
from soba_nb.agent.prompt import SYSTEM_PROMPT
from soba_nb.agent.tools import TOOL_SCHEMAS
from soba_nb.cli import SUBCOMMANDS, main, subcommand
from soba_nb.compaction.model_input import assemble, entry_tokens, visible_context
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    MessageEntry,
    SessionEntry,
    ToolCallEntry,
    ToolResultEntry,
    UsageEntry,
)
from soba_nb.transcript.store import Transcript

MODEL = "openai/gpt-4o-mini"


@pytest.fixture
def notebook_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with a notebook, isolated from the real home folder and SOBA_* env."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in list(os.environ):
        if name.startswith("SOBA_"):
            monkeypatch.delenv(name)
    project = tmp_path / "project"
    project.mkdir()
    (project / "analysis.ipynb").write_text("{}", encoding="utf-8")
    return project


@pytest.fixture
def session(notebook_dir: Path) -> Iterator[Path]:
    """A session with two turns, a checkpoint and a capsule, then one more turn."""
    path = notebook_dir / "analysis.soba" / "s1.jsonl"
    with Transcript.open(
        path, create_header=SessionEntry(notebook="analysis.ipynb", model=MODEL)
    ) as store:
        store.append(MessageEntry(role="user", content="Load sales.csv and summarize revenue."))
        store.append(MessageEntry(role="assistant", content="Reading the file."))
        store.append(
            ToolCallEntry(call_id="c1", name="read_file", arguments='{"path": "sales.csv"}')
        )
        store.append(
            ToolResultEntry(call_id="c1", name="read_file", content="region,revenue\n" * 200)
        )
        store.append(MessageEntry(role="assistant", content="Revenue is highest in the north."))
        store.append(UsageEntry(input_tokens=2400, output_tokens=12, provider="openai"))
        store.append(
            CheckpointEntry(checkpoint_id="ck_aaaa0001", kind="milestone", note="data loaded")
        )
        kept = store.append(MessageEntry(role="user", content="Now plot it by month."))
        store.append(MessageEntry(role="assistant", content="Plotted to plot.png."))
        store.append(
            CapsuleEntry(
                operation_id="op_1",
                checkpoint_id="ck_bbbb0002",
                trigger="milestone",
                quality="degraded",
                tokens_before=5000,
                tokens_after=900,
                first_kept_entry_id=kept.id,
                content="## Goal and constraints\nSummarize revenue.",
            )
        )
        store.append(MessageEntry(role="user", content="Thanks, now by region."))
    yield path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write_lines(path: Path, *lines: dict[str, object], tail: str = "") -> Path:
    text = "".join(json.dumps(line) + "\n" for line in lines) + tail
    path.write_text(text, encoding="utf-8")
    return path


HEADER = {"type": "session", "id": "h", "parentId": None, "timestamp": "t", "model": MODEL}


def message(entry_id: str, parent: str | None, role: str = "user") -> dict[str, object]:
    return {"type": "message", "id": entry_id, "parentId": parent, "timestamp": "t", "role": role}


# -- inspect ---------------------------------------------------------------------------------


def test_inspect_text(capsys: pytest.CaptureFixture[str], session: Path) -> None:
    code, out, err = run(capsys, "inspect", str(session))
    assert code == 0, err
    transcript = Transcript.load(session)
    assert str(session) in out
    assert "version 1" in out and "analysis.ipynb" in out and MODEL in out
    assert "entries      12" in out
    assert "message 6" in out and "tool_call 1" in out and "capsule 1" in out
    assert f"leaf         {transcript.leaf}" in out
    assert "path         12 entries" in out
    assert "ck_aaaa0001  milestone   data loaded" in out
    assert "ck_bbbb0002  milestone" in out and "degraded" in out and "5000 → 900" in out
    assert "last provider usage: input 2400, output 12" in out
    assert "o200k_base" in out


def test_inspect_json(capsys: pytest.CaptureFixture[str], session: Path) -> None:
    code, out, _ = run(capsys, "inspect", "--json", str(session))
    assert code == 0
    info = json.loads(out)
    transcript = Transcript.load(session)
    assert info["entries"] == 12
    assert info["byType"] == {
        "message": 6,
        "session": 1,
        "tool_call": 1,
        "tool_result": 1,
        "usage": 1,
        "checkpoint": 1,
        "capsule": 1,
    }
    assert info["leaf"] == transcript.leaf
    assert info["pathLength"] == 12
    assert info["header"]["model"] == MODEL
    assert info["checkpoints"] == [
        {
            "checkpointId": "ck_aaaa0001",
            "kind": "milestone",
            "note": "data loaded",
            "id": transcript.entries[7].id,
        }
    ]
    (capsule,) = info["capsules"]
    assert capsule["trigger"] == "milestone"
    assert capsule["quality"] == "degraded"
    assert (capsule["tokensBefore"], capsule["tokensAfter"]) == (5000, 900)
    assert capsule["firstKeptEntryId"] == transcript.entries[8].id
    assert info["tokens"]["lastUsage"]["inputTokens"] == 2400


def test_token_figures_count_the_path(capsys: pytest.CaptureFixture[str], session: Path) -> None:
    _, out, _ = run(capsys, "inspect", "--json", str(session))
    tokens = json.loads(out)["tokens"]
    counter = TokenCounter.for_model("openai", "gpt-4o-mini")
    path = Transcript.load(session).path()
    assert tokens["pathTokens"] == sum(entry_tokens(entry, counter) for entry in path)
    # After the capsule the model input is the capsule, its kept tail and what follows:
    # the figure is what the agent would send.
    context = visible_context(path)
    assert context.capsule is not None
    assert [entry.type for entry in context.entries] == ["message", "message", "message"]
    sent = assemble(context, system=SYSTEM_PROMPT, tools=TOOL_SCHEMAS, counter=counter)
    assert tokens["estimatedTokens"] == sent.tokens
    assert (
        tokens["estimatedTokens"]
        - sent.tokens
        + sum(entry_tokens(entry, counter) for entry in context.entries)
        < tokens["pathTokens"]
    )
    # The usage figure predates the capsule, so it no longer measures the input.
    assert tokens["source"] == "estimated"
    assert tokens["effectiveTokens"] == tokens["estimatedTokens"]


def test_provider_usage_plus_what_came_after(
    capsys: pytest.CaptureFixture[str], notebook_dir: Path
) -> None:
    path = notebook_dir / "analysis.soba" / "s2.jsonl"
    with Transcript.open(path, create_header=SessionEntry(model=MODEL)) as store:
        store.append(MessageEntry(role="user", content="hello world"))
        answer = store.append(MessageEntry(role="assistant", content="hi"))
        store.append(UsageEntry(input_tokens=1000, output_tokens=5))
        after = store.append(MessageEntry(role="user", content="hello world"))
    _, out, _ = run(capsys, "inspect", "--json", str(path))
    tokens = json.loads(out)["tokens"]
    counter = TokenCounter.for_model("openai", "gpt-4o-mini")
    assert tokens["source"] == "provider_usage"
    # The figure measured the request before the answer; the answer and later entries add.
    assert tokens["effectiveTokens"] == 1000 + entry_tokens(answer, counter) + entry_tokens(
        after, counter
    )


def test_inspect_without_usage_or_header(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write_lines(tmp_path / "s.jsonl", message("m", None))
    code, out, _ = run(capsys, "inspect", str(path))
    assert code == 0
    assert "last provider usage: none recorded" in out
    assert "not a session header" in out


def test_inspect_a_bad_transcript(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_lines(tmp_path / "s.jsonl", HEADER, message("m", "ghost"))
    code, out, err = run(capsys, "inspect", str(path))
    assert code == 1
    assert out == ""
    assert err.startswith(f"{path}:2: ")
    assert err.count("\n") == 1


# -- verify ----------------------------------------------------------------------------------


def test_verify_ok(capsys: pytest.CaptureFixture[str], session: Path) -> None:
    code, out, err = run(capsys, "verify", str(session))
    assert code == 0
    assert out == f"ok: 12 entries, leaf {Transcript.load(session).leaf}\n"
    assert err == ""


@pytest.mark.parametrize(
    ("lines", "tail", "line", "words"),
    [
        ([HEADER], "not json\n" + json.dumps(message("m", "h")) + "\n", 2, "not valid JSON"),
        ([HEADER, message("m", "h"), message("m", "h")], "", 3, "duplicate id"),
        ([HEADER, message("m", "ghost")], "", 2, "parentId 'ghost'"),
        (
            [
                HEADER,
                {"type": "leaf", "id": "l", "parentId": "h", "timestamp": "t", "targetId": "x"},
            ],
            "",
            2,
            "targetId 'x'",
        ),
        ([HEADER, {"type": "message", "id": "m", "parentId": "h", "role": "robot"}], "", 2, "role"),
        (
            [
                HEADER,
                message("a", "h"),
                message("b", "a", "assistant"),
                {"type": "leaf", "id": "l", "parentId": "b", "timestamp": "t", "targetId": "h"},
                {
                    "type": "capsule",
                    "id": "c",
                    "parentId": "h",
                    "timestamp": "t",
                    "operationId": "o",
                    "checkpointId": "ck_00000001",
                    "trigger": "user",
                    "quality": "full",
                    "tokensBefore": 10,
                    "tokensAfter": 5,
                    "firstKeptEntryId": "b",
                    "content": "",
                },
            ],
            "",
            5,
            "firstKeptEntryId 'b' is not on its path",
        ),
    ],
)
def test_verify_reports_the_first_problem(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    lines: list[dict[str, object]],
    tail: str,
    line: int,
    words: str,
) -> None:
    path = write_lines(tmp_path / "s.jsonl", *lines, tail=tail)
    code, out, err = run(capsys, "verify", str(path))
    assert code == 1
    assert out == ""
    assert err.startswith(f"{path}:{line}: ")
    assert words in err
    assert err.count("\n") == 1


def test_verify_torn_last_line_is_a_warning(
    capsys: pytest.CaptureFixture[str], session: Path
) -> None:
    with session.open("ab") as handle:
        handle.write(b'{"type":"message","id":"x","par')
    code, out, err = run(capsys, "verify", str(session))
    assert code == 0
    assert out.startswith("ok: 12 entries")
    assert err == f"{session}:13: warning: torn line at the end ignored\n"


def test_verify_mentions_a_recovered_torn_line(
    capsys: pytest.CaptureFixture[str], session: Path
) -> None:
    with session.open("ab") as handle:
        handle.write(b'{"type":"message","id":"x","par')
    with pytest.warns(UserWarning), Transcript.open(session) as store:
        store.append(MessageEntry(role="user", content="after the crash"))
    code, out, err = run(capsys, "verify", str(session))
    assert code == 0
    assert out.startswith("ok: 13 entries")
    assert err == f"{session}:13: warning: torn line (recovered after a crash)\n"


def test_verify_repair_writes_a_copy_beside_the_original_and_names_what_it_left_out(
    capsys: pytest.CaptureFixture[str], session: Path
) -> None:
    with session.open("ab") as handle:
        handle.write(b"this line is garbage\n")
        handle.write(json.dumps({"type": "message", "id": "orphan", "parentId": "gone", "timestamp": "t", "role": "user"}).encode() + b"\n")
    before = session.read_bytes()
    code, _, err = run(capsys, "verify", str(session))
    assert code == 1 and ":13: not valid JSON" in err
    code, out, err = run(capsys, "verify", str(session), "--repair")
    assert code == 0
    repaired = session.with_name(session.stem + ".repaired.jsonl")
    assert f"repaired copy: {repaired} (13 entries kept, 1 line left out, 1 re-attached to the entry before a bad line)" in out
    assert f"{session}:13: left out: not valid JSON" in err
    assert f"{session}:14: re-attached to the entry on line 12 (its parent 'gone' was on a line left out)" in err
    assert session.read_bytes() == before  # never in place
    assert len(Transcript.load(repaired)) == 13
    code, _, err = run(capsys, "verify", str(session), "--repair")
    assert code == 1 and "already exists" in err  # never replaces an earlier copy


def test_verify_warns_about_a_second_root(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write_lines(tmp_path / "s.jsonl", HEADER, message("m", None))
    code, out, err = run(capsys, "verify", str(path))
    assert code == 0
    assert "ok: 2 entries, leaf m" in out
    assert f"{path}:2: warning: entry 'm' starts a second root" in err


# -- budget ----------------------------------------------------------------------------------


def test_budget_uses_the_notebook_folder_config(
    capsys: pytest.CaptureFixture[str], session: Path, notebook_dir: Path
) -> None:
    (notebook_dir / "soba.json").write_text(
        json.dumps(
            {"model": {"provider": "openai", "contextWindow": 65000, "maxOutputTokens": 8000}}
        ),
        encoding="utf-8",
    )
    code, out, err = run(capsys, "budget", "--json", str(session))
    assert code == 0, err
    info = json.loads(out)
    assert (info["hardLimit"], info["softLimit"]) == (48808, 39046)
    assert info["configFolder"] == str(notebook_dir.resolve())
    assert info["source"] == "estimated"
    assert info["effectiveTokens"] > 0
    assert info["overHardLimit"] is False
    code, out, _ = run(capsys, "budget", str(session))
    assert code == 0
    assert "hardLimit  48808" in out and "softLimit  39046" in out
    assert "(estimated)" in out


def long_session(folder: Path, rounds: int) -> Path:
    """`rounds` of request, answer and the provider's figure, then a new request."""
    path = folder / "analysis.soba" / "long.jsonl"
    with Transcript.open(path, create_header=SessionEntry(model=MODEL)) as store:
        for n in range(rounds):
            store.append(MessageEntry(role="user", content=f"question {n}: how is revenue in region {n}?"))
            store.append(MessageEntry(role="assistant", content=f"answer {n}: revenue grew by {n} percent."))
            store.append(UsageEntry(input_tokens=1000 + 50 * n, output_tokens=5))
        store.append(MessageEntry(role="user", content="Now plot it."))
    return path


def test_a_transcript_copied_alone_is_measured_from_its_last_figure(
    capsys: pytest.CaptureFixture[str], notebook_dir: Path
) -> None:
    """Issue 28: the effective figure needs only what came after the last usage figure; the
    local ones, which need every entry counted, say so unless asked (`--count`)."""
    path = long_session(notebook_dir, 150)
    (notebook_dir / "soba.json").write_text(json.dumps({"model": {"provider": "openai", "name": "gpt-4o-mini"}}))
    counter = TokenCounter.for_model("openai", "gpt-4o-mini")
    entries = Transcript.load(path).path()
    _, out, _ = run(capsys, "budget", "--json", str(path))
    info = json.loads(out)
    assert info["source"] == "provider_usage"
    assert info["effectiveTokens"] == 1000 + 50 * 149 + entry_tokens(entries[-3], counter) + entry_tokens(
        entries[-1], counter
    )
    assert info["estimatedTokens"] is None and info["uncountedEntries"] == 2 * 150 - 1
    _, out, _ = run(capsys, "budget", "--json", "--count", str(path))
    counted = json.loads(out)
    assert counted["effectiveTokens"] == info["effectiveTokens"] and counted["uncountedEntries"] == 0
    assert counted["estimatedTokens"] > sum(entry_tokens(entry, counter) for entry in entries)
    _, out, _ = run(capsys, "budget", str(path))
    assert "estimated  not counted (299 entries have no count" in out and "--count" in out
    _, out, _ = run(capsys, "inspect", str(path))
    assert "tokens       path not counted · model input not counted" in out
    _, out, _ = run(capsys, "inspect", "--json", "--count", str(path))
    tokens = json.loads(out)["tokens"]
    assert tokens["pathTokens"] == sum(entry_tokens(entry, counter) for entry in entries)
    assert tokens["estimatedTokens"] == counted["estimatedTokens"]


def test_a_transcript_alone_has_its_tokenizer_loaded_before_it_is_read(
    capsys: pytest.CaptureFixture[str], notebook_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It will be counted (from its last usage figure on): loaded first, the tokenizer's
    transient memory is reused by the transcript (a lower peak). When its end is plain text, the
    encoding's plain tokens are read instead (`soba_nb.plain_counts`: what follows the last
    figure is likely plain text too). A transcript with its budget state beside it may need no
    count: nothing is loaded ahead."""
    from soba_nb import plain_counts, tokens
    from soba_nb.layout import SessionLayout

    loaded_first: list[tuple[bool, bool]] = []
    load = Transcript.load

    def watched(file: Path) -> Transcript:
        loaded_first.append(("o200k_base" in tokens._ENCODINGS, "o200k_base" in plain_counts._COUNTERS))
        return load(file)

    monkeypatch.setattr(Transcript, "load", watched)
    path = long_session(notebook_dir, 3)
    with Transcript.open(path) as store:
        store.append(MessageEntry(role="user", content="Plot the revenue by région (地区), en français."))
    for budget_state in (False, True):
        monkeypatch.setattr(tokens, "_ENCODINGS", {})
        monkeypatch.setattr(plain_counts, "_COUNTERS", {})
        if budget_state:
            SessionLayout(path).budget.write_text("not a state: a rebuild costs nothing more")
        assert run(capsys, "budget", str(path))[0] == 0
    plain_path = long_session(notebook_dir / "plain", 3)
    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    assert run(capsys, "budget", str(plain_path))[0] == 0
    assert loaded_first == [(True, False), (False, False), (False, True)]
    assert "o200k_base" not in tokens._ENCODINGS  # what followed the last figure, counted from the table


def test_the_counts_kept_beside_a_transcript_give_every_figure(
    capsys: pytest.CaptureFixture[str], notebook_dir: Path
) -> None:
    """What a session keeps beside its transcript is read (never written): the figures a
    copy alone would not count are there."""
    from soba_nb.agent.assembly import open_session
    from soba_nb.agent.measure import measure_recorded
    from soba_nb.config import build_config
    from soba_nb.layout import SessionLayout

    path = long_session(notebook_dir, 150)
    config = build_config([("test", {"model": {"provider": "openai", "name": "gpt-4o-mini"}})])
    session = open_session(config, SessionLayout(path), project_root=notebook_dir)
    session.compactor.measure()
    session.compactor.tracker.settle()
    expected = session.compactor.measure()
    session.close()
    sidecars = sorted(p.name for p in path.parent.iterdir())
    _, out, _ = run(capsys, "budget", "--json", str(path))
    info = json.loads(out)
    assert (info["effectiveTokens"], info["estimatedTokens"], info["uncountedEntries"]) == (
        expected.effective, expected.estimated, 0,
    )  # fmt: skip
    assert sorted(p.name for p in path.parent.iterdir()) == sidecars  # nothing written
    _, alone = measure_recorded(Transcript.load(path), config)
    assert alone == expected and alone.backlog is None


def test_budget_with_a_bad_config(
    capsys: pytest.CaptureFixture[str], session: Path, notebook_dir: Path
) -> None:
    (notebook_dir / "soba.json").write_text(
        '{"compaction": {"keepRecentTokens": -1}}', encoding="utf-8"
    )
    code, out, err = run(capsys, "budget", str(session))
    assert code == 1
    assert out == ""
    assert "compaction.keepRecentTokens = -1" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("recorded", "said"),
    [
        ({"model": {"contextWindow": "big"}}, 'model.contextWindow = "big": input should be a valid integer'),
        ({"model": {"pricing": [[[]]]}}, "model.pricing = [[[]]]: must be a JSON object"),
        ({"agent": {"maxSessionCostUsd": float("nan")}}, "agent.maxSessionCostUsd = NaN: input should be a finite number"),
        ({"model": {"apiKeyEnv": "sk-proj-abcdefghijklmnopqrstuv0123456789"}}, "model.apiKeyEnv (value not shown): must be the name"),
        ({"compaction": {"timeoutMs": True}}, "compaction.timeoutMs = true: input should be a valid integer"),
    ],
)
def test_a_recorded_configuration_today_refuses_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, recorded: dict[str, object], said: str
) -> None:
    """A transcript is data (it may be hand-edited or planted): the configuration it recorded is
    checked as a soba.json is, and refused in one line naming the file, the key and the rule."""
    config = {"type": "config", "id": "c", "parentId": "h", "timestamp": "t", "config": recorded, "explicit": {}}
    path = write_lines(tmp_path / "s.jsonl", HEADER, config, message("m", "c"))
    for command in ("budget", "inspect"):
        code, out, err = run(capsys, command, str(path))
        assert (code, out) == (1, ""), command
        assert err.startswith(f"{path}: the recorded configuration is refused: {said}"), err
        assert err.count("\n") == 1 and "sk-proj" not in err and "Expected `" not in err


# -- usage errors and the table ----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [[], ["frobnicate"], ["verify"], ["verify", "a", "b"], ["inspect", "--bogus", "x"]],
)
def test_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith("soba-nb")
    assert err.count("\n") == 1


def test_missing_session_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "verify", str(tmp_path / "nope.jsonl"))
    assert code == 2
    assert err == f"soba-nb: error: {tmp_path / 'nope.jsonl'}: no such file\n"


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for name in ("inspect", "verify", "budget"):
        assert name in out


def test_subcommands_are_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert {"inspect", "verify", "budget"} <= set(SUBCOMMANDS)

    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("word")

    try:

        @subcommand("echo-test", "say a word", arguments)
        def echo(args: argparse.Namespace) -> int:
            print(args.word)
            return 0

        assert run(capsys, "echo-test", "hi") == (0, "hi\n", "")
        with pytest.raises(ValueError, match="twice"):
            subcommand("echo-test", "again", arguments)(echo)
    finally:
        cli.SUBCOMMANDS.pop("echo-test", None)


# -- SESSION: a transcript, or a notebook or its .soba folder ------------------------------------


def test_a_notebook_or_its_sessions_folder_stands_for_its_latest_session(
    capsys: pytest.CaptureFixture[str], session: Path, notebook_dir: Path
) -> None:
    """`soba-nb budget analysis.ipynb` is what a user types first: the session written last."""
    expected = run(capsys, "verify", str(session))
    for typed in (notebook_dir / "analysis.ipynb", notebook_dir / "analysis.soba"):
        assert run(capsys, "verify", str(typed)) == expected  # one session: said nothing more
    code, out, _ = run(capsys, "budget", str(notebook_dir / "analysis.ipynb"), "--json")
    assert code == 0 and json.loads(out)["session"] == str(session)

    older = notebook_dir / "analysis.soba" / "s0.jsonl"
    older.write_bytes(session.read_bytes())
    os.utime(older, (1_000_000, 1_000_000))  # written long before s1
    (notebook_dir / "analysis.soba" / "planted.jsonl").symlink_to(session)  # a link is no session
    code, out, err = run(capsys, "inspect", str(notebook_dir / "analysis.ipynb"), "--json")
    assert code == 0 and json.loads(out)["session"] == str(session)
    assert err == f"soba-nb: {notebook_dir / 'analysis.ipynb'}: the latest of 2 sessions, s1.jsonl\n"
    os.utime(older)  # now s0 was written last
    code, out, err = run(capsys, "budget", str(notebook_dir / "analysis.soba"), "--json")
    assert json.loads(out)["session"] == str(older) and err.endswith("the latest of 2 sessions, s0.jsonl\n")


def test_a_notebook_or_folder_without_a_session_is_one_line_of_usage_error(
    capsys: pytest.CaptureFixture[str], notebook_dir: Path
) -> None:
    (notebook_dir / "empty.soba").mkdir()
    for typed, said in (
        (notebook_dir / "analysis.ipynb", f"no soba-nb session for this notebook (no transcript in {notebook_dir / 'analysis.soba'})"),
        (notebook_dir / "other.ipynb", f"no soba-nb session for this notebook (no transcript in {notebook_dir / 'other.soba'})"),
        (notebook_dir / "empty.soba", "a folder with no soba-nb session transcript in it"),
        (notebook_dir, "a folder with no soba-nb session transcript in it"),
    ):
        code, out, err = run(capsys, "budget", str(typed))
        assert (code, out) == (2, "")
        assert err == f"soba-nb budget: error: argument SESSION: {typed}: {said} (see `soba-nb budget --help`)\n"


# -- the installed console script ----------------------------------------------------------------


def test_installed_script(session: Path, tmp_path: Path) -> None:
    script = shutil.which("soba-nb")
    if script is None:
        pytest.skip("the soba-nb console script is not installed (pip install -e .)")
    result = subprocess.run(
        [script, "verify", str(session)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: 12 entries, leaf ")
    broken = write_lines(tmp_path / "broken.jsonl", HEADER, message("m", "ghost"))
    result = subprocess.run(
        [script, "verify", str(broken)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"{broken}:2: ")
    # The script's exit skips the interpreter's last collections (`cli.console`): what a
    # command printed still reaches a pipe whole, as `main` printed it.
    result = subprocess.run(
        [script, "inspect", str(session), "--json"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["entries"] == 12


def test_console_is_main_then_a_frozen_heap(
    capsys: pytest.CaptureFixture[str], session: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    expected = run(capsys, "inspect", str(session), "--json")
    monkeypatch.setattr("sys.argv", ["soba-nb", "inspect", str(session), "--json"])
    assert gc.get_freeze_count() == 0
    try:
        code = cli.console()
        frozen = gc.get_freeze_count()
    finally:
        gc.unfreeze()  # this test process goes on
    out, err = capsys.readouterr()
    assert (code, out, err) == expected
    assert frozen > 10_000  # the modules and what the command left: the exit's collections skip them


# -- doctor ----------------------------------------------------------------------------------


def test_doctor_says_why_each_provider_was_chosen_or_passed_over(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "SOBA_BASE_URL", "SOBA_PROVIDER", "SOBA_MODEL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-not-a-real-key-but-set-0123456789")
    code, out, _ = run(capsys, "doctor", str(tmp_path))
    assert code == 0
    assert "provider   anthropic · Anthropic (ANTHROPIC_API_KEY is set)" in out
    assert "why        passed: no configuration sets model.provider" in out
    assert "passed: OPENAI_API_KEY is not set" in out and "chosen: ANTHROPIC_API_KEY is set" in out
    assert "window     200,000 (catalogue: " in out
    assert "sk-ant-not-a-real-key" not in out

    (tmp_path / "soba.json").write_text(json.dumps({"model": {"provider": "openai", "name": "llama3:8b", "baseUrl": "http://127.0.0.1:9/v1"}}))
    code, out, _ = run(capsys, "doctor", str(tmp_path))
    assert f"why        chosen: model.provider 'openai' is set in {tmp_path / 'soba.json'}" in out
    assert "window     8,192 (catalogue: Llama 3)" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["budget"], ["budget", "--bogus", "x"], ["nosuch"], ["--help"], ["budget", "--help"], ["--version"],
        ["inspect", "--json"], ["capsule", "export", "a"], ["code", "--force"], ["demo", "--help"], [],
    ],
)
def test_a_command_line_parses_as_with_every_subcommand(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    """`main` builds the parser of the subcommand named alone (2 ms less per command): what a
    command line gives, usage errors and help included, is what the whole parser gives."""
    import soba_nb.cli as cli

    alone = run(capsys, *argv)
    whole = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda only=None: whole())
    assert run(capsys, *argv) == alone


def test_version_prints_on_stdout_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    """`v=$(soba-nb --version)` holds the version: it goes to stdout, nothing to stderr, exit 0."""
    from importlib.metadata import version

    code, out, err = run(capsys, "--version")
    assert (code, err) == (0, "")
    assert out == f"soba-nb {version('soba-nb')}\n"
