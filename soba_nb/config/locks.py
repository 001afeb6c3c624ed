"""Settings an admin locks (SPEC §16): the system layer's `"locked": ["model.baseUrl", …]`.

A later layer (the user's file, a project's `soba.json`, `SOBA_*` variables, magic arguments)
that sets a locked key is ignored for that key, with one line naming the layer and the key;
`locked` anywhere but the system layer is refused. Only soba's own settings are locked: a
user's code in their own kernel can still do anything (docs/teams.md)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from soba_nb.config.errors import ConfigError
from soba_nb.config.settings import Section, SobaConfig, fields_of
from soba_nb.printable import printable

LOCKED_KEY = "locked"
"""The system layer's list of dotted camelCase keys no later layer may set."""
WHERE_REQUESTS_GO = ("provider", "baseUrl", "apiKeyEnv")
"""The keys of `model` that decide where requests go and with which key. A lock on one of them
holds the summary model's too (`compaction.model.<key>`): a project's summary model of its own
would otherwise send the key elsewhere (SPEC §16)."""


class ConfigLockedWarning(UserWarning):
    """A later layer set a key the admin locked; that setting was ignored. Shown by default."""


warnings.filterwarnings("default", category=ConfigLockedWarning)


_SHOWN: set[str] = set()
"""The lines already shown in this process: each once, though `%soba` re-reads the layers."""


def _struct_of(annotation: Any) -> type[Section] | None:
    """The section a key holds (`compaction.model`, `model.pricing`), or None for a value."""
    for candidate in getattr(annotation, "__args__", (annotation,)):
        if isinstance(candidate, type) and issubclass(candidate, Section):
            return candidate
    return None


def _is_setting(dotted: str) -> bool:
    """`model.baseUrl`, `compaction.model` and `compaction.model.baseUrl` are settings."""
    cls: type[Section] | None = SobaConfig
    parts = dotted.split(".")
    for part in parts:
        if cls is None:
            return False
        info = fields_of(cls).get(part)
        if info is None:
            return False
        cls = _struct_of(info.type)
    return len(parts) >= 2


def take_locks(source: str, layer: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The system layer without `locked`, and the keys it locks; one-line `ConfigError` naming
    `source` for anything but a list of real dotted keys."""
    rest = dict(layer)
    if LOCKED_KEY not in rest:
        return rest, ()
    entries = rest.pop(LOCKED_KEY)
    if not isinstance(entries, list):
        raise ConfigError(
            f"{printable(source)}: locked = {_shown(entries)}: must be a list of dotted keys such as \"model.baseUrl\""
        )
    locked: list[str] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, str) or not _is_setting(entry):
            raise ConfigError(
                f"{printable(source)}: locked[{index}] = {_shown(entry)}: not a setting "
                "(dotted camelCase keys such as \"model.baseUrl\" or \"model.apiKeyEnv\")"
            )
        if entry not in locked:
            locked.append(entry)
    return rest, tuple(locked)


def with_implied(locked: Sequence[str]) -> dict[str, str | None]:
    """Every key held: each locked key (→ None) and, for a locked `model.baseUrl`,
    `model.apiKeyEnv` or `model.provider`, the same key of `compaction.model` (→ the key it comes
    with), unless the admin locked that one too. What the summary model does not set it
    inherits from `model`: with these held, summaries go where the locked model's requests go."""
    held: dict[str, str | None] = dict.fromkeys(locked)
    if "compaction.model" in held:
        return held  # the summary model locked whole
    for key in WHERE_REQUESTS_GO:
        if f"model.{key}" in held:
            held.setdefault(f"compaction.model.{key}", f"model.{key}")
    return held


def refuse_locked(source: str, layer: Mapping[str, Any], system: str) -> None:
    """`locked` in a layer other than the system layer is refused in one line."""
    if LOCKED_KEY in layer:
        raise ConfigError(
            f"{printable(source)}: locked: only the admin's system file ({printable(system)}) may lock settings"
        )


def drop_locked(
    source: str,
    layer: Mapping[str, Any],
    locked: Sequence[str] | Mapping[str, str | None],
    system: str,
    named: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """`layer` without what it sets of a locked key, and one line per key it tried to set.

    `locked`: the keys, or `with_implied`'s map (a key held with another is named so: "(with
    model.baseUrl)"). Setting a key's parent to null (`"compaction": {"model": null}` under a
    lock on `compaction.model.baseUrl`) changes the locked key too, and is dropped. `named`
    gives a dropped key's own source when the layer has one per key (`SOBA_BASE_URL` for
    `model.baseUrl` in the environment)."""
    out = _copy(layer)
    lines: list[str] = []
    held = locked if isinstance(locked, Mapping) else dict.fromkeys(locked)
    for dotted, along in held.items():
        parts = dotted.split(".")
        place: Any = out
        for depth, part in enumerate(parts):
            if not isinstance(place, dict) or part not in place:
                break
            if not isinstance(place[part], Mapping) and depth < len(parts) - 1 and place[part] is not None:
                break  # no object where one belongs: refused as ever, naming the layer
            if depth == len(parts) - 1 or place[part] is None:
                del place[part]
                key = ".".join(parts[: depth + 1])
                what = f"{key} is locked" if key == dotted else f"{key} would change {dotted}, locked"
                inside = [name for set_key, name in (named or {}).items() if f"{set_key}.".startswith(f"{key}.")]
                where = ", ".join(inside) or source
                also = f" (with {along})" if along is not None else ""
                lines.append(f"{printable(where)}: {what} by the admin in {printable(system)}{also}; this setting is ignored")
                break
            place = place[part]
    return out, lines


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _copy(inner) for key, inner in value.items()}
    return value


def show_once(lines: Sequence[str]) -> None:
    """Each line as a `ConfigLockedWarning`, once in this process (where the deprecation
    warnings of the configuration are shown: the notebook's output, a command's stderr)."""
    for line in lines:
        if line not in _SHOWN:
            _SHOWN.add(line)
            warnings.warn(line, ConfigLockedWarning, stacklevel=3)


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return printable(text if len(text) <= 60 else text[:57] + "...")

