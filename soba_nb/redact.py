"""Secret redaction (SPEC §3, §8): no API key, token or secret in any file we write.

Every write path goes through it at one place each, not per caller: the transcript store
(`redact_data` on every entry), the extract snapshots beside it (`redact_data` on every
line), the flight recorder, and `.capsule.md` files (text and file
name, `redact_file_name`). The model still sees what the tools returned in the turn that ran
them; what is kept on disk is redacted.

`redact(text)` replaces with `[redacted]`:
- the values of environment variables whose names contain KEY, TOKEN, SECRET or PASSWORD
  (values shorter than `MIN_SECRET_VALUE_CHARS` and common words are left alone:
  `TOKENIZERS_PARALLELISM=false` must not erase every "false", nor `KEY_ROLE=assistant` every
  "assistant");
- API-key shapes: OpenAI `sk-…` (`sk-proj-…`, `sk-svcacct-…`), Anthropic `sk-ant-…`, GitHub
  `ghp_…`/`gho_…`/`github_pat_…`, AWS access key ids `AKIA…`/`ASIA…`, Slack `xox?-…`,
  Google `AIza…`, Hugging Face `hf_…`, JWTs, PEM private-key blocks;
- credentials in context: `Bearer <token>` (8+ token characters, digits or not),
  `Authorization: <scheme> <credential>`,
  `api_key=…`, `"apiKey": "…"`, `password: …`, `https://user:password@host`.

Transcript entries are redacted with `redact_entry_data`: their content only (text of messages,
tool arguments and results, cell sources and outputs, configuration values), never the fields
soba defines (entry types, roles, ids, checkpoint ids, tool names, and the paths of the files the
agent changed: the rewind store is keyed by the real path, SPEC §16).

Shapes are matched on word boundaries and key bodies must contain a digit, so ordinary words,
slugs, entry ids, checkpoint ids (`ck_1a2b3c4d`) and sha256 hashes survive. Redaction is
idempotent: redacting twice gives the same text.
"""

from __future__ import annotations

import functools
import heapq
import json
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

REDACTED = "[redacted]"
MIN_ENV_VALUE_CHARS = 6
MIN_SECRET_VALUE_CHARS = 8
"""An environment variable's value shorter than this is never a secret to redact (SPEC §16)."""
WORD_CHARS_MAX = 13
"""A run of letters up to this long can be a common word (`authorization`); longer, a passphrase."""
SECRET_NAME_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
"""An environment variable whose name contains one of these holds a secret."""

# Random key material is mixed alphanumerics: requiring a digit keeps `sk-learn-style-slugs`.
_HAS_DIGIT = r"(?=[A-Za-z_-]*[0-9])"
# ... and it runs long between separators (base64url puts a `-` or `_` about every 32
# characters; hex none): a run of 16 keeps hyphenated names with dates and versions
# (`sk-learn-pipeline-2024-01-15.py`, a file the agent wrote) out of the shape.
_LONG_RUN = r"(?=[A-Za-z0-9_-]*?[A-Za-z0-9]{16})"
# A key starts a word, or follows an escape (`\nsk-…` in JSON-escaped tool output). Each
# shape starts with its literal head and checks what comes before the head afterwards, in a
# lookbehind over the head: a pattern that starts with a literal is searched for at C speed,
# one that starts with a lookbehind is tried at every position (40× slower on megabytes).
_WORD_BEFORE = r"[\w-]"
_ALNUM_BEFORE = r"[A-Za-z0-9]"


def _lazy(pattern: str, flags: int = 0) -> Callable[[], re.Pattern[str]]:
    """A pattern compiled when first used: every soba-nb process imports this module, and most
    of them never redact a text that holds the substring a pattern waits for."""
    return functools.cache(lambda: re.compile(pattern, flags))


def _shape(head: str, rest: str, before: str = _WORD_BEFORE, flags: int = 0) -> Callable[[], re.Pattern[str]]:
    return _lazy(rf"{head}(?:(?<!{before}{head})|(?<=\\[nrt]{head})){rest}", flags)


_KEY_SHAPES: tuple[tuple[tuple[str, ...], Callable[[], re.Pattern[str]]], ...] = (
    # (substrings one of which every match contains, the pattern): none of them, no regex
    # pass at all (nor its compilation)
    (("-----BEGIN",), _lazy(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL)),
    # OpenAI (sk-, sk-proj-, sk-svcacct-) and Anthropic (sk-ant-)
    (("sk-",), _shape("sk-", _HAS_DIGIT + _LONG_RUN + r"[A-Za-z0-9_-]{20,}")),
    (("gh",), _shape("gh[pousr]_", r"[A-Za-z0-9]{30,}")),  # GitHub classic tokens
    (("github_pat_",), _shape("github_pat_", r"[A-Za-z0-9_]{22,}")),  # GitHub fine-grained tokens
    (("AKIA", "ASIA"), _shape("(?:AKIA|ASIA)", r"[0-9A-Z]{16}(?![A-Za-z0-9])", _ALNUM_BEFORE)),  # AWS access key id
    (("xox",), _shape("xox[baprs]-", r"[A-Za-z0-9-]{10,}")),  # Slack
    (("AIza",), _shape("AIza", r"[0-9A-Za-z_-]{35}")),  # Google API key
    (("hf_",), _shape("hf_", _HAS_DIGIT + r"[A-Za-z0-9]{30,}")),  # Hugging Face
    (("eyJ",), _shape("eyJ", r"[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),  # JWT
)
_TOKEN_CHARS = r"[A-Za-z0-9._~+/=-]"
_BEARER = _lazy(
    rf"(?P<scheme>Bearer)(?<!\wBearer)(?P<space>\s+)(?!\[redacted\]){_TOKEN_CHARS}{{8,}}",
    re.IGNORECASE,
)
_AUTHORIZATION = _lazy(
    r"""(?P<lead>\bAuthorization["']?\s*[:=]\s*["']?)"""
    r"""(?P<scheme>(?:Bearer|Basic|Token|Bot|Digest|ApiKey)\s+)?"""
    r"""(?P<credential>(?!\[redacted\])[^\s"',;]+)""",
    re.IGNORECASE,
)
_URL_PASSWORD = _lazy(r"(?P<lead>://[^\s:/@]+:)(?!\[redacted\])[^\s/@]+(?=@)")

# `name = value`, `name: value`, `"name": "value"` where the name says "secret". The value
# is a quoted string or a bare word; a bare word followed by `(` or `[` is code
# (`api_key=os.environ["X"]`), not a literal, and is kept. The bare word is matched inside
# a lookahead and then consumed by backreference: an atomic group on Python 3.10, so the
# engine cannot backtrack to a shorter word that is not followed by `(`.
_BARE = r"[^\s\"',;(){}\[\]<>]*[^\s\"',;(){}\[\]<>.:]"
_ASSIGNMENT = _lazy(
    # The name's closing quote and the value's quotes may be escaped (`\"DB_PASSWORD\": \"…\"`,
    # JSON printed inside JSON), and a quoted value may hold escaped quotes (`"Pa\\ss\"w0rd"`):
    # the whole literal is the value, never only its part before the first `\"`.
    r"""(?P<lead>(?<![\w-])(?P<quote>["']?)(?P<name>[A-Za-z][\w.-]*)\\*(?P=quote)\s*[:=]\s*)"""
    r"""(?:(?P<q>\\*["'])(?P<quoted>(?:\\.|(?!(?P=q))[^\\\n])*?)(?P=q)"""
    rf"""|(?=(?P<bare>{_BARE}))(?P=bare)(?P<after>[(\[]?))""",
    re.ASCII,  # names are ASCII identifiers, as the hints and the name scan take them
)
_SECRET_NAME_WORDS = frozenset(
    {"password", "passwd", "passphrase", "secret", "apikey", "credential", "credentials"}
)
_SECRET_NAME_PAIRS = frozenset(
    {("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key")}
)
_TOKEN_WORD = "token"
_NOT_A_VALUE = frozenset(
    {"", REDACTED, "none", "null", "true", "false", "nil", "undefined", "***", "..."}
)
_WORDS = _lazy(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
# A hint counts only when the rest of its identifier is followed by `:` or `=`.
_NAME_HINT = _lazy(r"(?:pass|secret|key|token|credential)(?=[\w.-]*\\*[\"']?\s*[:=])", re.IGNORECASE | re.ASCII)
_NAME_HINTS_LOWER = (
    # "pass" only as the words that make a name secret (`password`, `passwd`, `passphrase`):
    # logs full of `passes=` or `pass_rate=` are not judged name by name.
    *(
        _lazy(rf"{word}(?=[\w.-]*\\*[\"']?\s*[:=])", re.ASCII)
        for word in ("password", "passwd", "passphrase", "secret", "credential")
    ),
    # "key" makes a name secret only after api, private, access or secret (`api_key`,
    # `privateKey`, `apikey`; after "secret" the hint above finds it), not in `key_count` or
    # `monkey`: only there is it a hint.
    *(_lazy(rf"{word}[._-]*key(?=[\w.-]*\\*[\"']?\s*[:=])", re.ASCII) for word in ("api", "private", "access")),
    # "token" makes a name secret only as its last word (`access_token`, `myToken`), never
    # with more words after it (`token_count`, `tokens`, `token_2`): only then is it a hint.
    _lazy(r"token(?=[._-]*\\*[\"']?\s*[:=])", re.ASCII),
)
"""`_NAME_HINT` one word at a time, for lower-cased text: a pattern that starts with a literal
is searched for at C speed; the alternation is tried at every position (5× slower)."""
_NAME_TAIL = _lazy(r"[\w.-]*", re.ASCII)
"""Every secret name (`is_secret_name`) contains one of these: assignments are looked for
only around them, not at every position of a megabyte of tool output."""
NAME_MAX_CHARS = 128
"""A longer identifier before a hint is not a name anyone assigns a secret to."""
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _is_secret_env_name(name: str) -> bool:
    return any(word in name.upper() for word in SECRET_NAME_WORDS)


class _EnvSecretNames:
    """Which variables of `os.environ` have secret names, without decoding and upper-casing
    the whole environment on every write (a transcript append redacts several strings).

    The names are looked at again whenever the set of variable names changed (compared as
    the environment's raw keys, at C speed); the values are read on every call."""

    def __init__(self) -> None:
        self._names: tuple[str, ...] = ()
        self._keys: tuple[object, ...] | None = None
        self._lock = threading.Lock()

    def names(self) -> tuple[str, ...]:
        raw = getattr(os.environ, "_data", None)  # CPython's os._Environ: bytes keys, undecoded
        keys = tuple(raw) if isinstance(raw, dict) else tuple(os.environ)
        with self._lock:
            if keys != self._keys:
                self._names = tuple(name for name in list(os.environ) if _is_secret_env_name(name))
                self._keys = keys
            return self._names


_ENV_SECRET_NAMES = _EnvSecretNames()


_CHILD_SECRETS: set[str] = set()
_CHILD_SECRETS_LOCK = threading.Lock()


def register_child_environment(environ: Mapping[str, str]) -> None:
    """Variables soba hands to a child process it starts (an MCP server's `env`, SPEC §19):
    their secret-named values are redacted from then on like those of `os.environ` — a server
    that echoes its token into a tool result must not put it in the transcript."""
    values = {value for name, value in environ.items() if _is_secret_env_name(name) and could_be_secret(value)}
    if values:
        with _CHILD_SECRETS_LOCK:
            _CHILD_SECRETS.update(values)


def _secret_env_values(environ: Mapping[str, str]) -> tuple[str, ...]:
    if environ is os.environ:
        pairs = ((name, os.environ.get(name, "")) for name in _ENV_SECRET_NAMES.names())
    else:
        pairs = ((name, value) for name, value in environ.items() if _is_secret_env_name(name))
    values = frozenset(value for _name, value in pairs if could_be_secret(value))
    if _CHILD_SECRETS:
        with _CHILD_SECRETS_LOCK:
            values |= _CHILD_SECRETS
    return _written_forms(values)


def could_be_secret(value: str) -> bool:
    """A value long enough to be a secret and not a common word: a word of letters in one
    case, as long as words are (`config`, `session`, `Assistant`, `PRODUCTION`), is a setting,
    not a credential, and redacting it would erase that word everywhere (SPEC §16); a longer
    run of letters (`correcthorsebatterystaple`) is a passphrase and stays a secret."""
    value = value.strip()
    if len(value) < MIN_SECRET_VALUE_CHARS:
        return False
    word = (
        len(value) <= WORD_CHARS_MAX
        and value.isascii()
        and value.isalpha()
        and (value.islower() or value.isupper() or value[1:].islower())
    )
    return not word


def _escapes(value: str) -> Iterator[str]:
    """How `value` is spelled inside a string literal of JSON (`json.dumps`, ASCII or not),
    Python (`repr`, `ascii`) or a Python bytes literal (`b'p\\xc3\\xa4ss'`)."""
    yield json.dumps(value)[1:-1]
    yield json.dumps(value, ensure_ascii=False)[1:-1]
    yield repr(value)[1:-1]
    yield repr(value + '"')[1:-2]  # quoted with ' and its ' escaped: as part of a longer string
    yield ascii(value)[1:-1]
    yield ascii(value + '"')[1:-2]
    yield repr(value.encode("utf-8", "surrogatepass"))[2:-1]


@functools.lru_cache(maxsize=8)
def _written_forms(values: frozenset[str]) -> tuple[str, ...]:
    """Every form a secret value takes in text: itself, escaped once (`print(json.dumps(dict(
    os.environ)))`, a repr, a bytes literal) and escaped twice (such output quoted again in a
    JSON or repr, as a tool result inside a log), percent-encoded in a URL. Longest first: a
    value may contain another, and a longer form contains the shorter one's start."""
    forms = set(values)
    for value in values:
        once = set(_escapes(value))
        forms |= once
        for escaped in once:
            forms |= set(_escapes(escaped))
        forms.add(quote(value, safe=""))
    return tuple(sorted((form for form in forms if len(form.strip()) >= MIN_ENV_VALUE_CHARS), key=len, reverse=True))


def is_secret_name(name: str) -> bool:
    """Whether an identifier (`OPENAI_API_KEY`, `apiKey`, `db-password`, `access_token`)
    names a secret. `tokens`, `max_tokens`, `token_count` and a bare `key` do not."""
    words: list[str] = [word.lower() for word in _WORDS().findall(name)]
    if not words:
        return False
    if any(word in _SECRET_NAME_WORDS for word in words):
        return True
    if any(pair in _SECRET_NAME_PAIRS for pair in zip(words, words[1:], strict=False)):
        return True
    return words[-1] == _TOKEN_WORD


def _assignment(match: re.Match[str]) -> str:
    if not is_secret_name(match["name"]):
        return match[0]
    if match["q"] is not None:
        value = match["quoted"]
        if value.strip().lower() in _NOT_A_VALUE:
            return match[0]
        return f"{match['lead']}{match['q']}{REDACTED}{match['q']}"
    value = match["bare"]
    if match["after"] or value.lower() in _NOT_A_VALUE or value.startswith("$"):
        return match[0]
    return f"{match['lead']}{REDACTED}"


TOKEN_LETTERS_ONLY_MIN_CHARS = 20
"""A bearer token of plain lower-case letters counts only from this length (prose is shorter)."""


def _bearer(match: re.Match[str]) -> str:
    """`Bearer <token>`: digits or not, but "uses Bearer authentication" is prose: a word of
    plain letters (capitalised at most) is a token only when it is long."""
    token = match[0][len(match["scheme"]) + len(match["space"]) :]
    plain = token.isalpha() and token[1:].islower()
    if plain and len(token) < TOKEN_LETTERS_ONLY_MIN_CHARS:
        return match[0]
    return f"{match['scheme']}{match['space']}{REDACTED}"


def _authorization(match: re.Match[str]) -> str:
    credential = match["credential"]
    # Without a scheme, only something token-like: "Authorization: handled by the proxy"
    # is prose.
    if not match["scheme"] and (
        len(credential) < MIN_ENV_VALUE_CHARS or not any(c.isdigit() for c in credential)
    ):
        return match[0]
    return f"{match['lead']}{match['scheme'] or ''}{REDACTED}"


@functools.lru_cache(maxsize=4096)
def _names_a_secret(name: str) -> bool:
    return is_secret_name(name)


def _hints(text: str, lowered: str | None = None) -> Iterator[int]:
    """Where a secret-name hint starts, in order. Searched in the lower-cased text (a
    case-insensitive regex is ten times slower) when lower-casing keeps every position."""
    if lowered is None:
        lowered = text.lower()
    if len(lowered) == len(text):
        return heapq.merge(*((match.start() for match in hint().finditer(lowered)) for hint in _NAME_HINTS_LOWER))
    return (match.start() for match in _NAME_HINT().finditer(text))


def _assignments(text: str, lowered: str | None = None) -> str:
    """`_ASSIGNMENT` applied where a secret name occurs: the same result as `sub` on the
    whole text, at the cost of the hints (few) instead of every position. `lowered`:
    `text.lower()`, when the caller has it."""
    if ":" not in text and "=" not in text:  # every assignment has one (and most names none)
        return text
    parts: list[str] = []
    done = 0
    for at in _hints(text, lowered):
        if at < done:
            continue
        start, floor = at, max(done, at - NAME_MAX_CHARS - 1)
        while start > floor and text[start - 1] in _NAME_CHARS:
            start -= 1
        tail = _NAME_TAIL().match(text, at)
        end = tail.end() if tail else at
        if end - start > NAME_MAX_CHARS:
            continue  # an identifier longer than any name (judged whole: whichever hint in it was found)
        if not _names_a_secret(text[start:end]):
            continue
        if start > done and text[start - 1] in "\"'":
            start -= 1
        match = _ASSIGNMENT().match(text, start)
        if match is None or match.end("name") <= at:
            continue
        parts += [text[done : match.start()], _assignment(match)]
        done = match.end()
    if not parts:
        return text
    parts.append(text[done:])
    return "".join(parts)


def redact(text: str, environ: Mapping[str, str] = os.environ) -> str:
    """`text` with secrets replaced by `[redacted]` (see the module docstring).

    Linear and fast on large tool outputs: each pattern runs only when a substring every one
    of its matches contains is present (found at C speed), and starts with a literal."""
    for value in _secret_env_values(environ):
        if value in text:
            text = text.replace(value, REDACTED)
    for needles, shape in _KEY_SHAPES:
        if any(needle in text for needle in needles):
            text = shape().sub(REDACTED, text)
    lowered = text.lower()
    replaced = 0
    if "authorization" in lowered:
        text, count = _AUTHORIZATION().subn(_authorization, text)
        replaced += count
    if "bearer" in lowered:
        text, count = _BEARER().subn(_bearer, text)
        replaced += count
    if "://" in text and "@" in text:
        text, count = _URL_PASSWORD().subn(lambda m: f"{m['lead']}{REDACTED}", text)
        replaced += count
    return _assignments(text, None if replaced else lowered)


def redact_data(value: Any, environ: Mapping[str, str] = os.environ) -> Any:
    """`value` (JSON-like data: dicts, lists or tuples, strings, numbers) with every string
    redacted. Keys are names of our own fields and stay."""
    if isinstance(value, str):
        return redact(value, environ)
    if isinstance(value, dict):
        return {key: redact_data(item, environ) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_data(item, environ) for item in value]
    if isinstance(value, tuple):
        return tuple(redact_data(item, environ) for item in value)
    return value


STRUCTURE_FIELDS = frozenset(
    {
        "type", "id", "parentId", "timestamp", "followsTornLine", "version", "created", "role", "callId", "name",
        "isError", "durationMs", "decision", "mode", "path", "before", "after", "sha256", "previous", "action",
        "targetId", "mime", "width", "height", "executionCount", "outcome", "operationId", "checkpointId",
        "firstKeptEntryId", "rollsUp", "amends", "trigger", "quality", "kind", "intent", "key", "consumed",
        "provider", "model", "operation", "source", "continuation", "estimated", "truncated",
    }
)
"""Fields of transcript entries (and of the records in them) that soba defines: never redacted.
`source` is a capsule's or window's origin word; a cell's source is content (`_CELL_CONTENT`)."""
_RECORD_LISTS = frozenset({"files", "artifacts", "images"})
"""Lists of soba's own records (file changes, restored files, artifacts, images)."""
_CELL_CONTENT = frozenset({"source", "error", "output", "printed", "imagesNotKept"})


def redact_entry_data(data: dict[str, Any], environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """A transcript entry (`entry_to_dict`) with its content redacted and soba's own fields
    as they are (SPEC §16): a secret-looking value never turns an entry type, a role or the
    path of a changed file into `[redacted]`."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == "cells" and isinstance(value, list):
            out[key] = [_redact_cell(cell, environ) for cell in value]
        elif key in _RECORD_LISTS and isinstance(value, list):
            out[key] = [_redact_record(item, environ) for item in value]
        elif key == "native":  # its provider, model and kind are soba's; its payload is content
            out[key] = _redact_record(value, environ)
        elif key in STRUCTURE_FIELDS:
            out[key] = _kept(key, value, environ)
        else:
            out[key] = redact_data(value, environ)
    return out


def _kept(key: str, value: Any, environ: Mapping[str, str]) -> Any:
    """A field soba defines, as it is — but a path never holds the value of a secret the
    environment names (a key's shape in a file name is kept: the rewind store is keyed by the
    real path; a real key in one is not written to disk, and that file is then not restored)."""
    if key != "path" or not isinstance(value, str):
        return value
    for secret in _secret_env_values(environ):
        if secret in value:
            value = value.replace(secret, REDACTED)
    return value


def _redact_record(record: Any, environ: Mapping[str, str]) -> Any:
    if not isinstance(record, dict):
        return redact_data(record, environ)
    return {
        key: _kept(key, value, environ) if key in STRUCTURE_FIELDS else redact_data(value, environ)
        for key, value in record.items()
    }


def _redact_cell(cell: Any, environ: Mapping[str, str]) -> Any:
    if not isinstance(cell, dict):
        return redact_data(cell, environ)
    out: dict[str, Any] = {}
    for key, value in cell.items():
        if key == "images" and isinstance(value, list):
            out[key] = [_redact_record(item, environ) for item in value]
        elif key in STRUCTURE_FIELDS and key not in _CELL_CONTENT:
            out[key] = value
        else:
            out[key] = redact_data(value, environ)
    return out


FILE_NAME_MARK = "redacted"
"""What stands for a secret in a file name (no brackets)."""


# In a file name a key may follow a hyphen and be lower-cased (`handoff-sk-proj-….capsule.md`
# made from the title "handoff sk-proj-…"): the same shapes, any case, after any non-alphanumeric.
@functools.cache
def _name_shapes() -> tuple[re.Pattern[str], ...]:
    return tuple(
        re.compile(shape().pattern.replace(_WORD_BEFORE, _ALNUM_BEFORE), shape().flags | re.IGNORECASE)
        for _, shape in _KEY_SHAPES
    )


def redact_file_name(name: str, environ: Mapping[str, str] = os.environ) -> str:
    """A file name with any secret in it, in any case, replaced by `redacted`."""
    text = redact(name, environ)
    for value in _secret_env_values(environ):
        text = re.sub(re.escape(value), FILE_NAME_MARK, text, flags=re.IGNORECASE)
    for shape in _name_shapes():
        text = shape.sub(FILE_NAME_MARK, text)
    return text.replace(REDACTED, FILE_NAME_MARK)
