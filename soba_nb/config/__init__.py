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
from typing import Any

from pydantic import ValidationError

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
from soba_nb.config.files import MAX_CONFIG_BYTES as MAX_CONFIG_BYTES  # re-exported
from soba_nb.config.files import MAX_CONFIG_DEPTH, depth, read_config_file
from soba_nb.config.files import find_project_config as find_project_config  # re-exported
from soba_nb.config.settings import MAX_CONTEXT_WINDOW as MAX_CONTEXT_WINDOW  # re-exported
from soba_nb.config.settings import MAX_TIMEOUT_MS as MAX_TIMEOUT_MS  # re-exported
from soba_nb.config.settings import AgentSettings as AgentSettings  # re-exported
from soba_nb.config.settings import CompactionSettings as CompactionSettings  # re-exported
from soba_nb.config.settings import ModelSettings as ModelSettings  # re-exported
from soba_nb.config.settings import NotebookSettings as NotebookSettings  # re-exported
from soba_nb.config.settings import PricingSettings as PricingSettings  # re-exported
from soba_nb.config.settings import Section
from soba_nb.config.settings import SobaConfig as SobaConfig  # re-exported
from soba_nb.layout import SYSTEM_CONFIG_ENV, SYSTEM_CONFIG_PATH, USER_CONFIG_PATH
from soba_nb.paths import shown
from soba_nb.printable import printable
from soba_nb.redact import is_secret_name, redact
from soba_nb.resolution import resolve_provider
from soba_nb.text import clip

ENV_PREFIX = "SOBA_"


DEPRECATED_ALIASES = {"backgroundTimeoutMs": "timeoutMs"}


# The embedded model is tiny (8192-token window): the spec's defaults would give a negative
# hard limit, so a local model starts from its own profile unless the user sets the keys.
PROVIDER_PROFILES: dict[str, dict[str, Any]] = {
    "local": {
        "model": {
            "name": "SmolLM2-135M-Instruct",
            "apiKeyEnv": "",
            "contextWindow": 8192,
            "maxOutputTokens": 512,
        },
        "compaction": {
            "minTokensForAutoCompact": 3000,
            "minReclaimableTokens": 1000,
            "keepRecentTokens": 1500,
            "safetyReserveTokens": 512,
            "timeoutMs": 8000,
        },
    },
    "anthropic": {
        "model": {
            "name": "claude-sonnet-4-5",
            "apiKeyEnv": "ANTHROPIC_API_KEY",
            "contextWindow": 200000,
            "maxOutputTokens": 8000,
        }
    },
}


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
_NESTED: dict[tuple[str, str], type[Section]] = {("model", "pricing"): PricingSettings}
"""Keys whose value is an object of keys of its own."""


def _env_keys() -> dict[str, tuple[str, str]]:
    """`SOBA_<SECTION>_<FIELD>` for every key, e.g. `SOBA_COMPACTION_TIMEOUT_MS`."""
    keys: dict[str, tuple[str, str]] = {}
    for section_name, section in _SECTIONS.items():
        for field_name, field in section.model_fields.items():
            keys[f"{ENV_PREFIX}{section_name.upper()}_{field_name.upper()}"] = (section_name, field.alias or field_name)
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
    """`SOBA_MODEL_CONTEXT_WINDOW=65000`, `SOBA_COMPACTION_AUTO=false`, `SOBA_MODEL=...`.

    Values are parsed as JSON when they parse (numbers, booleans, null), else kept as text.
    Each is checked against its key here, so a refusal names the variable
    (`SOBA_COMPACTION_AUTO=yes` is not a boolean: only `true` and `false` are)."""
    layer: dict[str, Any] = {}
    for var, (section, key) in _ENV_KEYS.items():
        if var not in environ:
            continue
        raw = environ[var]
        try:
            value: Any = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON (or absurdly deep or long): text
            value = raw
        _check_env_value(var, section, key, value)
        layer.setdefault(section, {})[key] = value
    return layer


def _check_env_value(var: str, section: str, key: str, value: Any) -> None:
    """Validate one variable's value against its key alone (figures that must agree with
    each other are checked once every layer is merged)."""
    key = DEPRECATED_ALIASES.get(key, key)
    if depth(value) > MAX_CONFIG_DEPTH:
        raise ConfigError(f"invalid configuration: {var}: nested too deeply (more than {MAX_CONFIG_DEPTH} levels)")
    try:
        _SECTIONS[section].model_validate({key: value})
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {var}: {_one_line(exc, {section: {key: value}}, (section,))}") from None


def _one_line(exc: ValidationError, merged: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> str:
    """The first pydantic error as `key = value: rule` (`prefix`: where the validated model sits)."""
    err = exc.errors()[0]
    loc = [*prefix, *(str(part) for part in err["loc"])]
    value: Any = merged
    for part in loc:
        value = value.get(part) if isinstance(value, Mapping) else None
    # A key is shown as JSON when it is not a plain name (a newline in it must not break the line).
    key = ".".join(part if part.isidentifier() else json.dumps(part) for part in loc) if loc else "config"
    rule = " ".join(str(err["msg"]).split())
    if err["type"] == "extra_forbidden":
        if loc and is_secret_name(loc[-1]):
            return (
                f"{key}: unknown key (its value is not shown: the key names a secret; a key is read only "
                f"from the environment variable model.apiKeyEnv names); {_known_keys(loc)}"
            )
        return f"{key}: unknown key (value {_shown_value(value)}); {_known_keys(loc)}"
    if err["type"] == "value_error":
        rule = rule.removeprefix("Value error, ")
        # A field's own check (baseUrl) gets the key and value; the limits check words its own.
        return f"{_key_and_value(key, loc, value)}: {rule}" if loc else rule
    if err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return f"{_key_and_value(key, loc, value)}: must be a JSON object"
    if err["type"] == "missing":
        return f"{key}: required"
    return f"{_key_and_value(key, loc, value)}: {rule.lower()}"


VALUE_SHOWN_CHARS = 80


def _shown_value(value: Any) -> str:
    """A value as a configuration error shows it: JSON, redacted, then clipped. The error is
    shown in a cell's output, which the notebook file keeps: a secret written where a setting
    belongs (a key pasted into `contextWindow`, a password in `baseUrl`) must not be echoed,
    nor anything under a key that names a secret."""
    return clip(redact(json.dumps(value, default=str)), VALUE_SHOWN_CHARS)


def _key_and_value(key: str, loc: Sequence[str], value: Any) -> str:
    """`key = value` for an error, or `key (value not shown)` under a key that names a secret."""
    if any(is_secret_name(part) for part in loc):
        return f"{key} (value not shown)"
    return f"{key} = {_shown_value(value)}"


def _known_keys(loc: list[str]) -> str:
    """The keys that may stand where an unknown one was found."""
    nested = _NESTED.get((loc[0], loc[1])) if len(loc) >= 3 else None
    if nested is not None:
        names = [field.alias or name for name, field in nested.model_fields.items()]
        return f"known keys in {loc[0]}.{loc[1]}: {', '.join(names)}"
    if len(loc) >= 2 and loc[0] in _SECTIONS:
        names = [field.alias or name for name, field in _SECTIONS[loc[0]].model_fields.items()]
        return f"known keys in {loc[0]}: {', '.join(names)}"
    return f"the top level has {', '.join(_SECTIONS)}"


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
        config = SobaConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"the recorded configuration is refused: {_one_line(exc, data)}") from None
    config._explicit = dict(explicit)
    config._provider_source = provider_source
    return config


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
        config = SobaConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {_one_line(exc, merged)}{_set_in(exc, explicit)}") from None
    config._explicit = explicit
    return config


def _fit_unset(merged: dict[str, Any], explicit: Mapping[str, str]) -> dict[str, Any]:
    """Figures the user did not set give way when they cannot hold in the window the user did
    set: `{"model": {"contextWindow": 8192}}` alone met the default safetyReserveTokens of
    8,192 (hardLimit -8,000) and keepRecentTokens of 20,000, and was refused. Only the figures
    that cannot hold are scaled (to their share of the window, as `soba_nb.window` does for a
    window learned later), never one a user layer gave: those are refused with the rule."""
    model = merged.get("model") if isinstance(merged.get("model"), Mapping) else {}
    compaction = merged.get("compaction") if isinstance(merged.get("compaction"), Mapping) else {}
    assert isinstance(model, Mapping) and isinstance(compaction, Mapping)

    def figure(section: Mapping[str, Any], fields: Mapping[str, Any], key: str, name: str) -> int | None:
        value = section.get(key, fields[name].default)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    m_fields, c_fields = ModelSettings.model_fields, CompactionSettings.model_fields
    window = figure(model, m_fields, "contextWindow", "context_window")
    output = figure(model, m_fields, "maxOutputTokens", "max_output_tokens")
    safety = figure(compaction, c_fields, "safetyReserveTokens", "safety_reserve_tokens")
    keep = figure(compaction, c_fields, "keepRecentTokens", "keep_recent_tokens")
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
        for key, name, share, value in (
            ("keepRecentTokens", "keep_recent_tokens", KEEP_SHARE, keep),
            ("minTokensForAutoCompact", "min_tokens_for_auto_compact", MIN_AUTO_SHARE, None),
            ("minReclaimableTokens", "min_reclaimable_tokens", MIN_RECLAIMABLE_SHARE, None),
        ):
            value = figure(compaction, c_fields, key, name) if value is None else value
            if value is not None and value >= hard and f"compaction.{key}" not in explicit:
                new_compaction[key] = hard // share
    if new_model == model and new_compaction == compaction:
        return merged
    return {**merged, "model": new_model, "compaction": new_compaction}


def _set_in(exc: ValidationError, explicit: Mapping[str, str]) -> str:
    """` (in ~/proj/soba.json)`: the layer that set the refused key, when one did."""
    loc = exc.errors()[0]["loc"]
    layer = explicit.get(".".join(str(part) for part in loc[:2])) if len(loc) >= 2 else None
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
    layers: list[tuple[str, Mapping[str, Any]]] = []
    system_path = system_config_path(environ) if system_config is None else system_config
    if system_path is not None and os.path.lexists(system_path):
        layers.append((shown(system_path), read_config_file(system_path)))
    user_path = (user_config or USER_CONFIG_PATH).expanduser()
    if os.path.lexists(user_path):  # a folder or FIFO there is refused, not skipped
        layers.append((shown(user_path), read_config_file(user_path)))
    project = find_project_config(notebook_dir or Path.cwd())
    if project is not None:
        layers.append((shown(project), read_config_file(project)))
    layers.append(("environment", env_layer(environ)))
    if overrides:
        layers.append(("arguments", overrides))
    resolution = resolve_provider(layers, environ)
    if resolution.layer:
        layers.insert(0, (RESOLUTION_LAYER, resolution.layer))
    config = build_config(layers)
    config._provider_source = resolution.explanation
    config._provider_steps = resolution.steps
    return config


def system_config_path(environ: Mapping[str, str]) -> Path | None:
    """The admin's file: `SOBA_SYSTEM_CONFIG` when set (empty: no system layer), else
    `/etc/soba/config.json` (SPEC §13)."""
    named = environ.get(SYSTEM_CONFIG_ENV)
    if named is None:
        return SYSTEM_CONFIG_PATH
    return Path(named).expanduser() if named.strip() else None
