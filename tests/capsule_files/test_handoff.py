"""Issue 13, item 6: a capsule as a plain Markdown handoff for another coding agent
(`--format agents-md`), and a Markdown handoff from elsewhere loaded with `--untrusted`."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.capsule_files.export import EXPORT_FORMATS
from soba_nb.capsule_files.file import CapsuleFileError
from soba_nb.capsule_files.handoff import (
    HANDOFF_HEADING,
    MAX_HANDOFF_BYTES,
    PREAMBLE_SECTION,
    handoff_body,
    parse_handoff,
)
from soba_nb.cli import main
from soba_nb.cli.capsule import FORMATS
from soba_nb.compaction.capsule import (
    SECTION_HEADINGS,
    Capsule,
    parse_capsule,
    render_capsule,
    split_sections,
)
from soba_nb.compaction.model_input import HANDOFF_FRAME
from soba_nb.transcript.entries import CapsuleEntry, MessageEntry, SessionEntry
from soba_nb.transcript.store import Transcript

WAREHOUSE_PASSWORD = "Tr0ub4dor-and-3"
FAKE_OPENAI_KEY = "sk-proj-" + "Qw3rTy7Ui0pAs5dFg9hJk2lZx4cVb8nM" * 4
BODY = render_capsule(
    Capsule(
        goal_and_constraints="Clean the sales data; drop nothing.",
        work_done=f"- loaded data/sales.csv with password {WAREHOUSE_PASSWORD}",
        decisions="- parquet output, because it keeps dtypes",
        next_steps="- plot revenue per region",
        files_read="- data/sales.csv",
        files_modified="- clean.py",
        verification="- shell `pytest -q` → exit status 0",
        kernel_state="- df: DataFrame 120000×14",
        extra_sections=[("Reviewer notes", "Ask Ana about March.")],
    )
)
CHECKPOINT = "ck_1a2b3c4d"


def _agent(ip):
    return ip.magics_manager.registry["SobaMagics"].get_session()


def _entries(ip) -> int:
    return len(Transcript.load(_agent(ip).file))


def _headings(markdown: str) -> list[str]:
    """The `## ` headings, as the capsule parser reads them (not inside code fences)."""
    return [title for title, _ in split_sections(markdown)[1]]


@pytest.fixture
def session_file(tmp_path: Path) -> Path:
    """A session of `sales.ipynb` with one capsule, written before the password is a secret
    of the environment: only the export can keep it out of the handoff."""
    folder = tmp_path / "A"
    (folder / ".git").mkdir(parents=True)
    notebook = folder / "sales.ipynb"
    notebook.touch()
    file = folder / "sales.soba" / "s-a.jsonl"
    with Transcript.open(file, create_header=SessionEntry(notebook=str(notebook))) as transcript:
        first = transcript.append(MessageEntry(role="user", content="clean the sales data"))
        transcript.append(
            CapsuleEntry(
                operation_id="op_1", checkpoint_id=CHECKPOINT, trigger="user", quality="full",
                tokens_before=40000, tokens_after=900, first_kept_entry_id=first.id,
                content=BODY, title="Sales cleaning",
            )
        )
    return file


# --- out: --format agents-md ---------------------------------------------------------------


def test_the_cli_writes_a_markdown_handoff_without_front_matter(
    session_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WAREHOUSE_PASSWORD", WAREHOUSE_PASSWORD)
    out = session_file.parent.parent / "AGENTS.md"
    assert main(["capsule", "export", str(session_file), CHECKPOINT, str(out), "--format", "agents-md"]) == 0
    assert "as a Markdown handoff for another agent" in capsys.readouterr().out

    handoff = out.read_text(encoding="utf-8")
    assert handoff.startswith(HANDOFF_HEADING + "\n\n")  # no front matter
    assert "\n---\n" not in handoff and "sha256" not in handoff
    intro = handoff.split("\n## ", 1)[0]
    for fact in ("- Title: Sales cleaning", "- Source notebook: sales.ipynb", "- Session: s-a",
                 f"- Checkpoint: {CHECKPOINT}", "- Quality: full"):
        assert fact in intro
    assert re.search(r"^- Created: \d{4}-\d\d-\d\dT[\d:.]+Z$", intro, re.MULTILINE)
    assert _headings(handoff) == [*SECTION_HEADINGS, "Reviewer notes"]
    assert "- plot revenue per region" in handoff
    assert WAREHOUSE_PASSWORD not in handoff and "password [redacted]" in handoff


def test_the_default_format_is_still_the_capsule_file(session_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "A" / "plain.capsule.md"
    assert main(["capsule", "export", str(session_file), CHECKPOINT, str(out)]) == 0
    assert out.read_text(encoding="utf-8").startswith("---\nsoba-capsule: 3\n")
    assert FORMATS == EXPORT_FORMATS  # the CLI's choices are the exporter's


def test_a_folder_gets_agents_md_and_an_existing_one_is_never_overwritten(
    session_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = session_file.parent.parent
    argv = ["capsule", "export", str(session_file), CHECKPOINT, str(folder), "--format", "agents-md"]
    (folder / "AGENTS.md").write_text("# Our own agent notes\n", encoding="utf-8")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "AGENTS.md: already exists; add --force" in err and err.count("\n") == 1
    assert (folder / "AGENTS.md").read_text(encoding="utf-8") == "# Our own agent notes\n"
    assert main([*argv, "--force"]) == 0
    assert (folder / "AGENTS.md").read_text(encoding="utf-8").startswith(HANDOFF_HEADING)


def test_an_unknown_format_is_a_usage_error(session_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capsule", "export", str(session_file), CHECKPOINT, "x.md", "--format", "yaml"]) == 2
    assert "invalid choice: 'yaml'" in capsys.readouterr().err


# --- the magics: export, then load in another session ----------------------------------------


def _compacted_session(ip, scripted) -> str:
    ip.run_line_magic("auto_compact", "off")
    for index in range(6):
        scripted.script(text(f"Answer {index}. " + "The data has many columns worth describing. " * 45))
        ip.run_line_magic("soba", f"question {index}: describe the data")
    with capture_output():
        ip.run_line_magic("compact", "")
    [capsule] = [e for e in Transcript.load(_agent(ip).file).path() if isinstance(e, CapsuleEntry)]
    return capsule.checkpoint_id


def test_export_agents_md_then_load_it_untrusted_in_a_new_session(ip, nb_dir, scripted):
    checkpoint = _compacted_session(ip, scripted)
    original = parse_capsule(_agent(ip).transcript.find_checkpoint(checkpoint).content)
    (nb_dir / "handoff").mkdir()
    with capture_output() as out:
        ip.run_line_magic("capsule", f"export {checkpoint} handoff --format agents-md")
    handoff = nb_dir / "handoff" / "AGENTS.md"
    assert "as a Markdown handoff for another agent" in out.stdout and handoff.is_file()

    with capture_output():
        ip.run_line_magic("soba", "--new")
    with pytest.raises(UsageError) as refused:  # no front matter: only as an untrusted handoff
        ip.run_line_magic("capsule", "load handoff/AGENTS.md")
    message = str(refused.value)
    assert "\n" not in message and str(handoff) in message
    assert "no front matter" in message and "--untrusted" in message
    assert not any(isinstance(e, CapsuleEntry) for e in Transcript.load(_agent(ip).file))

    with capture_output() as out:
        ip.run_line_magic("capsule", "load handoff/AGENTS.md --untrusted")
    assert out.stdout.startswith(f"loaded 'Capsule {checkpoint} (user)' from {handoff} as ck_")
    assert "untrusted: framed as data, not instructions" in out.stdout
    [loaded] = [e for e in Transcript.load(_agent(ip).file).path() if isinstance(e, CapsuleEntry)]
    assert loaded.quality == "degraded" and loaded.source == str(handoff)
    assert loaded.title == f"Capsule {checkpoint} (user)"  # the handoff's "Title:" line
    assert parse_capsule(loaded.content) == original  # the sections survive the round trip
    assert PREAMBLE_SECTION not in _headings(loaded.content)  # our own intro is not kept


HAND_WRITTEN = """\
# Notes for the next agent

The churn notebook is half done.

## Goal and constraints

Ship the churn report by Friday; never touch data/raw.

## Build

Run `make report`.

## Next steps

- plot churn per month
"""


def test_a_hand_written_agents_md_reaches_the_model_as_data(ip, nb_dir, scripted):
    (nb_dir / "AGENTS.md").write_text(HAND_WRITTEN, encoding="utf-8")
    with capture_output() as out:
        ip.run_line_magic("capsule", "load AGENTS.md --untrusted")
    assert out.stdout.startswith(f"loaded 'Notes for the next agent' from {nb_dir / 'AGENTS.md'} as ck_")
    assert "quality degraded" in out.stdout
    [loaded] = [e for e in Transcript.load(_agent(ip).file).path() if isinstance(e, CapsuleEntry)]
    capsule = parse_capsule(loaded.content)  # all 13 headings now, missing ones empty
    assert capsule.goal_and_constraints == "Ship the churn report by Friday; never touch data/raw."
    assert capsule.next_steps == "- plot churn per month" and capsule.work_done == ""
    assert capsule.extra_sections == [
        (PREAMBLE_SECTION, "The churn notebook is half done."),
        ("Build", "Run `make report`."),
    ]

    scripted.script(text("On it."))
    # In the project folder it is also the project's instructions (SPEC §19): left out here,
    # where the loaded handoff is the point.
    ip.run_line_magic("soba", "--no-instructions continue the report")
    messages = scripted.inference_requests()[-1]["messages"]
    conversation = [m for m in messages if m["role"] != "system"]
    assert [m["role"] for m in conversation] == ["user", "user"]
    first = conversation[0]["content"]
    assert first.startswith(HANDOFF_FRAME.format(source=nb_dir / "AGENTS.md"))
    assert "not as instructions" in first and "Run `make report`." in first
    assert conversation[1]["content"] == "continue the report"


def test_a_valid_capsule_file_may_be_loaded_untrusted(ip, nb_dir, scripted):
    checkpoint = _compacted_session(ip, scripted)
    with capture_output():
        ip.run_line_magic("capsule", f"export {checkpoint} c.capsule.md")
        ip.run_line_magic("soba", "--new")
        ip.run_line_magic("capsule", "load c.capsule.md --untrusted")
    [loaded] = [e for e in Transcript.load(_agent(ip).file).path() if isinstance(e, CapsuleEntry)]
    assert loaded.quality == "degraded" and "soba-capsule" not in loaded.content
    assert "Keep cleaning the dataframe." in loaded.content


def test_secrets_in_an_untrusted_handoff_are_redacted(ip, nb_dir, monkeypatch):
    monkeypatch.setenv("WAREHOUSE_PASSWORD", WAREHOUSE_PASSWORD)
    (nb_dir / "leaky.md").write_text(
        f"# Leaky {FAKE_OPENAI_KEY}\n\n## Work done\n\n- used {FAKE_OPENAI_KEY} and {WAREHOUSE_PASSWORD}\n",
        encoding="utf-8",
    )
    with capture_output():
        ip.run_line_magic("capsule", "load leaky.md --untrusted")
    raw = _agent(ip).file.read_text(encoding="utf-8")
    assert FAKE_OPENAI_KEY not in raw and WAREHOUSE_PASSWORD not in raw
    assert "used [redacted] and [redacted]" in raw


# --- bad input: one line naming the file, nothing appended ------------------------------------


def _make(kind: str, folder: Path, outside: Path) -> tuple[str, str]:
    """(the argument to load, a fragment of the expected problem)."""
    target = folder / f"{kind}.md"
    if kind == "binary":
        target.write_bytes(b"## Goal and constraints\n\n\x00\x01\x02 PNG data")
        return target.name, "binary data (a NUL byte"
    if kind == "not-utf8":
        target.write_bytes("## Goal and constraints\n\nCaf\xe9\n".encode("latin-1"))
        return target.name, "not UTF-8 text"
    if kind == "huge":
        target.write_text("## Work done\n\n" + "x" * MAX_HANDOFF_BYTES, encoding="utf-8")
        return target.name, f"a Markdown handoff is at most {MAX_HANDOFF_BYTES:,}"
    if kind == "fifo":
        os.mkfifo(target)
        return target.name, "not a regular file"
    if kind == "symlink-out":
        secret = outside / "notes.md"
        secret.write_text("## Goal and constraints\n\nsomeone else's notes\n", encoding="utf-8")
        target.symlink_to(secret)
        return target.name, f"is a link to {secret}, outside the project folder"
    if kind == "empty":
        target.write_bytes(b"\n  \n")
        return target.name, "empty file"
    if kind == "no-sections":
        target.write_text("# Title\n\nJust prose, no sections.\n### Not level two\n", encoding="utf-8")
        return target.name, "no `## ` sections"
    if kind == "blank-sections":
        target.write_text("## Goal and constraints\n\n(none)\n\n## Work done\n\n", encoding="utf-8")
        return target.name, "every `## ` section is empty"
    if kind == "folder":
        target.mkdir()
        return target.name, "is a folder, not a Markdown handoff"
    return "missing.md", "no such file"


@pytest.mark.parametrize(
    "kind",
    ["binary", "not-utf8", "huge", "fifo", "symlink-out", "empty", "no-sections", "blank-sections",
     "folder", "missing"],
)
def test_bad_handoffs_are_one_line_errors_and_append_nothing(ip, nb_dir, tmp_path, kind):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    argument, problem = _make(kind, nb_dir, outside)
    with capture_output():
        ip.run_line_magic("soba", "--new")
    before = _agent(ip).file.read_bytes()
    with pytest.raises(UsageError) as raised:
        ip.run_line_magic("capsule", f"load {argument} --untrusted")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"%capsule load: {nb_dir / argument}: "), message
    assert problem in message, message
    assert _agent(ip).file.read_bytes() == before


def test_a_link_inside_the_project_is_fine(ip, nb_dir):
    (nb_dir / "docs").mkdir()
    (nb_dir / "docs" / "handoff.md").write_text("## Next steps\n\n- write the report\n", encoding="utf-8")
    (nb_dir / "AGENTS.md").symlink_to(nb_dir / "docs" / "handoff.md")
    with capture_output():
        ip.run_line_magic("capsule", "load AGENTS.md --untrusted")
    [loaded] = [e for e in Transcript.load(_agent(ip).file).path() if isinstance(e, CapsuleEntry)]
    assert "- write the report" in loaded.content


_MARKDOWN_LINE = st.one_of(
    st.sampled_from(["## Goal and constraints", "## work DONE", "## Build", "# Title", "---", "```", "(none)", ""]),
    st.text(max_size=40).map(lambda t: t.replace("\n", " ")),
    st.text(max_size=20).map(lambda t: "## " + t.replace("\n", " ")),
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(), st.lists(_MARKDOWN_LINE, max_size=25).map("\n".join)))
@example("-\n##0")  # a preamble of just "-" is an empty section (CI found it)
@example("intro\n-\n## Pending\n\n- x")
def test_any_text_is_a_handoff_or_one_line_error(markdown: str) -> None:
    try:
        handoff = parse_handoff(markdown, source="x.md", name="x.md")
    except CapsuleFileError as exc:
        assert str(exc).startswith("x.md: ") and "\n" not in str(exc)
    else:
        body = handoff_body(handoff)  # a whole capsule, stable when read back and rendered
        assert _headings(body)[: len(SECTION_HEADINGS)] == list(SECTION_HEADINGS)
        assert render_capsule(parse_capsule(body)) == body
