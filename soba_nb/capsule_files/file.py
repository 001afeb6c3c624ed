"""The portable `.capsule.md` file, format version 2 (SPEC §8).

A file is a front-matter block followed by the capsule Markdown::

    ---
    soba-capsule: 2
    title: "Churn model handoff"
    checkpoint: "ck_1a2b3c4d"
    source-notebook: "/work/churn.ipynb"
    source-session: "20261202T143700Z-1a2b"
    created: "2026-12-02T14:37:00.000Z"
    quality: "full"
    tokens: 812
    trigger: "user"
    sha256: "…64 hex digits…"
    ---

    ## Goal and constraints
    …

Front matter: one `key: value` line per key, the keys above in that order, every value a
JSON scalar on one line (so any title round-trips without a YAML library; `source-notebook`
and `source-session` may be `null`). `soba-capsule` comes first so a future format is
recognised before anything else is read.

Body: the Markdown after the closing `---` line and one blank line. `sha256` is the hash of
every byte of the file except its own line (the `sha256: "…"` line and its newline), so an
edit anywhere — a title, a source, a token count, the body — or a truncation is detected.
Version 1 files (soba-nb 0.1) hashed only the body; they are still read, but nothing in
their front matter is trusted beyond what is shown. Figures are never trusted from any file:
`tokens` is recounted on load. The body must hold the 13 section headings of SPEC §4;
unknown extra `## ` sections are kept verbatim. Only regular files are read (a FIFO or
`/dev/zero` is refused before any byte is), and their size is checked first. Writing is
atomic and never replaces an existing file unless asked to.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from soba_nb.compaction.capsule import Capsule, CapsuleFormatError, parse_capsule
from soba_nb.redact import redact_data, redact_file_name
from soba_nb.transcript.entries import Quality, TriggerName, utc_now

FORMAT_VERSION = 2
LEGACY_VERSION = 1
"""Version 1: `sha256` covered only the body."""
HASH_KEY = "sha256"
FILE_SUFFIX = ".capsule.md"
DELIMITER = "---"
BODY_SEPARATOR = "\n"
"""The blank line between the closing delimiter and the body."""
VERSION_KEY = "soba-capsule"
KEYS: tuple[str, ...] = (
    VERSION_KEY,
    "title",
    "checkpoint",
    "source-notebook",
    "source-session",
    "created",
    "quality",
    "tokens",
    "trigger",
    "sha256",
)
"""Front-matter keys, in the order they are written."""
MAX_FILE_BYTES = 16 * 1024 * 1024
"""A capsule is a few kilobytes; refuse to read something absurdly large into the kernel."""
EXCERPT_CHARS = 60

_BOM = "\ufeff"
_FIELD_BY_KEY = {key: key.replace("-", "_") for key in KEYS if key not in (VERSION_KEY, "sha256")}
_KEY_LINE = re.compile(r"^(?P<key>[A-Za-z0-9_-]+)[ \t]*:[ \t]*(?P<value>.*?)[ \t]*$")
_CHECKPOINT = re.compile(r"ck_[0-9a-f]{8,}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_HASH_LINE = re.compile(r"^sha256[ \t]*:[^\n]*\n", re.MULTILINE)


class CapsuleFileError(ValueError):
    """A `.capsule.md` file cannot be read or written. One line: the file, then the problem."""

    def __init__(self, source: str | os.PathLike[str], problem: str):
        self.source = str(source)
        self.problem = problem
        super().__init__(f"{self.source}: {problem}")


class NoFrontMatterError(CapsuleFileError):
    """The text does not start with a front matter: it may be a plain Markdown handoff."""


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def body_sha256(body: str) -> str:
    """The content hash written in the front matter: sha256 of the UTF-8 bytes that follow
    the closing `---` line (the separating blank line, then the body)."""
    return _sha256(BODY_SEPARATOR + body)


def _encodable(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not valid Unicode text (contains a lone surrogate)") from None
    return value


class CapsuleMetadata(BaseModel):
    """What the front matter says about a capsule (everything but the format version and
    the hash, which are derived when the file is written)."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    title: str
    """Free text on one line in the file (JSON escapes newlines)."""
    checkpoint: str
    """Checkpoint id of the capsule in its source session (`ck_` + 8+ hex)."""
    source_notebook: str | None = None
    """Notebook the capsule was made in, when known."""
    source_session: str | None = None
    """Session id (transcript file stem) the capsule was made in, when known."""
    created: str = Field(default_factory=utc_now)
    """When the file was written, ISO-8601 UTC."""
    quality: Quality
    """`full` for a validated model summary, `degraded` for the deterministic fallback."""
    tokens: int = Field(ge=0)
    """Token count of the body."""
    trigger: TriggerName
    """What made the capsule (SPEC §6)."""

    @field_validator("title", "source_notebook", "source_session")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return None if value is None else _encodable(value)

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint(cls, value: str) -> str:
        if not _CHECKPOINT.fullmatch(value):
            raise ValueError("must be `ck_` followed by 8 or more lowercase hex digits")
        return value

    @field_validator("created")
    @classmethod
    def _created(cls, value: str) -> str:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("must be an ISO-8601 timestamp") from None
        if moment.utcoffset() != timezone.utc.utcoffset(None):
            raise ValueError("must be in UTC (end with Z or +00:00)")
        return value


class CapsuleFile(BaseModel):
    """A portable capsule: front-matter metadata and the Markdown body, kept verbatim."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    metadata: CapsuleMetadata
    body: str
    """The capsule Markdown with the 13 section headings (unknown extra sections kept)."""

    @field_validator("body")
    @classmethod
    def _body(cls, value: str) -> str:
        _encodable(value)
        parse_capsule(value)  # CapsuleFormatError (a ValueError) names the missing headings
        return value

    @property
    def sha256(self) -> str:
        return body_sha256(self.body)

    def capsule(self) -> Capsule:
        """The body parsed into sections."""
        return parse_capsule(self.body)


# --- render and parse -------------------------------------------------------------------


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def render_capsule_file(cf: CapsuleFile) -> str:
    """The file text: front matter in the fixed key order, a blank line, the body."""
    meta = cf.metadata
    values: dict[str, object] = {VERSION_KEY: FORMAT_VERSION}
    values.update({key: getattr(meta, field) for key, field in _FIELD_BY_KEY.items()})
    before = [DELIMITER, *(f"{key}: {_json(values[key])}" for key in KEYS if key != HASH_KEY)]
    unhashed = "\n".join([*before, DELIMITER]) + "\n" + BODY_SEPARATOR + cf.body
    digest = _sha256(unhashed)
    return "\n".join([*before, f"{HASH_KEY}: {_json(digest)}", DELIMITER]) + "\n" + BODY_SEPARATOR + cf.body


def _excerpt(text: str) -> str:
    return repr(text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…")


def _split_front_matter(text: str, source: str) -> tuple[list[tuple[int, str]], str]:
    """(numbered front-matter lines, the text after the closing delimiter)."""
    if text.startswith(_BOM):
        text = text[len(_BOM) :]
    if not text.strip():
        raise CapsuleFileError(source, "empty file")
    first, newline, _ = text.partition("\n")
    if first.rstrip("\r").rstrip() != DELIMITER or not newline:
        raise NoFrontMatterError(
            source, f"no front matter: a capsule file starts with a `{DELIMITER}` line"
        )
    lines: list[tuple[int, str]] = []
    start = len(first) + 1
    number = 1
    while (end := text.find("\n", start)) != -1:
        number += 1
        line = text[start:end].rstrip("\r")
        if line.rstrip() == DELIMITER:
            return lines, text[end + 1 :]
        lines.append((number, line))
        start = end + 1
    raise CapsuleFileError(
        source, f"front matter is never closed by a `{DELIMITER}` line (truncated file?)"
    )


def _read_values(lines: list[tuple[int, str]], source: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for number, line in lines:
        if not line.strip():
            continue
        match = _KEY_LINE.match(line)
        if match is None:
            raise CapsuleFileError(
                source, f"front matter line {number} is not `key: value`: {_excerpt(line)}"
            )
        key = match["key"]
        if key not in KEYS:
            raise CapsuleFileError(source, f"front matter line {number}: unknown key {key!r}")
        if key in values:
            raise CapsuleFileError(source, f"front matter line {number}: key {key!r} given twice")
        if not values and key != VERSION_KEY:
            raise CapsuleFileError(
                source, f"front matter must start with `{VERSION_KEY}: {FORMAT_VERSION}`"
            )
        try:
            values[key] = json.loads(match["value"])
        except (ValueError, RecursionError):
            raise CapsuleFileError(
                source, f"front matter key {key!r}: bad JSON value {_excerpt(match['value'])}"
            ) from None
        if key == VERSION_KEY and (type(values[key]) is not int or values[key] not in (FORMAT_VERSION, LEGACY_VERSION)):
            raise CapsuleFileError(
                source,
                f"unknown capsule format version {_excerpt(match['value'])} "
                f"(this soba-nb reads version {FORMAT_VERSION})",
            )
    missing = [key for key in KEYS if key not in values]
    if missing:
        if VERSION_KEY in missing:
            raise CapsuleFileError(
                source, f"front matter must start with `{VERSION_KEY}: {FORMAT_VERSION}`"
            )
        raise CapsuleFileError(source, f"front matter is missing key(s): {', '.join(missing)}")
    return values


def _pydantic_message(exc: ValidationError) -> str:
    return str(exc.errors()[0]["msg"]).removeprefix("Value error, ")


def _metadata(values: dict[str, Any], source: str) -> CapsuleMetadata:
    fields = {field: values[key] for key, field in _FIELD_BY_KEY.items()}
    try:
        return CapsuleMetadata(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "metadata"
        key = field.replace("_", "-")
        raise CapsuleFileError(
            source,
            f"front matter key {key!r}: invalid value {_excerpt(_json(fields.get(field)))} "
            f"({_pydantic_message(exc)})",
        ) from None


def _without_hash_line(text: str) -> str:
    """The file text less its `sha256` line: what a version-2 hash covers."""
    return _HASH_LINE.sub("", text, count=1)


def _verified_rest(text: str, rest: str, expected: object, version: int, source: str) -> str:
    if not isinstance(expected, str) or not _SHA256.fullmatch(expected):
        raise CapsuleFileError(source, "front matter key 'sha256': must be 64 lowercase hex digits")
    covered = rest if version == LEGACY_VERSION else _without_hash_line(text)
    try:
        actual = _sha256(covered)
    except UnicodeEncodeError:
        actual = ""
    if actual == expected:
        return rest
    # A checkout with Windows line endings (git `autocrlf`) changes nothing a reader cares about.
    normalized = covered.replace("\r\n", "\n")
    if normalized != covered and _sha256(normalized) == expected:
        return rest.replace("\r\n", "\n")
    raise CapsuleFileError(
        source, "content hash mismatch: the file was edited or truncated after export"
    )


def parse_capsule_file(text: str, *, source: str) -> CapsuleFile:
    """Read a capsule file's text. `source` names the file in errors.

    Raises `CapsuleFileError` (and nothing else) for any text that is not a valid
    version-1 capsule file.
    """
    if text.startswith(_BOM):
        text = text[len(_BOM) :]
    lines, rest = _split_front_matter(text, source)
    values = _read_values(lines, source)
    metadata = _metadata(values, source)
    rest = _verified_rest(text, rest, values[HASH_KEY], values[VERSION_KEY], source)
    body = rest[len(BODY_SEPARATOR) :] if rest.startswith(BODY_SEPARATOR) else rest
    try:
        parse_capsule(body)
    except CapsuleFormatError as exc:
        raise CapsuleFileError(source, str(exc)) from None
    try:
        return CapsuleFile(metadata=metadata, body=body)
    except ValidationError as exc:
        raise CapsuleFileError(source, f"invalid body ({_pydantic_message(exc)})") from None


# --- files ------------------------------------------------------------------------------


def read_capsule_file(path: str | os.PathLike[str]) -> CapsuleFile:
    """Read and fully validate a `.capsule.md` file. Raises `CapsuleFileError`."""
    return parse_capsule_file(read_text_file(path), source=str(path))


def read_text_file(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES, kind: str = "a capsule file"
) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`. Raises `CapsuleFileError`.

    Only a regular file is read, and only after its size (from the opened descriptor) is
    checked: `/dev/zero`, a FIFO or a 10 GB file is refused before a byte is read. `kind`
    names what the file should be, in errors ("a capsule file", "a Markdown handoff").
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except IsADirectoryError:
        raise CapsuleFileError(path, f"is a folder, not {kind}") from None
    except FileNotFoundError:
        raise CapsuleFileError(path, "no such file") from None
    except OSError as exc:
        raise CapsuleFileError(path, f"cannot read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise CapsuleFileError(path, f"is a folder, not {kind}")
        if not stat.S_ISREG(info.st_mode):
            raise CapsuleFileError(path, f"not a regular file (a device, FIFO or socket); expected {kind}")
        if info.st_size > max_bytes:
            raise CapsuleFileError(path, f"file is {info.st_size:,} bytes; {kind} is at most {max_bytes:,}")
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise CapsuleFileError(path, f"cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise CapsuleFileError(path, f"file grew past {max_bytes:,} bytes while being read")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CapsuleFileError(path, f"not UTF-8 text (bad byte at offset {exc.start})") from None


def write_capsule_file(
    path: str | os.PathLike[str], cf: CapsuleFile, *, force: bool = False
) -> Path:
    """Write atomically: a temporary file in the same folder, then a rename, so a reader
    never sees half a file. An existing file is replaced only with `force`.

    Every capsule file passes here, so this is where secrets are kept out of it: the text
    fields and the body are redacted, and so is the file name (`handoff-sk-….capsule.md`).
    Raises `CapsuleFileError` (file exists, unwritable folder, …).
    """
    data = render_capsule_file(_redacted(cf)).encode("utf-8")
    return write_file_atomically(path, data, force=force, suffix=FILE_SUFFIX)


def write_file_atomically(
    path: str | os.PathLike[str], data: bytes, *, force: bool = False, suffix: str = FILE_SUFFIX
) -> Path:
    """Write `data` atomically (temporary file, fsync, rename); returns the path written.

    The file name is redacted (`handoff-sk-….md`); the caller redacts `data`. An existing
    file is replaced only with `force`. `suffix` is the ending a file name is expected to
    have, for the message when `path` is a folder. Raises `CapsuleFileError`.
    """
    path = Path(path)
    path = path.with_name(redact_file_name(path.name))
    if path.is_dir():
        raise CapsuleFileError(path, f"is a folder; give a file name ending in {suffix}")
    if path.exists() and not force:
        raise CapsuleFileError(path, "already exists; add --force to overwrite it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise CapsuleFileError(path, f"cannot write ({exc.strerror or exc})") from None
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        _publish(temp, path, force=force)
    except OSError as exc:
        raise CapsuleFileError(path, f"cannot write ({exc.strerror or exc})") from None
    finally:
        temp.unlink(missing_ok=True)
    return path


def _redacted(cf: CapsuleFile) -> CapsuleFile:
    meta = cf.metadata
    texts = redact_data(
        {"title": meta.title, "sourceNotebook": meta.source_notebook, "sourceSession": meta.source_session, "body": cf.body}
    )
    metadata = meta.model_copy(
        update={"title": texts["title"], "source_notebook": texts["sourceNotebook"], "source_session": texts["sourceSession"]}
    )
    return CapsuleFile(metadata=metadata, body=texts["body"])


def _publish(temp: Path, path: Path, *, force: bool) -> None:
    if force:
        os.replace(temp, path)
        return
    # A hard link fails if the target appeared since the check above: never a silent overwrite.
    try:
        os.link(temp, path)
    except FileExistsError:
        raise CapsuleFileError(
            path, "already exists; add --force to overwrite it"
        ) from None
    except OSError:  # a file system without hard links
        if path.exists():
            raise CapsuleFileError(
                path, "already exists; add --force to overwrite it"
            ) from None
        os.replace(temp, path)
