"""The portable `.capsule.md` file, format version 3 (SPEC §8, §13).

A file is a front-matter block followed by the capsule Markdown::

    ---
    soba-capsule: 3
    title: "Churn model handoff"
    checkpoint: "ck_1a2b3c4d"
    source-notebook: "/work/churn.ipynb"
    source-session: "20261202T143700Z-1a2b"
    created: "2026-12-02T14:37:00.000Z"
    quality: "full"
    tokens: 812
    trigger: "user"
    author: "ana@jupyter-ana"
    sha256: "…64 hex digits…"
    hmac: "…64 hex digits…"
    ---

    ## Goal and constraints
    …

Front matter: one `key: value` line per key, the keys above in that order, every value a
JSON scalar on one line (so any title round-trips without a YAML library; `source-notebook`
and `source-session` may be `null`). `soba-capsule` comes first so a future format is
recognised before anything else is read. `author` is who wrote the file, `user@host` from
the OS (`current_author`).

Body: the Markdown after the closing `---` line and one blank line. `sha256` is the hash of
every byte of the file except the `sha256` and `hmac` lines (each with its newline), so an
edit anywhere — a title, the author, a token count, the body — or a truncation is detected.
`hmac` is there only when the writer had the team key (`soba_nb.capsule_files.signing`):
HMAC-SHA256 of the same bytes; a reader with the key verifies it (`key=`).

Versions read: 3; 2 (soba-nb 0.2: no `author`, never signed); 1 (soba-nb 0.1: `sha256`
covered only the body, so nothing in its front matter is vouched for: its `quality` is read
as `degraded`, and with a team key it is refused). Figures are never trusted from any file:
`tokens` is recounted on load. The body must hold the 13 section headings of SPEC §4;
unknown extra `## ` sections are kept verbatim. Reading and writing are
`soba_nb.capsule_files.disk`'s: only regular files of a bounded size are read; writing is
atomic and never replaces an existing file unless asked to.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import socket
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from soba_nb.capsule_files.disk import FILE_SUFFIX as FILE_SUFFIX  # re-exported
from soba_nb.capsule_files.disk import MAX_FILE_BYTES as MAX_FILE_BYTES  # re-exported
from soba_nb.capsule_files.disk import CapsuleFileError as CapsuleFileError  # re-exported
from soba_nb.capsule_files.disk import read_text_file as read_text_file  # re-exported
from soba_nb.capsule_files.disk import write_file_atomically as write_file_atomically  # re-exported
from soba_nb.capsule_files.signing import (
    HMAC_KEY,
    CapsuleKeyError,
    SignatureError,
    capsule_key,
    check_signature,
    sign,
)
from soba_nb.compaction.capsule import Capsule, CapsuleFormatError, parse_capsule
from soba_nb.redact import redact_data
from soba_nb.transcript.entries import Quality, TriggerName, utc_now

FORMAT_VERSION = 3
WHOLE_FILE_VERSION = 2
"""From version 2 on, the hash covers the front matter too (and a file may be signed)."""
LEGACY_VERSION = 1
"""Version 1: `sha256` covered only the body."""
READ_VERSIONS = (LEGACY_VERSION, WHOLE_FILE_VERSION, FORMAT_VERSION)
HASH_KEY = "sha256"
AUTHOR_KEY = "author"
UNKNOWN = "unknown"
"""The part of `user@host` the OS cannot say; an author a file older than version 3 never
recorded."""
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
    AUTHOR_KEY,
    HASH_KEY,
)
"""Front-matter keys every file of this version has, in the order they are written; a signed
file has `hmac` after `sha256`."""
EXCERPT_CHARS = 60

_BOM = "\ufeff"
_FIELD_BY_KEY = {key: key.replace("-", "_") for key in KEYS if key not in (VERSION_KEY, HASH_KEY)}
_KEY_LINE = re.compile(r"^(?P<key>[A-Za-z0-9_-]+)[ \t]*:[ \t]*(?P<value>.*?)[ \t]*$")
_CHECKPOINT = re.compile(r"ck_[0-9a-f]{8,}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_UNHASHED_LINE = re.compile(rf"^(?:{HASH_KEY}|{HMAC_KEY})[ \t]*:[^\n]*\n", re.MULTILINE)


def required_keys(version: int) -> tuple[str, ...]:
    """The keys a file of `version` must have (`author` came with version 3)."""
    return KEYS if version == FORMAT_VERSION else tuple(key for key in KEYS if key != AUTHOR_KEY)


KNOWN_KEYS = (*KEYS, HMAC_KEY)
"""Keys a file of any version may have: an older file edited to hold newer keys is read (and
judged by its version's hash)."""


class NoFrontMatterError(CapsuleFileError):
    """The text does not start with a front matter: it may be a plain Markdown handoff."""


class CapsuleSignatureError(CapsuleFileError):
    """With a team key, the file's signature does not hold (missing, wrong, version 1)."""


def current_author() -> str:
    """`user@host` from the OS: the account name of this process's user id and the host name.

    Where the OS cannot say — a container running a user id with no account (OpenShift,
    `docker run --user 12345`), no host name — the user is `uid12345` and the host
    `unknown`; environment variables, which anyone sets, are not asked (but on a system
    without user ids, Windows, the login name is all there is)."""
    try:
        import pwd

        user = pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError, OSError):
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else _login_name()
    try:
        host = socket.gethostname().strip()
    except OSError:
        host = ""
    return f"{user.strip() or UNKNOWN}@{host or UNKNOWN}"


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (ImportError, KeyError, OSError):
        return UNKNOWN


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
    author: str | None = Field(default_factory=current_author)
    """Who wrote the file, `user@host` (SPEC §13); None in a file older than version 3."""

    @field_validator("title", "source_notebook", "source_session")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return None if value is None else _encodable(value)

    @field_validator("author")
    @classmethod
    def _author(cls, value: str | None) -> str | None:
        if value is not None and not _encodable(value).strip():
            raise ValueError("must name who wrote the file (user@host)")
        return value

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


def render_capsule_file(cf: CapsuleFile, *, key: bytes | None = None) -> str:
    """The file text: front matter in the fixed key order, a blank line, the body; signed
    (`hmac`) with `key`, the team key, when given."""
    meta = cf.metadata
    values: dict[str, object] = {VERSION_KEY: FORMAT_VERSION}
    values.update({key: getattr(meta, field) for key, field in _FIELD_BY_KEY.items()})
    if values[AUTHOR_KEY] is None:  # a file older than version 3, written again
        values[AUTHOR_KEY] = f"{UNKNOWN}@{UNKNOWN}"
    before = [DELIMITER, *(f"{name}: {_json(values[name])}" for name in KEYS if name != HASH_KEY)]
    covered = ("\n".join([*before, DELIMITER]) + "\n" + BODY_SEPARATOR + cf.body).encode("utf-8")
    seals = [f"{HASH_KEY}: {_json(hashlib.sha256(covered).hexdigest())}"]
    if key is not None:
        seals.append(f"{HMAC_KEY}: {_json(sign(covered, key))}")
    return "\n".join([*before, *seals, DELIMITER]) + "\n" + BODY_SEPARATOR + cf.body


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
        if key not in KNOWN_KEYS:
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
        if key == VERSION_KEY and (type(values[key]) is not int or values[key] not in READ_VERSIONS):
            raise CapsuleFileError(
                source,
                f"unknown capsule format version {_excerpt(match['value'])} "
                f"(this soba-nb reads versions {LEGACY_VERSION} to {FORMAT_VERSION})",
            )
    missing = [key for key in required_keys(values.get(VERSION_KEY, FORMAT_VERSION)) if key not in values]
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
    # `author` is absent from files older than version 3: None, not the reader's name.
    fields: dict[str, Any] = {field: values.get(key) for key, field in _FIELD_BY_KEY.items()}
    try:
        return CapsuleMetadata.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "metadata"
        key = field.replace("_", "-")
        raise CapsuleFileError(
            source,
            f"front matter key {key!r}: invalid value {_excerpt(_json(fields.get(field)))} "
            f"({_pydantic_message(exc)})",
        ) from None


def _covered(text: str, rest: str, version: int) -> str:
    """What the hash covers: the body alone (version 1), else the whole file less the
    `sha256` and `hmac` lines of its front matter (never a line of the body)."""
    if version == LEGACY_VERSION:
        return rest
    front = text[: len(text) - len(rest)]
    return _UNHASHED_LINE.sub("", front) + rest


def _verified_rest(text: str, rest: str, expected: object, version: int, source: str) -> tuple[str, bytes]:
    """(the text after the front matter, the bytes the hash covers), once the hash holds."""
    if not isinstance(expected, str) or not _SHA256.fullmatch(expected):
        raise CapsuleFileError(source, "front matter key 'sha256': must be 64 lowercase hex digits")
    covered = _covered(text, rest, version)
    try:
        actual = _sha256(covered)
    except UnicodeEncodeError:
        actual = ""
    if actual == expected:
        return rest, covered.encode("utf-8")
    # A checkout with Windows line endings (git `autocrlf`) changes nothing a reader cares about.
    normalized = covered.replace("\r\n", "\n")
    if normalized != covered and _sha256(normalized) == expected:
        return rest.replace("\r\n", "\n"), normalized.encode("utf-8")
    raise CapsuleFileError(
        source, "content hash mismatch: the file was edited or truncated after export"
    )


def parse_capsule_file(text: str, *, source: str, key: bytes | None = None) -> CapsuleFile:
    """Read a capsule file's text. `source` names the file in errors. With `key` (the team
    key), the file must be signed with it (`CapsuleSignatureError` otherwise).

    Raises `CapsuleFileError` (and nothing else) for any text that is not a valid capsule
    file of a version this soba-nb reads.
    """
    if text.startswith(_BOM):
        text = text[len(_BOM) :]
    lines, rest = _split_front_matter(text, source)
    values = _read_values(lines, source)
    metadata = _metadata(values, source)
    version = values[VERSION_KEY]
    if version == FORMAT_VERSION and metadata.author is None:
        raise CapsuleFileError(source, "front matter key 'author': must name who wrote the file (user@host), not null")
    rest, covered = _verified_rest(text, rest, values[HASH_KEY], version, source)
    if key is not None:
        try:
            check_signature(covered, values.get(HMAC_KEY), version=version, signed_since=WHOLE_FILE_VERSION, key=key)
        except SignatureError as exc:
            raise CapsuleSignatureError(source, str(exc)) from None
    if version == LEGACY_VERSION:  # its front matter is not covered: no claim of quality holds
        metadata = metadata.model_copy(update={"quality": "degraded"})
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


def read_capsule_file(path: str | os.PathLike[str], *, key: bytes | None = None) -> CapsuleFile:
    """Read and fully validate a `.capsule.md` file (signed with `key`, when given).
    Raises `CapsuleFileError`."""
    return parse_capsule_file(read_text_file(path), source=str(path), key=key)


def capsule_file_bytes(cf: CapsuleFile, *, environ: Mapping[str, str] = os.environ) -> bytes:
    """What a capsule file holds: its text with secrets redacted, signed when `environ` holds
    the team key. Raises `CapsuleKeyError` for a key that cannot be one."""
    return render_capsule_file(_redacted(cf, environ), key=capsule_key(environ)).encode("utf-8")


def write_capsule_file(
    path: str | os.PathLike[str], cf: CapsuleFile, *, force: bool = False, environ: Mapping[str, str] = os.environ
) -> Path:
    """Write atomically: a temporary file in the same folder, then a rename, so a reader
    never sees half a file. An existing file is replaced only with `force`. The file is
    made with the user's umask (it is meant to be shared) and signed with the team key.

    Every capsule file passes here, so this is where secrets are kept out of it: the text
    fields and the body are redacted, and so is the file name (`handoff-sk-….capsule.md`).
    Raises `CapsuleFileError` (file exists, unwritable folder, a bad team key, …).
    """
    try:
        data = capsule_file_bytes(cf, environ=environ)
    except CapsuleKeyError as exc:
        raise CapsuleFileError(path, f"not written: {exc}") from None
    return write_file_atomically(path, data, force=force, suffix=FILE_SUFFIX)


def _redacted(cf: CapsuleFile, environ: Mapping[str, str] = os.environ) -> CapsuleFile:
    meta = cf.metadata
    texts = redact_data(
        {
            "title": meta.title, "sourceNotebook": meta.source_notebook, "sourceSession": meta.source_session,
            "author": meta.author, "body": cf.body,
        },
        environ,
    )
    metadata = meta.model_copy(
        update={
            "title": texts["title"], "source_notebook": texts["sourceNotebook"],
            "source_session": texts["sourceSession"], "author": texts["author"],
        }
    )
    return CapsuleFile(metadata=metadata, body=texts["body"])
