"""How a refused configuration is told: one line naming the key, its value and the rule
(`model.contextWindow = 0: input should be greater than 0`).

msgspec says what it refused in one sentence and where (`Expected `int` >= 1 - at
`$.model.contextWindow``); the key is taken from where, and the rule is worded from the key's
own declaration (its type, its bounds, its choices), so the words stay ours whoever checks.
"""

from __future__ import annotations

import json
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from soba_nb.config.errors import FieldProblem
from soba_nb.config.settings import SobaConfig, fields_of
from soba_nb.redact import is_secret_name, redact
from soba_nb.text import clip

WHERE = re.compile(r" - at `\$((?:\.[A-Za-z]+)*)`\Z")
"""The end of a msgspec message naming where (our keys are letters only)."""
RANGE = re.compile(r"\AExpected `[a-z]+` ([<>])")
MISSING = re.compile(r"\AObject missing required field `([A-Za-z]+)`\Z")
TYPE_WORDS = {int: "a valid integer", float: "a valid number", bool: "a valid boolean", str: "a valid string"}


@dataclass(frozen=True)
class Refusal:
    """The first thing refused: where (camelCase keys from the validated object's top), and
    which kind of refusal (`unknown`, `missing`, `object`, `check` — a key's own check —, or
    `rule`) with the rule in words."""

    loc: tuple[str, ...]
    kind: str
    rule: str

    def line(self, data: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> str:
        """`one_line` of this refusal."""
        return one_line(self, data, prefix)


def refusal_of(error: msgspec.ValidationError, root: type[msgspec.Struct], data: Any) -> Refusal:
    """What `msgspec.convert(data, root)` refused, and where."""
    message = str(error)
    if not isinstance(data, Mapping):
        return Refusal((), "rule", "the configuration must be a JSON object")
    if message.startswith("Object contains unknown field") or " - at `key` in `$" in message:
        # The key itself may hold anything (a backtick, " - at ", a number from Python): found
        # in the data instead.
        found = unknown_key(data, root)
        if found is not None:
            return Refusal(found, "unknown", "unknown key")
    mcp = _mcp_refusal(message, data)
    if mcp is not None:
        return mcp
    cause = error.__cause__
    where = WHERE.search(message)
    loc = tuple(where.group(1).split(".")[1:]) if where else ()
    sentence = message[: where.start()] if where else message
    if isinstance(cause, FieldProblem):
        return Refusal((*loc, *cause.key.split(".")), "check", cause.rule)
    if isinstance(cause, ValueError):  # a check of several keys together: its own words
        return Refusal((), "rule", str(cause))
    missing = MISSING.match(sentence)
    if missing:
        return Refusal((*loc, missing.group(1)), "missing", "required")
    declared = declared_type(root, loc)
    if declared is None:
        return Refusal(loc, "rule", " ".join(sentence.split()))
    base, meta, choices = declared
    if choices:
        return Refusal(loc, "rule", "input should be " + _alternatives([repr(choice) for choice in choices]))
    if isinstance(base, type) and issubclass(base, msgspec.Struct):
        return Refusal(loc, "object", "must be a JSON object")
    bound = RANGE.match(sentence)
    value = value_at(data, loc)
    if bound and isinstance(value, float) and not math.isfinite(value):  # NaN fails every bound
        return Refusal(loc, "rule", "input should be a finite number")
    if bound and meta is not None:
        if bound.group(1) == ">":
            if meta.gt is not None:
                return Refusal(loc, "rule", f"input should be greater than {_figure(meta.gt)}")
            return Refusal(loc, "rule", f"input should be greater than or equal to {_figure(meta.ge)}")
        return Refusal(loc, "rule", f"input should be less than or equal to {_figure(meta.le)}")
    return Refusal(loc, "rule", f"input should be {TYPE_WORDS.get(base, ' '.join(sentence.split()))}")


MCP_WHERE = re.compile(r" - at `\$\.mcpServers(\[\.\.\.\])?(?:\.([A-Za-z]+))?")
"""Where msgspec says an `mcpServers` value was refused (the server's name as `[...]`)."""
MCP_RULES = {
    "command": "must be a string: the program that runs the server",
    "url": "must be a string: the server's streamable HTTP address",
    "args": "must be a list of strings",
    "env": "must map environment variable names to strings (its values are never shown)",
    "": "must be an object: {command, args, env} (stdio) or {url} (streamable HTTP)",
}


def _mcp_refusal(message: str, data: Mapping[str, Any]) -> Refusal | None:
    """An `mcpServers` value refused by type, in one line naming the server and the key; the
    value is not shown (an `env` value may be a token)."""
    where = MCP_WHERE.search(message)
    if where is None:
        return None
    if where.group(1) is None:
        return Refusal((), "rule", "mcpServers must be an object naming each server: {NAME: {command, args, env} or {url}}")
    from soba_nb.config.settings import McpServerSettings

    servers = data.get("mcpServers")
    name = "[...]"
    for candidate, value in servers.items() if isinstance(servers, Mapping) else ():
        try:
            msgspec.convert(value, McpServerSettings)
        except msgspec.ValidationError:
            name = candidate if isinstance(candidate, str) and candidate.isprintable() else "[...]"
            break
    key = where.group(2) or ""
    dotted = ".".join(part for part in ("mcpServers", name[:40], key) if part)
    return Refusal((), "rule", f"{dotted} {MCP_RULES.get(key, MCP_RULES[''])}")


def _alternatives(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _figure(value: Any) -> str:
    """A bound as a person writes it: 0 rather than 0.0."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _unwrap(tp: Any) -> tuple[Any, msgspec.Meta | None, tuple[Any, ...]]:
    """(base type, its bounds, its choices) of a declared type, past `| None` and `Annotated`."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        tp = args[0] if len(args) == 1 else tp
    meta = None
    if typing.get_origin(tp) is typing.Annotated:
        tp, *extras = typing.get_args(tp)
        meta = next((extra for extra in extras if isinstance(extra, msgspec.Meta)), None)
    choices = typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else ()
    return tp, meta, choices


def declared_type(root: type[msgspec.Struct], loc: Sequence[str]) -> tuple[Any, msgspec.Meta | None, tuple[Any, ...]] | None:
    """What the key at `loc` is declared as; None when `loc` names no key."""
    declared: Any = root
    meta, choices = None, ()
    for part in loc:
        if not (isinstance(declared, type) and issubclass(declared, msgspec.Struct)):
            return None
        info = fields_of(declared).get(part)
        if info is None:
            return None
        declared, meta, choices = _unwrap(info.type)
    return (declared, meta, choices) if loc else None


def unknown_key(data: Any, cls: type[msgspec.Struct], loc: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """Where the first key `cls` does not know stands in `data`, or None."""
    if not isinstance(data, Mapping):
        return None
    known = fields_of(cls)
    for key, value in data.items():
        info = known.get(key) if isinstance(key, str) else None
        if info is None:
            return (*loc, str(key))
        nested, _meta, _choices = _unwrap(info.type)
        if isinstance(nested, type) and issubclass(nested, msgspec.Struct):
            found = unknown_key(value, nested, (*loc, key))
            if found is not None:
                return found
    return None


VALUE_SHOWN_CHARS = 80


def shown_value(value: Any) -> str:
    """A value as a configuration error shows it: JSON, redacted, then clipped. The error is
    shown in a cell's output, which the notebook file keeps: a secret written where a setting
    belongs (a key pasted into `contextWindow`, a password in `baseUrl`) must not be echoed,
    nor anything under a key that names a secret."""
    return clip(redact(json.dumps(value, default=str)), VALUE_SHOWN_CHARS)


def key_and_value(key: str, loc: Sequence[str], value: Any) -> str:
    """`key = value` for an error, or `key (value not shown)` under a key that names a secret."""
    if any(is_secret_name(part) for part in loc):
        return f"{key} (value not shown)"
    return f"{key} = {shown_value(value)}"


def known_keys(loc: Sequence[str]) -> str:
    """The keys that may stand where an unknown one was found (`loc`: from the top)."""
    declared = declared_type(SobaConfig, loc[:-1]) if len(loc) > 1 else None
    if declared is not None and isinstance(declared[0], type) and issubclass(declared[0], msgspec.Struct):
        return f"known keys in {'.'.join(loc[:-1])}: {', '.join(fields_of(declared[0]))}"
    return f"the top level has {', '.join(fields_of(SobaConfig))}"


def _key_variable_key(loc: Sequence[str]) -> str:
    """`model.apiKeyEnv`, or the `apiKeyEnv` beside an unknown key at `loc` when that section
    has one (`compaction.model.apiKeyEnv`: the summary model's own key)."""
    declared = declared_type(SobaConfig, loc[:-1]) if len(loc) > 1 else None
    section = declared[0] if declared is not None else None
    if isinstance(section, type) and issubclass(section, msgspec.Struct) and "apiKeyEnv" in fields_of(section):
        return ".".join([*loc[:-1], "apiKeyEnv"])
    return "model.apiKeyEnv"


def value_at(data: Any, loc: Sequence[str]) -> Any:
    """What stands at `loc` in `data` (None where nothing does)."""
    for part in loc:
        data = data.get(part) if isinstance(data, Mapping) else None
    return data


def one_line(refusal: Refusal, data: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> str:
    """The refusal as `key = value: rule` (`prefix`: where the validated object sits in the
    configuration; `data`: the configuration's JSON, from its top)."""
    loc = [*prefix, *refusal.loc]
    value = value_at(data, loc)
    # A key is shown as JSON when it is not a plain name (a newline in it must not break the line).
    key = ".".join(part if part.isidentifier() else json.dumps(part) for part in loc) if loc else "config"
    if refusal.kind == "unknown":
        where = known_keys(loc)
        if is_secret_name(loc[-1]):
            return (
                f"{key}: unknown key (its value is not shown: the key names a secret; a key is read only "
                f"from the environment variable {_key_variable_key(loc)} names); {where}"
            )
        return f"{key}: unknown key (value {shown_value(value)}); {where}"
    if refusal.kind == "missing":
        return f"{key}: required"
    if not loc:
        return refusal.rule
    return f"{key_and_value(key, loc, value)}: {refusal.rule}"
