"""SPEC §8: the `.capsule.md` file — front matter, content hash, round trips, clear errors."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import get_args

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from soba_nb.capsule_files.file import (
    KEYS,
    CapsuleFile,
    CapsuleFileError,
    CapsuleMetadata,
    body_sha256,
    parse_capsule_file,
    read_capsule_file,
    render_capsule_file,
    write_capsule_file,
)
from soba_nb.compaction.capsule import SECTION_HEADINGS, Capsule, render_capsule
from soba_nb.transcript.entries import TriggerName

SOURCE = "handoff.capsule.md"
BODY = render_capsule(
    Capsule(
        goal_and_constraints='Clean the sales data.\n\n> "drop nothing"',
        work_done="- loaded data/sales.csv",
        files_read="- data/sales.csv",
        verification="- shell `pytest -q` → exit status 0",
        kernel_state="- df: DataFrame 120000×14",
        extra_sections=[("Reviewer notes", "Ask Ana about the March outliers.")],
    )
)


def metadata(**overrides: object) -> CapsuleMetadata:
    values: dict[str, object] = {
        "title": "Sales cleaning handoff",
        "checkpoint": "ck_1a2b3c4d",
        "source_notebook": "/work/sales.ipynb",
        "source_session": "20261202T143700Z-1a2b",
        "created": "2026-12-02T14:37:00.000Z",
        "quality": "full",
        "tokens": 123,
        "trigger": "user",
    }
    values.update(overrides)
    return CapsuleMetadata(**values)  # type: ignore[arg-type]


def capsule_file(body: str = BODY, **overrides: object) -> CapsuleFile:
    return CapsuleFile(metadata=metadata(**overrides), body=body)


TEXT = render_capsule_file(capsule_file())


def front_matter_text(values: dict[str, str], body: str = BODY) -> str:
    """A file with raw front-matter values (JSON text) and a correct hash unless given."""
    values = {**values, "sha256": values.get("sha256", json.dumps(body_sha256(body)))}
    lines = [f"{key}: {value}" for key, value in values.items()]
    return "---\n" + "\n".join(lines) + "\n---\n\n" + body


def valid_values() -> dict[str, str]:
    return {
        "soba-capsule": "1",
        "title": '"T"',
        "checkpoint": '"ck_1a2b3c4d"',
        "source-notebook": "null",
        "source-session": "null",
        "created": '"2026-12-02T14:37:00Z"',
        "quality": '"degraded"',
        "tokens": "7",
        "trigger": '"milestone"',
    }


def problem(text: str) -> str:
    with pytest.raises(CapsuleFileError) as caught:
        parse_capsule_file(text, source=SOURCE)
    message = str(caught.value)
    assert message.startswith(f"{SOURCE}: ") and "\n" not in message
    return message


# --- the format ---------------------------------------------------------------------------


def test_front_matter_has_the_fixed_keys_in_order_then_a_blank_line_and_the_body() -> None:
    lines = TEXT.split("\n")
    assert lines[0] == "---" and lines[len(KEYS) + 1] == "---"
    assert [line.split(":", 1)[0] for line in lines[1 : len(KEYS) + 1]] == list(KEYS)
    assert lines[1] == "soba-capsule: 3"
    assert lines[2] == 'title: "Sales cleaning handoff"'
    assert "tokens: 123" in lines and 'quality: "full"' in lines and 'trigger: "user"' in lines
    assert TEXT.endswith("\n---\n\n" + BODY)
    # The hash covers every byte of the file except its own line.
    [hash_line] = [line for line in lines if line.startswith("sha256: ")]
    unhashed = TEXT.replace(hash_line + "\n", "", 1)
    assert hash_line == f'sha256: "{hashlib.sha256(unhashed.encode()).hexdigest()}"'


@pytest.mark.parametrize(
    ("old", "new"),
    [("tokens: 123", "tokens: 1"), ('title: "Sales cleaning handoff"', 'title: "Something else"'),
     ('quality: "full"', 'quality: "degraded"'), ('trigger: "user"', 'trigger: "milestone"')],
)
def test_an_edit_to_the_front_matter_is_detected(old: str, new: str) -> None:
    assert old in TEXT
    assert "content hash mismatch" in problem(TEXT.replace(old, new))


def test_a_version_1_file_still_reads() -> None:
    """soba-nb 0.1 hashed only the body (`front_matter_text` writes that layout)."""
    legacy = front_matter_text(valid_values())
    assert parse_capsule_file(legacy, source=SOURCE).metadata.title == "T"


def test_headings_in_the_file_are_the_thirteen_sections_then_extra_ones() -> None:
    headings = [line[3:] for line in TEXT.split("\n") if line.startswith("## ")]
    assert headings == [*SECTION_HEADINGS, "Reviewer notes"]


def test_round_trip_is_byte_identical_and_keeps_extra_sections() -> None:
    parsed = parse_capsule_file(TEXT, source=SOURCE)
    assert parsed == capsule_file()
    assert render_capsule_file(parsed) == TEXT
    assert parsed.capsule().extra_sections == [
        ("Reviewer notes", "Ask Ana about the March outliers.")
    ]
    assert parsed.capsule().kernel_state == "- df: DataFrame 120000×14"


@pytest.mark.parametrize(
    "title",
    [
        'He said "hi"',
        "two\nlines",
        "---",
        "sha256: x",
        "ünïcödé ✓ 表",
        "",
        " padded ",
        "a\\b\tc\x00",
    ],
)
def test_any_title_round_trips(title: str) -> None:
    text = render_capsule_file(capsule_file(title=title))
    assert parse_capsule_file(text, source=SOURCE).metadata.title == title
    assert text.count("\n---\n") == 1  # the title never breaks out of its line


def test_unknown_notebook_and_session_are_null() -> None:
    text = render_capsule_file(capsule_file(source_notebook=None, source_session=None))
    assert "source-notebook: null\nsource-session: null\n" in text
    assert parse_capsule_file(text, source=SOURCE).metadata.source_notebook is None


def test_a_byte_order_mark_and_windows_line_endings_are_accepted() -> None:
    crlf = TEXT.replace("\n", "\r\n")
    assert parse_capsule_file("\ufeff" + TEXT, source=SOURCE) == capsule_file()
    assert parse_capsule_file(crlf, source=SOURCE) == capsule_file()


def test_the_model_refuses_a_body_without_the_headings() -> None:
    with pytest.raises(ValidationError, match="## Work done"):
        capsule_file(body="## Goal and constraints\n\nx\n")


# --- round trips over random content --------------------------------------------------------

section_text = st.text(max_size=60)
extra_title = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=20
)


@st.composite
def capsule_files(draw: st.DrawFn) -> CapsuleFile:
    bodies = {
        field: draw(section_text) for field in Capsule.model_fields if field != "extra_sections"
    }
    extras = draw(st.lists(st.tuples(extra_title, section_text), max_size=2))
    try:
        capsule = Capsule(**bodies, extra_sections=extras)
    except ValidationError:
        assume(False)
    body = render_capsule(capsule) + draw(st.sampled_from(["", "\r\n", "trailing\r\nnotes \n\n"]))
    created = draw(st.datetimes(timezones=st.just(timezone.utc)))
    meta = CapsuleMetadata(
        title=draw(st.text(max_size=40)),
        checkpoint="ck_" + draw(st.text("0123456789abcdef", min_size=8, max_size=16)),
        source_notebook=draw(st.none() | st.text(max_size=30)),
        source_session=draw(st.none() | st.text(max_size=30)),
        created=created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        quality=draw(st.sampled_from(["full", "degraded"])),
        tokens=draw(st.integers(min_value=0, max_value=10**9)),
        trigger=draw(st.sampled_from(get_args(TriggerName))),
    )
    return CapsuleFile(metadata=meta, body=body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(capsule_files())
def test_render_parse_render_is_byte_identical(cf: CapsuleFile) -> None:
    text = render_capsule_file(cf)
    parsed = parse_capsule_file(text, source=SOURCE)
    assert parsed == cf
    assert render_capsule_file(parsed) == text


# --- tampering and truncation ---------------------------------------------------------------


def test_editing_one_character_of_the_body_is_a_hash_mismatch() -> None:
    tampered = TEXT.replace("120000×14", "120000×15")
    assert tampered != TEXT
    assert problem(tampered) == (
        f"{SOURCE}: content hash mismatch: the file was edited or truncated after export"
    )


def test_appending_to_the_body_is_a_hash_mismatch() -> None:
    assert "content hash mismatch" in problem(TEXT + "\n## Injected\n\nrm -rf /\n")


def test_every_truncation_is_a_clear_error() -> None:
    for cut in range(len(TEXT)):
        with pytest.raises(CapsuleFileError):
            parse_capsule_file(TEXT[:cut], source=SOURCE)


def test_truncation_inside_the_body_names_the_hash() -> None:
    assert "edited or truncated" in problem(TEXT[: len(TEXT) // 2 + 200])


def test_truncation_inside_the_front_matter_says_it_is_not_closed() -> None:
    assert "never closed" in problem(TEXT[:60])


# --- malformed files ------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   \n\n", "\ufeff"])
def test_empty_file(text: str) -> None:
    assert problem(text) == f"{SOURCE}: empty file"


def test_no_front_matter() -> None:
    assert "no front matter" in problem(BODY)
    assert "no front matter" in problem("# Notes\n---\n")


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("4", "unknown capsule format version '4'"),
        ('"1"', "unknown capsule format version"),
        ("1.0", "unknown capsule format version"),
        ("true", "unknown capsule format version"),
    ],
)
def test_unknown_format_version(version: str, expected: str) -> None:
    assert expected in problem(front_matter_text({**valid_values(), "soba-capsule": version}))


def test_a_future_version_is_named_before_any_other_problem() -> None:
    future = "---\nsoba-capsule: 4\nsummary: {new format}\n---\nwhatever\n"
    assert "unknown capsule format version '4'" in problem(future)


def test_the_version_must_come_first() -> None:
    values = valid_values()
    version = values.pop("soba-capsule")
    assert "must start with `soba-capsule: 3`" in problem(
        front_matter_text({**values, "soba-capsule": version})
    )
    assert "must start with `soba-capsule: 3`" in problem(front_matter_text(values))


@pytest.mark.parametrize("key", [k for k in KEYS if k not in ("soba-capsule", "author")])
def test_missing_key(key: str) -> None:
    values = valid_values()
    values.pop(key, None)
    text = front_matter_text(values)
    if key == "sha256":
        text = text.replace(f'sha256: "{body_sha256(BODY)}"\n', "")
    assert problem(text).endswith(f"front matter is missing key(s): {key}")


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("title", '"unterminated', "front matter key 'title': bad JSON value"),
        ("title", "Plain words", "front matter key 'title': bad JSON value"),
        ("title", "42", "front matter key 'title': invalid value"),
        ("tokens", "-1", "front matter key 'tokens': invalid value '-1'"),
        ("tokens", '"12"', "front matter key 'tokens': invalid value"),
        ("tokens", "1.5", "front matter key 'tokens': invalid value"),
        ("tokens", "true", "front matter key 'tokens': invalid value"),
        pytest.param(
            "tokens", "1" * 5000, "front matter key 'tokens': bad JSON value", id="huge-int"
        ),
        ("quality", '"great"', "front matter key 'quality': invalid value"),
        ("trigger", '"cron"', "front matter key 'trigger': invalid value"),
        ("checkpoint", '"ck_XYZ"', "front matter key 'checkpoint': invalid value"),
        ("created", '"yesterday"', "must be an ISO-8601 timestamp"),
        ("created", '"2026-12-02T14:37:00+02:00"', "must be in UTC"),
        ("created", '"2026-12-02T14:37:00"', "must be in UTC"),
        ("source-session", "[1]", "front matter key 'source-session': invalid value"),
        pytest.param(
            "title", "[" * 100_000, "front matter key 'title': bad JSON value", id="deep-nesting"
        ),
    ],
)
def test_invalid_values_name_the_key(key: str, value: str, expected: str) -> None:
    assert expected in problem(front_matter_text({**valid_values(), key: value}))


def test_bad_hash_value() -> None:
    assert "'sha256': must be 64 lowercase hex digits" in problem(
        front_matter_text({**valid_values(), "sha256": '"abc"'})
    )


def test_unknown_and_repeated_keys_and_lines_without_a_colon() -> None:
    assert "unknown key 'editor'" in problem(
        front_matter_text({**valid_values(), "editor": '"me"'})
    )
    assert "key 'title' given twice" in problem(
        TEXT.replace('title: "Sales cleaning handoff"\n', 'title: "a"\ntitle: "b"\n')
    )
    assert "line 3 is not `key: value`" in problem(
        TEXT.replace('title: "Sales cleaning handoff"', "just words")
    )


def test_missing_section_headings_are_named() -> None:
    body = BODY.replace("## Blockers\n", "## Obstacles\n").replace("## Artifacts\n", "")
    message = problem(front_matter_text(valid_values(), body))
    assert "missing 2 section heading(s): ## Blockers, ## Artifacts" in message


def test_a_body_with_no_capsule_at_all() -> None:
    assert "missing 13 section heading(s)" in problem(front_matter_text(valid_values(), ""))


def test_the_minimal_valid_file_reads() -> None:
    cf = parse_capsule_file(front_matter_text(valid_values()), source=SOURCE)
    assert cf.metadata.quality == "degraded" and cf.metadata.trigger == "milestone"
    assert cf.metadata.source_notebook is None and cf.body == BODY


# --- parsing never fails any other way -------------------------------------------------------

_LINE = st.one_of(
    st.sampled_from(["---", "soba-capsule: 1", "", "## Goal and constraints", "```", "\r"]),
    st.builds(lambda k, v: f"{k}: {v}", st.sampled_from(KEYS), st.text(max_size=20)),
    st.text(max_size=30),
)


@st.composite
def garbage(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 2))
    if kind == 0:
        return draw(st.text())
    if kind == 1:
        return "\n".join(draw(st.lists(_LINE, max_size=20)))
    position = draw(st.integers(0, len(TEXT)))
    removed = draw(st.integers(0, 5))
    inserted = draw(st.text(max_size=5))
    return TEXT[:position] + inserted + TEXT[position + removed :]


@settings(max_examples=500, deadline=None)
@given(garbage())
def test_parsing_random_text_raises_only_capsule_file_error(text: str) -> None:
    try:
        cf = parse_capsule_file(text, source=SOURCE)
    except CapsuleFileError as exc:
        assert "\n" not in str(exc)
    else:
        assert render_capsule_file(
            parse_capsule_file(render_capsule_file(cf), source=SOURCE)
        ) == render_capsule_file(cf)


# --- files on disk --------------------------------------------------------------------------


def test_write_then_read(tmp_path: Path) -> None:
    path = write_capsule_file(tmp_path / "handoff.capsule.md", capsule_file())
    assert path.read_bytes() == TEXT.encode("utf-8")
    assert read_capsule_file(path) == capsule_file()


def test_write_creates_missing_folders(tmp_path: Path) -> None:
    path = write_capsule_file(tmp_path / "a" / "b" / "x.capsule.md", capsule_file())
    assert path.is_file()


def test_never_overwrites_without_force(tmp_path: Path) -> None:
    path = tmp_path / "handoff.capsule.md"
    path.write_text("my notes\n", encoding="utf-8")
    with pytest.raises(CapsuleFileError, match="already exists; add --force"):
        write_capsule_file(path, capsule_file())
    assert path.read_text(encoding="utf-8") == "my notes\n"
    write_capsule_file(path, capsule_file(), force=True)
    assert read_capsule_file(path) == capsule_file()


def test_writing_onto_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CapsuleFileError, match="is a folder"):
        write_capsule_file(tmp_path, capsule_file(), force=True)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_failed_write_leaves_no_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(CapsuleFileError, match="cannot write .No space left on device"):
        write_capsule_file(tmp_path / "handoff.capsule.md", capsule_file())
    assert _names(tmp_path) == []


def test_a_failed_forced_write_keeps_the_old_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_capsule_file(tmp_path / "handoff.capsule.md", capsule_file())
    before = path.read_bytes()

    def crash(src: object, dst: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(CapsuleFileError, match="cannot write"):
        write_capsule_file(path, capsule_file(title="new"), force=True)
    assert path.read_bytes() == before
    assert _names(tmp_path) == ["handoff.capsule.md"]


def test_a_file_that_appears_during_the_write_is_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "handoff.capsule.md"
    real_fsync = os.fsync

    def someone_else_writes(fd: int) -> None:
        real_fsync(fd)
        path.write_text("theirs\n", encoding="utf-8")

    monkeypatch.setattr(os, "fsync", someone_else_writes)
    with pytest.raises(CapsuleFileError, match="already exists"):
        write_capsule_file(path, capsule_file())
    assert path.read_text(encoding="utf-8") == "theirs\n"
    assert _names(tmp_path) == ["handoff.capsule.md"]


def test_read_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.capsule.md"
    with pytest.raises(CapsuleFileError, match=r"nope\.capsule\.md: no such file"):
        read_capsule_file(missing)
    latin1 = tmp_path / "latin1.capsule.md"
    latin1.write_bytes(TEXT.replace("ünï", "").encode("utf-8").replace(b"\xc3\x97", b"\xd7"))
    with pytest.raises(CapsuleFileError, match=r"latin1\.capsule\.md: not UTF-8 text"):
        read_capsule_file(latin1)
    with pytest.raises(CapsuleFileError, match="is a folder"):
        read_capsule_file(tmp_path)
    empty = tmp_path / "empty.capsule.md"
    empty.write_bytes(b"")
    with pytest.raises(CapsuleFileError, match=r"empty\.capsule\.md: empty file"):
        read_capsule_file(empty)


def test_created_defaults_to_now_in_utc() -> None:
    meta = CapsuleMetadata(
        title="t", checkpoint="ck_00000000", quality="full", tokens=0, trigger="user"
    )
    created = datetime.fromisoformat(meta.created.replace("Z", "+00:00"))
    assert (
        created.tzinfo is not None
        and abs((datetime.now(timezone.utc) - created).total_seconds()) < 60
    )
