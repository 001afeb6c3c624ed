"""SPEC §8: exporting a capsule to `.capsule.md`, loading one into another session, and
`soba-nb capsule export`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from soba_nb.capsule_files.export import CapsuleExportError, export_capsule
from soba_nb.capsule_files.file import (
    CapsuleFileError,
    parse_capsule_file,
    read_capsule_file,
    render_capsule_file,
)
from soba_nb.capsule_files.load import LOAD_OPERATION_PREFIX, load_capsule
from soba_nb.cli import main
from soba_nb.compaction.capsule import Capsule, render_capsule
from soba_nb.compaction.model_input import HANDOFF_FRAME, assemble, visible_context
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    MessageEntry,
    SessionEntry,
)
from soba_nb.transcript.store import Transcript

FAKE_OPENAI_KEY = "sk-proj-" + "Qw3rTy7Ui0pAs5dFg9hJk2lZx4cVb8nM" * 4
WAREHOUSE_PASSWORD = "Tr0ub4dor-and-3"
BODY = render_capsule(
    Capsule(
        goal_and_constraints='Clean the sales data.\n\n> "Fill the missing regions, drop nothing."',
        work_done="- loaded data/sales.csv",
        decisions="- parquet output, because it keeps dtypes",
        files_read="- data/sales.csv",
        files_modified="- clean.py",
        verification="- shell `pytest -q` → exit status 0",
        kernel_state="- df: DataFrame 120000×14",
        artifacts="- out/sales.parquet",
        extra_sections=[("Reviewer notes", "Ask Ana about March.")],
    )
)


def open_session(folder: Path, name: str, session_id: str) -> Transcript:
    notebook = folder / f"{name}.ipynb"
    notebook.touch()
    return Transcript.open(
        folder / f"{name}.soba" / f"{session_id}.jsonl",
        create_header=SessionEntry(notebook=str(notebook), model="openai/gpt-4o"),
    )


def add_capsule(transcript: Transcript, content: str = BODY, **fields: object) -> CapsuleEntry:
    first = transcript.append(MessageEntry(role="user", content="clean the sales data"))
    transcript.append(MessageEntry(role="assistant", content="done"))
    values: dict[str, object] = {
        "operation_id": "op_1",
        "checkpoint_id": "ck_1a2b3c4d",
        "trigger": "user",
        "quality": "full",
        "tokens_before": 40000,
        "tokens_after": 9000,
        "first_kept_entry_id": first.id,
        "model": "gpt-4o",
        "provider": "openai",
        "content": content,
        "title": "Sales cleaning",
    }
    values.update(fields)
    entry = transcript.append(CapsuleEntry(**values))  # type: ignore[arg-type]
    assert isinstance(entry, CapsuleEntry)
    return entry


@pytest.fixture
def folder_a(tmp_path: Path) -> Path:
    folder = tmp_path / "A"
    folder.mkdir()
    (folder / ".git").mkdir()
    return folder


@pytest.fixture
def session_a(folder_a: Path) -> Iterator[Transcript]:
    with open_session(folder_a, "sales", "s-a") as transcript:
        add_capsule(transcript)
        yield transcript


@pytest.fixture
def session_b(tmp_path: Path) -> Iterator[Transcript]:
    folder = tmp_path / "B"
    folder.mkdir()
    with open_session(folder, "report", "s-b") as transcript:
        yield transcript


# --- export ---------------------------------------------------------------------------------


def test_export_writes_a_capsule_file_with_the_session_metadata(
    session_a: Transcript, folder_a: Path
) -> None:
    path = export_capsule(
        session_a, "ck_1a2b3c4d", folder_a / "handoff.capsule.md", project_root=folder_a
    )
    cf = read_capsule_file(path)
    meta = cf.metadata
    assert cf.body == BODY
    assert (meta.title, meta.checkpoint, meta.quality, meta.trigger) == (
        "Sales cleaning",
        "ck_1a2b3c4d",
        "full",
        "user",
    )
    assert meta.source_notebook == str(folder_a / "sales.ipynb")
    assert meta.source_session == "s-a"
    assert meta.tokens == TokenCounter.for_model("openai", "gpt-4o").count_text(BODY)
    assert meta.created.endswith("Z")
    raw = path.read_text(encoding="utf-8")
    assert render_capsule_file(parse_capsule_file(raw, source=str(path))) == raw


def test_title_override_and_default(session_a: Transcript, folder_a: Path, tmp_path: Path) -> None:
    path = export_capsule(
        session_a, "ck_1a2b3c4d", folder_a / "a.capsule.md", project_root=folder_a, title="For Ana"
    )
    assert read_capsule_file(path).metadata.title == "For Ana"
    with open_session(tmp_path, "untitled", "s-u") as transcript:
        add_capsule(transcript, title=None, trigger="milestone", quality="degraded")
        path = export_capsule(
            transcript, "ck_1a2b3c4d", tmp_path / "u.capsule.md", project_root=tmp_path
        )
    meta = read_capsule_file(path).metadata
    assert meta.title == "Capsule ck_1a2b3c4d (milestone)"
    assert (meta.trigger, meta.quality) == ("milestone", "degraded")


def test_a_plain_checkpoint_has_no_capsule(session_a: Transcript, folder_a: Path) -> None:
    checkpoint = session_a.append(
        CheckpointEntry(checkpoint_id="ck_0000beef", kind="milestone", note="loaded")
    )
    assert isinstance(checkpoint, CheckpointEntry)
    with pytest.raises(CapsuleExportError) as refused:
        export_capsule(session_a, "ck_0000beef", folder_a / "x.capsule.md", project_root=folder_a)
    assert str(refused.value) == (
        "checkpoint ck_0000beef (milestone: loaded) has no capsule, only a compaction puts one on the path; "
        "%capsule create writes one of the session as it is"
    )
    # The checkpoint `%capsule create` records names the file it wrote; a note stays one line.
    session_a.append(CheckpointEntry(checkpoint_id="ck_0000cafe", kind="user", note="capsule 't' written to\nt.capsule.md"))
    with pytest.raises(CapsuleExportError, match=r"^checkpoint ck_0000cafe \(user: capsule 't' written to t.capsule.md\) has no"):
        export_capsule(session_a, "ck_0000cafe", folder_a / "x.capsule.md", project_root=folder_a)
    with pytest.raises(CapsuleExportError, match="no checkpoint ck_99999999 in"):
        export_capsule(session_a, "ck_99999999", folder_a / "x.capsule.md", project_root=folder_a)
    assert not (folder_a / "x.capsule.md").exists()


def test_export_never_overwrites_without_force(session_a: Transcript, folder_a: Path) -> None:
    target = folder_a / "handoff.capsule.md"
    target.write_text("someone's notes\n", encoding="utf-8")
    with pytest.raises(CapsuleFileError, match="already exists; add --force"):
        export_capsule(session_a, "ck_1a2b3c4d", target, project_root=folder_a)
    assert target.read_text(encoding="utf-8") == "someone's notes\n"
    export_capsule(session_a, "ck_1a2b3c4d", target, project_root=folder_a, force=True)
    assert read_capsule_file(target).body == BODY


def test_export_into_a_folder_names_the_file_after_the_checkpoint(
    session_a: Transcript, folder_a: Path
) -> None:
    (folder_a / "handoffs").mkdir()
    path = export_capsule(session_a, "ck_1a2b3c4d", folder_a / "handoffs", project_root=folder_a)
    assert path == (folder_a / "handoffs" / "ck_1a2b3c4d.capsule.md").resolve()


def test_paths_outside_the_project_are_refused_unless_explicit(
    session_a: Transcript, folder_a: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "elsewhere" / "x.capsule.md"
    with pytest.raises(CapsuleExportError, match="outside the project folder"):
        export_capsule(session_a, "ck_1a2b3c4d", outside, project_root=folder_a)
    monkeypatch.chdir(folder_a)
    with pytest.raises(CapsuleExportError, match="outside the project folder"):
        export_capsule(session_a, "ck_1a2b3c4d", "../escape.capsule.md", project_root=folder_a)
    (folder_a / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(CapsuleExportError, match="outside the project folder"):
        export_capsule(session_a, "ck_1a2b3c4d", "link/y.capsule.md", project_root=folder_a)
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert not (tmp_path / "escape.capsule.md").exists()
    path = export_capsule(
        session_a, "ck_1a2b3c4d", outside, project_root=folder_a, allow_outside=True
    )
    assert read_capsule_file(path).body == BODY


def test_secrets_are_redacted_from_the_exported_file(
    folder_a: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WAREHOUSE_PASSWORD", WAREHOUSE_PASSWORD)
    leaky = render_capsule(
        Capsule(
            goal_and_constraints="Load the warehouse extract.",
            work_done=f"- connected with password {WAREHOUSE_PASSWORD}",
            verification=f"- `python -c 'OpenAI(api_key=\"{FAKE_OPENAI_KEY}\")'` → ok",
            blockers="- `curl -H 'Authorization: Bearer abc123def456ghi789'` → 401",
        )
    )
    with open_session(folder_a, "leaky", "s-l") as transcript:
        add_capsule(transcript, content=leaky, title=f"key {FAKE_OPENAI_KEY}")
        path = export_capsule(
            transcript, "ck_1a2b3c4d", folder_a / "leaky.capsule.md", project_root=folder_a
        )
    raw = path.read_text(encoding="utf-8")
    for secret in (FAKE_OPENAI_KEY, WAREHOUSE_PASSWORD, "abc123def456ghi789"):
        assert secret not in raw
    cf = read_capsule_file(path)  # still a valid, hash-checked file
    assert cf.metadata.title == "key [redacted]"
    assert "- connected with password [redacted]" in cf.body
    assert "Authorization: Bearer [redacted]" in cf.body


# --- load -----------------------------------------------------------------------------------


def test_two_folders_share_a_capsule(
    session_a: Transcript, folder_a: Path, session_b: Transcript
) -> None:
    path = export_capsule(
        session_a, "ck_1a2b3c4d", folder_a / "handoff.capsule.md", project_root=folder_a
    )
    leaf_before = session_b.leaf
    loaded = load_capsule(path, session_b, session_notebook=session_b.header.notebook)  # type: ignore[union-attr]

    reread = Transcript.load(session_b.file)
    capsules = [e for e in reread if isinstance(e, CapsuleEntry)]
    assert capsules == [loaded]
    assert loaded.trigger == "user" and loaded.quality == "full"
    assert loaded.content == BODY and loaded.title == "Sales cleaning"
    assert loaded.source == str(path) and loaded.first_kept_entry_id is None
    assert loaded.operation_id.startswith(LOAD_OPERATION_PREFIX)
    assert loaded.checkpoint_id.startswith("ck_") and loaded.checkpoint_id != "ck_1a2b3c4d"
    assert loaded.tokens_after == read_capsule_file(path).metadata.tokens
    assert loaded.parent_id == leaf_before and reread.leaf == loaded.id

    # The second session's first request carries the capsule, framed as handoff data.
    session_b.append(MessageEntry(role="user", content="continue with the report"))
    model_input = assemble(
        visible_context(session_b.path()),
        system="system",
        tools=[],
        counter=TokenCounter.for_model("openai", "gpt-4o"),
        strict=True,
    )
    first, second = model_input.messages
    assert first.role == "user" and first.content == HANDOFF_FRAME.format(source=str(path)) + BODY
    assert second.content == "continue with the report"


def test_a_relative_path_is_taken_from_the_notebook_folder(
    session_a: Transcript, folder_a: Path, session_b: Transcript, tmp_path: Path
) -> None:
    export_capsule(
        session_a, "ck_1a2b3c4d", tmp_path / "B" / "in.capsule.md", project_root=tmp_path
    )
    loaded = load_capsule(
        "in.capsule.md", session_b, session_notebook=tmp_path / "B" / "report.ipynb"
    )
    assert loaded.source == str((tmp_path / "B" / "in.capsule.md").resolve())


def _bad_files(good: str) -> dict[str, bytes]:
    return {
        "tampered": good.replace("120000×14", "120000×15").encode(),
        "truncated": good[: len(good) * 2 // 3].encode(),
        "no front matter": good.split("---\n\n", 1)[1].encode(),
        "wrong version": good.replace("soba-capsule: 3", "soba-capsule: 9").encode(),
        "bad value": good.replace('"full"', '"excellent"').encode(),
        "empty": b"",
        "not utf-8": good.encode("utf-16"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "tampered",
        "truncated",
        "no front matter",
        "wrong version",
        "bad value",
        "empty",
        "not utf-8",
        "missing",
    ],
)
def test_nothing_is_appended_when_loading_a_bad_file(
    case: str, session_a: Transcript, folder_a: Path, session_b: Transcript
) -> None:
    good = export_capsule(
        session_a, "ck_1a2b3c4d", folder_a / "good.capsule.md", project_root=folder_a
    )
    bad = folder_a / "bad.capsule.md"
    if case != "missing":
        bad.write_bytes(_bad_files(good.read_text(encoding="utf-8"))[case])
    before = session_b.file.read_bytes()
    entries_before = len(session_b)
    with pytest.raises(CapsuleFileError) as caught:
        load_capsule(bad, session_b)
    assert str(caught.value).startswith(f"{bad}: ") and "\n" not in str(caught.value)
    assert session_b.file.read_bytes() == before
    assert len(session_b) == entries_before


def test_loading_redacts_a_hand_made_file_again(
    session_b: Transcript, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from soba_nb.capsule_files.file import CapsuleFile, CapsuleMetadata, write_capsule_file

    body = render_capsule(Capsule(goal_and_constraints=f"use {FAKE_OPENAI_KEY}"))
    meta = CapsuleMetadata(
        title="t", checkpoint="ck_00000000", quality="degraded", tokens=3, trigger="user"
    )
    path = write_capsule_file(tmp_path / "hand.capsule.md", CapsuleFile(metadata=meta, body=body))
    loaded = load_capsule(path, session_b)
    assert FAKE_OPENAI_KEY not in session_b.file.read_text(encoding="utf-8")
    assert "use [redacted]" in loaded.content and loaded.quality == "degraded"


# --- the CLI --------------------------------------------------------------------------------


def test_cli_export(
    session_a: Transcript, folder_a: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = folder_a / "cli.capsule.md"
    argv = ["capsule", "export", str(session_a.file), "ck_1a2b3c4d", str(out)]
    assert main(argv) == 0
    assert read_capsule_file(out).body == BODY
    assert str(out) in capsys.readouterr().out

    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "already exists; add --force" in err and err.count("\n") == 1
    assert main([*argv, "--force"]) == 0


def test_cli_export_errors_are_one_line(
    session_a: Transcript,
    folder_a: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session_a.append(CheckpointEntry(checkpoint_id="ck_0000beef", kind="milestone"))
    assert (
        main(
            [
                "capsule",
                "export",
                str(session_a.file),
                "ck_0000beef",
                str(folder_a / "x.capsule.md"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert (
        "checkpoint ck_0000beef (milestone) has no capsule" in err and err.count("\n") == 1
    )

    monkeypatch.chdir(folder_a)
    assert (
        main(
            [
                "capsule",
                "export",
                str(session_a.file),
                "ck_1a2b3c4d",
                os.path.join("..", "x.capsule.md"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "outside the project folder" in err and err.count("\n") == 1
    assert not (tmp_path / "x.capsule.md").exists()

    # An absolute path is an explicit choice: allowed outside the project.
    assert (
        main(
            [
                "capsule",
                "export",
                str(session_a.file),
                "ck_1a2b3c4d",
                str(tmp_path / "x.capsule.md"),
            ]
        )
        == 0
    )
