"""Configuration: the keys of SPEC §3, layered loading and one-line validation errors.

Layers, later wins: defaults → provider profile → the admin's `/etc/soba/config.json`
(`SOBA_SYSTEM_CONFIG` names another; SPEC §13) → `~/.soba/config.json` → nearest
`soba.json` (the notebook's folder or a parent) → `SOBA_*` environment → explicit
overrides (magic arguments). JSON keys are camelCase exactly as in the spec.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from soba_nb.compaction.limits import (
    KEEP_SHARE,
    MAX_OUTPUT_SHARE,
    MIN_AUTO_SHARE,
    MIN_RECLAIMABLE_SHARE,
    SAFETY_SHARE,
    hard_limit,
)
from soba_nb.config.errors import (
    ConfigDeprecationWarning as ConfigDeprecationWarning,  # re-exported
)
from soba_nb.config.errors import ConfigError as ConfigError  # re-exported
from soba_nb.config.errors import Refused
from soba_nb.config.files import MAX_CONFIG_BYTES as MAX_CONFIG_BYTES  # re-exported
from soba_nb.config.files import MAX_CONFIG_DEPTH, depth, read_config_file
from soba_nb.config.files import find_project_config as find_project_config  # re-exported
from soba_nb.config.locks import ConfigLockedWarning as ConfigLockedWarning  # re-exported
from soba_nb.config.locks import drop_locked, refuse_locked, show_once, take_locks, with_implied
from soba_nb.config.profiles import EMBEDDED_MODEL_NAME as EMBEDDED_MODEL_NAME  # re-exported
from soba_nb.config.profiles import PROVIDER_PROFILES as PROVIDER_PROFILES  # re-exported
from soba_nb.config.settings import MAX_CONTEXT_WINDOW as MAX_CONTEXT_WINDOW  # re-exported
from soba_nb.config.settings import MAX_TIMEOUT_MS as MAX_TIMEOUT_MS  # re-exported
from soba_nb.config.settings import AgentSettings as AgentSettings  # re-exported
from soba_nb.config.settings import CompactionSettings as CompactionSettings  # re-exported
from soba_nb.config.settings import ModelSettings as ModelSettings  # re-exported
from soba_nb.config.settings import NotebookSettings as NotebookSettings  # re-exported
from soba_nb.config.settings import PricingSettings as PricingSettings  # re-exported
from soba_nb.config.settings import Section, fields_of
from soba_nb.config.settings import SobaConfig as SobaConfig  # re-exported
from soba_nb.config.settings import SummaryModelSettings as SummaryModelSettings  # re-exported
from soba_nb.layout import SYSTEM_CONFIG_ENV, SYSTEM_CONFIG_PATH, USER_CONFIG_PATH
from soba_nb.paths import shown
from soba_nb.printable import printable
from soba_nb.resolution import resolve_provider

if TYPE_CHECKING:
    from soba_nb.config.refusal import Refusal

S = TypeVar("S", bound=Section)

ENV_PREFIX = "SOBA_"


DEPRECATED_ALIASES = {"backgroundTimeoutMs": "timeoutMs"}


def _deep_merge(base: dict[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _apply_aliases(layer: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Rename deprecated keys (with a warning naming the new key); the new key wins."""
    out = dict(layer)
    section = out.get("compaction")
    if isinstance(section, Mapping):
        section = dict(section)
        for old, new in DEPRECATED_ALIASES.items():
            if old in section:
                value = section.pop(old)
                warnings.warn(
                    f"{source}: compaction.{old} is deprecated; use compaction.{new}",
                    ConfigDeprecationWarning,
                    stacklevel=3,
                )
                section.setdefault(new, value)
        out["compaction"] = section
    return out


_SECTIONS: dict[str, type[Section]] = {
    "model": ModelSettings,
    "compaction": CompactionSettings,
    "notebook": NotebookSettings,
    "agent": AgentSettings,
}


EnvPath = tuple[str, ...]
"""Where a variable's value goes: (section, key) or (section, key, nested key)."""

NESTED_ENV_SECTIONS: dict[tuple[str, str], type[Section]] = {("compaction", "model"): SummaryModelSettings}
"""Keys holding an object whose own keys have variables too: `SOBA_COMPACTION_MODEL_NAME`
(beside `SOBA_COMPACTION_MODEL`, the whole object as JSON)."""


def _env_keys() -> dict[str, EnvPath]:
    """`SOBA_<SECTION>_<FIELD>` for every key, e.g. `SOBA_COMPACTION_TIMEOUT_MS`, and
    `SOBA_<SECTION>_<FIELD>_<NESTED>` for the keys of `NESTED_ENV_SECTIONS`."""
    keys: dict[str, EnvPath] = {}
    for section_name, section in _SECTIONS.items():
        for info in msgspec.structs.fields(section):
            var = f"{ENV_PREFIX}{section_name.upper()}_{info.name.upper()}"
            keys[var] = (section_name, info.encode_name)
            nested = NESTED_ENV_SECTIONS.get((section_name, info.encode_name))
            for inner in msgspec.structs.fields(nested) if nested is not None else ():
                keys[f"{var}_{inner.name.upper()}"] = (section_name, info.encode_name, inner.encode_name)
    return keys


_ENV_KEYS = _env_keys()


# Short forms for the keys people set most.
_ENV_KEYS.update(
    {
        f"{ENV_PREFIX}PROVIDER": ("model", "provider"),
        f"{ENV_PREFIX}MODEL": ("model", "name"),
        f"{ENV_PREFIX}BASE_URL": ("model", "baseUrl"),
        f"{ENV_PREFIX}AUTO_COMPACT": ("compaction", "auto"),
        f"{ENV_PREFIX}COMPACTION_BACKGROUND_TIMEOUT_MS": ("compaction", "backgroundTimeoutMs"),
    }
)


def env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    """`SOBA_MODEL_CONTEXT_WINDOW=65000`, `SOBA_COMPACTION_AUTO=false`, `SOBA_MODEL=...`,
    `SOBA_COMPACTION_MODEL_NAME=gpt-4o-mini`.

    Values are parsed as JSON when they parse (numbers, booleans, null), else kept as text.
    Each is checked against its key here, so a refusal names the variable
    (`SOBA_COMPACTION_AUTO=yes` is not a boolean: only `true` and `false` are). A nested
    key's variable wins over the same key inside its object's variable."""
    layer: dict[str, Any] = {}
    for var, path in sorted(_ENV_KEYS.items(), key=lambda item: len(item[1])):
        if var not in environ:
            continue
        raw = environ[var]
        try:
            value: Any = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON (or absurdly deep or long): text
            value = raw
        _check_env_value(var, path, value)
        *parents, key = path
        place = layer
        for parent in parents:
            inner = place.get(parent)
            place[parent] = inner = dict(inner) if isinstance(inner, Mapping) else {}
            place = inner
        place[key] = value
    return layer


def _check_env_value(var: str, path: EnvPath, value: Any) -> None:
    """Validate one variable's value against its key alone (figures that must agree with
    each other are checked once every layer is merged)."""
    section, key, *nested = path
    key = DEPRECATED_ALIASES.get(key, key)
    if depth(value) > MAX_CONFIG_DEPTH:
        raise ConfigError(f"invalid configuration: {var}: nested too deeply (more than {MAX_CONFIG_DEPTH} levels)")
    if nested:
        [inner] = nested
        cls: type[Section] = NESTED_ENV_SECTIONS[(section, key)]
        # The object's required keys are another variable's (or a file's): stand-ins here.
        data: dict[str, Any] = {**_REQUIRED_STAND_INS, inner: value}
        where: tuple[str, ...] = (section, key)
    else:
        cls, data, where = _SECTIONS[section], {key: value}, (section,)
    try:
        _convert(data, cls)
    except Refused as refused:
        whole: dict[str, Any] = data
        for part in reversed(where):
            whole = {part: whole}
        raise ConfigError(f"invalid configuration: {var}: {refused.refusal.line(whole, where)}") from None


_REQUIRED_STAND_INS: dict[str, Any] = {"name": "model"}
"""What a nested key's variable is checked beside (`SOBA_COMPACTION_MODEL_CONTEXT_WINDOW`
alone is a valid setting: the name may come from a file)."""


def _convert(data: Mapping[str, Any], cls: type[S]) -> S:
    """`data` (camelCase JSON) as `cls`, or `Refused`: what was refused, and where."""
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as exc:
        from soba_nb.config.refusal import refusal_of  # only a refusal words itself

        raise Refused(refusal_of(exc, cls, data)) from None


RESOLUTION_LAYER = "provider resolution"
"""The layer `load_config` adds when it chose the provider (not a user's setting)."""


def _explicit_keys(layers: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, str]:
    """`section.key` → the last layer that set it (the resolution layer does not count)."""
    explicit: dict[str, str] = {}
    for name, layer in layers:
        if name == RESOLUTION_LAYER:
            continue
        for section, values in layer.items():
            if isinstance(values, Mapping):
                explicit.update({f"{section}.{key}": name for key in values})
    return explicit


def recorded_config(data: Mapping[str, Any], explicit: Mapping[str, str], provider_source: str) -> SobaConfig:
    """A configuration as a session recorded it (`ConfigEntry`); a `ConfigError` when
    today's rules refuse it (a transcript is data, and may be hand-edited)."""
    try:
        config = _convert(data, SobaConfig)
    except Refused as refused:
        raise ConfigError(f"the recorded configuration is refused: {refused.refusal.line(data)}") from None
    return config.record_origin(dict(explicit), provider_source)


def build_config(layers: list[tuple[str, Mapping[str, Any]]]) -> SobaConfig:
    """Merge layers (name, camelCase dict) in order and validate once."""
    merged: dict[str, Any] = {}
    provider = None
    renamed = [(name, _apply_aliases(layer, name)) for name, layer in layers]
    for _name, layer in renamed:
        model = layer.get("model")
        if isinstance(model, Mapping) and "provider" in model:
            provider = model["provider"]
    if isinstance(provider, str) and provider in PROVIDER_PROFILES:
        merged = _deep_merge(merged, PROVIDER_PROFILES[provider])
    for _name, layer in renamed:
        merged = _deep_merge(merged, layer)
    explicit = _explicit_keys(renamed)
    merged = _fit_unset(merged, explicit)
    try:
        config = _convert(merged, SobaConfig)
    except Refused as refused:
        line = refused.refusal.line(merged)
        raise ConfigError(f"invalid configuration: {line}{_set_in(refused.refusal, explicit)}") from None
    return config.record_origin(explicit)


def _fit_unset(merged: dict[str, Any], explicit: Mapping[str, str]) -> dict[str, Any]:
    """Figures the user did not set give way when they cannot hold in the window the user did
    set: `{"model": {"contextWindow": 8192}}` alone met the default safetyReserveTokens of
    8,192 (hardLimit -8,000) and keepRecentTokens of 20,000, and was refused. Only the figures
    that cannot hold are scaled (to their share of the window, as `soba_nb.window` does for a
    window learned later), never one a user layer gave: those are refused with the rule."""
    model = merged.get("model") if isinstance(merged.get("model"), Mapping) else {}
    compaction = merged.get("compaction") if isinstance(merged.get("compaction"), Mapping) else {}
    assert isinstance(model, Mapping) and isinstance(compaction, Mapping)

    def figure(section: Mapping[str, Any], fields: Mapping[str, msgspec.structs.FieldInfo], key: str) -> int | None:
        value = section.get(key, fields[key].default)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    m_fields, c_fields = fields_of(ModelSettings), fields_of(CompactionSettings)
    window = figure(model, m_fields, "contextWindow")
    output = figure(model, m_fields, "maxOutputTokens")
    safety = figure(compaction, c_fields, "safetyReserveTokens")
    keep = figure(compaction, c_fields, "keepRecentTokens")
    if window is None or output is None or safety is None or keep is None or window <= 0:
        return merged  # validation names what is wrong
    new_model, new_compaction = dict(model), dict(compaction)
    if hard_limit(window, output, safety) <= 0:
        if "model.maxOutputTokens" not in explicit:
            output = new_model["maxOutputTokens"] = min(output, max(window // MAX_OUTPUT_SHARE, 1))
        if "compaction.safetyReserveTokens" not in explicit:
            safety = new_compaction["safetyReserveTokens"] = min(safety, window // SAFETY_SHARE)
    hard = hard_limit(window, output, safety)
    if hard <= 0:
        return merged  # the user's own figures cannot hold: refused in their terms
    if hard > 0:
        for key, share, value in (
            ("keepRecentTokens", KEEP_SHARE, keep),
            ("minTokensForAutoCompact", MIN_AUTO_SHARE, None),
            ("minReclaimableTokens", MIN_RECLAIMABLE_SHARE, None),
        ):
            value = figure(compaction, c_fields, key) if value is None else value
            if value is not None and value >= hard and f"compaction.{key}" not in explicit:
                new_compaction[key] = hard // share
    if new_model == model and new_compaction == compaction:
        return merged
    return {**merged, "model": new_model, "compaction": new_compaction}


def _set_in(refusal: Refusal, explicit: Mapping[str, str]) -> str:
    """` (in ~/proj/soba.json)`: the layer that set the refused key, when one did."""
    loc = refusal.loc
    layer = explicit.get(".".join(loc[:2])) if len(loc) >= 2 else None
    return f" (in {printable(layer)})" if layer else ""  # a file name may hold a newline


def load_config(
    notebook_dir: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    user_config: Path | None = None,
    system_config: Path | None = None,
) -> SobaConfig:
    """Load the layered configuration for a notebook folder.

    Each file layer is named by its path, so `set_by` (and `soba-nb doctor`) can say which
    file a setting came from. A missing system or user file is no layer; anything else
    standing there (a folder, a FIFO, bad JSON) is refused in one line."""
    environ = os.environ if environ is None else environ
    system_layers: list[tuple[str, Mapping[str, Any]]] = []
    layers: list[tuple[str, Mapping[str, Any]]] = []
    system_path = system_config_path(environ) if system_config is None else system_config
    system_name = shown(system_path if system_path is not None else SYSTEM_CONFIG_PATH)
    locked: tuple[str, ...] = ()
    if system_path is not None and os.path.lexists(system_path):
        system, locked = take_locks(system_name, read_config_file(system_path))
        system_layers.append((system_name, system))
    user_path = (user_config or USER_CONFIG_PATH).expanduser()
    if os.path.lexists(user_path):  # a folder or FIFO there is refused, not skipped
        layers.append((shown(user_path), read_config_file(user_path)))
    project = find_project_config(notebook_dir or Path.cwd())
    if project is not None:
        layers.append((shown(project), read_config_file(project)))
    layers.append(("environment", env_layer(environ)))
    if overrides:
        layers.append(("arguments", overrides))
    for name, layer in layers:
        refuse_locked(name, layer, system_name)
    held = with_implied(locked)
    layers, ignored = _apply_locks(layers, held, system_name, _env_names(environ))
    layers = system_layers + layers
    resolution = resolve_provider(layers, environ)
    if resolution.layer:
        layers.insert(0, (RESOLUTION_LAYER, resolution.layer))
    config = build_config(layers).record_origin(provider_source=resolution.explanation, provider_steps=resolution.steps)
    config.record_locks(
        {key: system_name if along is None else f"{system_name} (with {along})" for key, along in held.items()},
        tuple(ignored),
    )
    _embedded_runs_one_model(config)
    show_once(ignored)
    return config


def _env_names(environ: Mapping[str, str]) -> dict[str, str]:
    """`model.baseUrl` → `SOBA_BASE_URL`: the variables set, by the key each sets (several
    joined: `SOBA_BASE_URL, SOBA_MODEL_BASE_URL`), so a line can name the variable."""
    names: dict[str, list[str]] = {}
    for var, path in _ENV_KEYS.items():
        if var in environ:
            *parents, key = path
            dotted = ".".join([*parents, DEPRECATED_ALIASES.get(key, key)])
            names.setdefault(dotted, []).append(var)
    return {dotted: ", ".join(sorted(found)) for dotted, found in names.items()}


def _apply_locks(
    layers: list[tuple[str, Mapping[str, Any]]],
    locked: Mapping[str, str | None],
    system: str,
    env_names: Mapping[str, str],
) -> tuple[list[tuple[str, Mapping[str, Any]]], list[str]]:
    """The layers above the system one without what they set of a locked key (deprecated
    names first renamed, so an old name cannot slip past a lock), and one line per key each
    tried to set."""
    if not locked:
        return layers, []
    kept: list[tuple[str, Mapping[str, Any]]] = []
    ignored: list[str] = []
    for name, layer in layers:
        named = env_names if name == "environment" else None
        layer, lines = drop_locked(name, _apply_aliases(layer, name), locked, system, named)
        kept.append((name, layer))
        ignored += lines
    return kept, ignored


def _embedded_runs_one_model(config: SobaConfig) -> None:
    """The embedded provider runs one model, whatever `model.name` or `model.baseUrl` say: a
    name asked of it is that model's, and no address is, or the configuration is refused —
    SmolLM2's answer to `%soba --model gpt-4o` would read as gpt-4o's, and `"provider": "local"`
    beside the address of a llama.cpp server ("local" as in "my own server") would quietly
    not ask that server (when no key or server is configured the embedded model is chosen).
    The same holds for the summary model (`compaction.model`), whose provider may be
    `model`'s, inherited."""
    _one_embedded_model(config, config.model, "model", config.set_by("model.provider"))
    summary, given = config.summary_model, config.compaction.model
    if summary is None or given is None:
        return
    if given.provider is not None:
        chosen = config.set_by("compaction.model")
        _one_embedded_model(config, summary, "compaction.model", chosen)
        return
    _one_embedded_model(config, summary, "compaction.model", config.set_by("model.provider"), inherited=True)


def _one_embedded_model(
    config: SobaConfig, model: ModelSettings, where: str, chosen: str | None, *, inherited: bool = False
) -> None:
    """Refuse `model` (the settings at `where`) when its provider is `local` and it names
    another model or an address."""
    if model.provider != "local":
        return
    summary = where != "model"
    if model.base_url is not None:
        key, value = f"{where}.baseUrl", model.base_url
        rule = "which is no server at an address: a local server (llama.cpp, Ollama, vLLM) is provider 'openai'"
    elif model.name != EMBEDDED_MODEL_NAME:
        key, value = f"{where}.name", model.name
        rule = (
            "which runs no other model; another needs model.provider (openai or anthropic, with its key) "
            "or model.baseUrl (a server)"
        )
        if summary:
            rule = (
                "which runs no other model; another needs compaction.model.provider: 'openai' (with "
                "compaction.model.baseUrl for a server of your own) or 'anthropic', with its key"
            )
    else:
        return
    why = f"set in {printable(chosen)}" if chosen else "chosen because no provider, API key or server is configured"
    if inherited:
        why = f"model.provider, {why}"
    named = config.set_by(where if summary else key)
    raise ConfigError(
        f"invalid configuration: {key} = {json.dumps(value)}{f' (in {printable(named)})' if named else ''}: "
        f"the provider is 'local' ({why}), the embedded {EMBEDDED_MODEL_NAME}, {rule}"
    )


def system_config_path(environ: Mapping[str, str]) -> Path | None:
    """The admin's file: `SOBA_SYSTEM_CONFIG` when set (empty: no system layer), else
    `/etc/soba/config.json` (SPEC §13)."""
    named = environ.get(SYSTEM_CONFIG_ENV)
    if named is None:
        return SYSTEM_CONFIG_PATH
    return Path(named).expanduser() if named.strip() else None
