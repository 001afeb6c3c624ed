"""Configuration: the keys of SPEC §3, layered loading and one-line validation errors.

Layers, later wins: defaults → provider profile → `~/.soba/config.json` → nearest
`soba.json` (the notebook's folder or a parent) → `SOBA_*` environment → explicit
overrides (magic arguments). JSON keys are camelCase exactly as in the spec.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from soba_nb.compaction.limits import hard_limit, soft_limit
from soba_nb.paths import shown
from soba_nb.resolution import resolve_provider

ProviderName = Literal["openai", "anthropic", "local"]
ApiName = Literal["chat", "responses"]

USER_CONFIG_PATH = Path("~/.soba/config.json")
PROJECT_CONFIG_NAME = "soba.json"
ENV_PREFIX = "SOBA_"
DEPRECATED_ALIASES = {"backgroundTimeoutMs": "timeoutMs"}


class ConfigDeprecationWarning(DeprecationWarning):
    """A deprecated config key was used. Shown by default (see the filter below)."""


# DeprecationWarning is hidden outside __main__ by default; users must see this one.
warnings.filterwarnings("default", category=ConfigDeprecationWarning)


class ConfigError(ValueError):
    """A configuration value was refused. The message names key, value and rule."""


class _Section(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )


# Numeric fields are strict: in lax mode pydantic reads JSON `true` as 1 and "65000" as
# 65000, so `"timeoutMs": true` would silently become a 1 ms deadline.


class ModelSettings(_Section):
    """The active model definition."""

    provider: ProviderName = "openai"
    """Which wire format / runtime: "openai" (any OpenAI-compatible server), "anthropic", "local"."""
    name: str = "gpt-4o-mini"
    """Model name sent to the server."""
    api: ApiName = "chat"
    """For provider "openai": "chat" (Chat Completions, every OpenAI-compatible server) or
    "responses" (OpenAI's Responses API, which also compacts natively). Other providers
    have one API each and ignore it."""
    base_url: str | None = None
    """Server URL; null means the provider's public default."""
    api_key_env: str = "OPENAI_API_KEY"
    """Name of the environment variable holding the API key (the key itself is never stored)."""
    context_window: int = Field(128000, gt=0, strict=True)
    """The model's context window in tokens."""
    max_output_tokens: int = Field(8000, gt=0, strict=True)
    """Tokens reserved for the answer."""


class CompactionSettings(_Section):
    """Compaction thresholds (SPEC §3 defaults)."""

    auto: bool = True
    """Soft triggers on; `hard_limit` and `context_overflow` ignore this."""
    compact_on_turn_complete: bool = True
    compact_on_milestone: bool = True
    min_tokens_for_auto_compact: int = Field(32000, ge=0, strict=True)
    min_reclaimable_tokens: int = Field(12000, ge=0, strict=True)
    min_savings_ratio: float = Field(0.25, gt=0, le=1, strict=True)
    keep_recent_tokens: int = Field(20000, ge=0, strict=True)
    safety_reserve_tokens: int = Field(8192, ge=0, strict=True)
    auto_compact_threshold_ratio: float = Field(0.8, gt=0, le=1, strict=True)
    timeout_ms: int = Field(15000, gt=0, strict=True)
    """Deadline for the model summary; after it the deterministic capsule is used."""


class SobaConfig(_Section):
    """The whole configuration."""

    model: ModelSettings = Field(default_factory=lambda: ModelSettings())
    compaction: CompactionSettings = Field(default_factory=lambda: CompactionSettings())
    _provider_source: str = PrivateAttr(default="defaults")
    _provider_steps: tuple[str, ...] = PrivateAttr(default=())
    _explicit: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def provider_source(self) -> str:
        """How the provider was chosen (see `soba_nb.resolution`), for `%budget` and doctor."""
        return self._provider_source

    @property
    def provider_steps(self) -> tuple[str, ...]:
        """Each provider candidate looked at and why it was chosen or passed over."""
        return self._provider_steps

    def set_by(self, key: str) -> str | None:
        """Which layer set a key (`"model.contextWindow"`) explicitly: a config file's path,
        "environment" or "arguments"; None for defaults and provider profiles."""
        return self._explicit.get(key)

    @model_validator(mode="after")
    def _check_limits(self) -> SobaConfig:
        hard = self.hard_limit
        if hard <= 0:
            raise ValueError(
                f"hardLimit = contextWindow - maxOutputTokens - safetyReserveTokens = {hard}; it must be > 0"
            )
        keep = self.compaction.keep_recent_tokens
        if keep >= hard:
            raise ValueError(f"compaction.keepRecentTokens = {keep}; it must be < hardLimit ({hard})")
        return self

    @property
    def hard_limit(self) -> int:
        return hard_limit(
            self.model.context_window,
            self.model.max_output_tokens,
            self.compaction.safety_reserve_tokens,
        )

    @property
    def soft_limit(self) -> int:
        c = self.compaction
        return soft_limit(self.hard_limit, c.min_tokens_for_auto_compact, c.auto_compact_threshold_ratio)

    def to_json(self) -> dict[str, Any]:
        """The configuration as spec-shaped camelCase JSON (no secrets: keys live in env vars)."""
        return self.model_dump(by_alias=True, mode="json")

    @property
    def explicit_keys(self) -> dict[str, str]:
        """Every key a user layer set, and the layer (see `set_by`)."""
        return dict(self._explicit)

    @classmethod
    def from_recorded(cls, data: Mapping[str, Any], explicit: Mapping[str, str], provider_source: str) -> SobaConfig:
        """A configuration as a session recorded it (`ConfigEntry`)."""
        config = cls.model_validate(data)
        config._explicit = dict(explicit)
        config._provider_source = provider_source
        return config


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


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a JSON object")
    return data


def find_project_config(start: Path) -> Path | None:
    """The `soba.json` in `start` or its nearest parent holding one."""
    start = start.resolve()
    for folder in (start, *start.parents):
        candidate = folder / PROJECT_CONFIG_NAME
        if candidate.is_file():
            return candidate
    return None


def _env_keys() -> dict[str, tuple[str, str]]:
    """`SOBA_<SECTION>_<FIELD>` for every key, e.g. `SOBA_COMPACTION_TIMEOUT_MS`."""
    sections: tuple[tuple[str, type[_Section]], ...] = (("model", ModelSettings), ("compaction", CompactionSettings))
    keys: dict[str, tuple[str, str]] = {}
    for section_name, section in sections:
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
    """
    layer: dict[str, Any] = {}
    for var, (section, key) in _ENV_KEYS.items():
        if var not in environ:
            continue
        raw = environ[var]
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        layer.setdefault(section, {})[key] = value
    return layer


def _one_line(exc: ValidationError, merged: Mapping[str, Any]) -> str:
    """The first pydantic error as `key = value: rule`."""
    err = exc.errors()[0]
    loc = [str(part) for part in err["loc"]]
    value: Any = merged
    for part in loc:
        value = value.get(part) if isinstance(value, Mapping) else None
    # A key is shown as JSON when it is not a plain name (a newline in it must not break the line).
    key = ".".join(part if part.isidentifier() else json.dumps(part) for part in loc) if loc else "config"
    rule = " ".join(str(err["msg"]).split())
    if err["type"] == "extra_forbidden":
        return f"{key}: unknown key (value {_clip(json.dumps(value, default=str))}); {_known_keys(loc)}"
    if err["type"] == "value_error":
        return rule.removeprefix("Value error, ")
    if err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return f"{key} = {_clip(json.dumps(value, default=str))}: must be a JSON object"
    return f"{key} = {_clip(json.dumps(value, default=str))}: {rule.lower()}"


VALUE_SHOWN_CHARS = 80


def _clip(text: str) -> str:
    return text if len(text) <= VALUE_SHOWN_CHARS else text[: VALUE_SHOWN_CHARS - 1] + "…"


def _known_keys(loc: list[str]) -> str:
    """The keys that may stand where an unknown one was found."""
    sections: dict[str, type[_Section]] = {"model": ModelSettings, "compaction": CompactionSettings}
    if len(loc) >= 2 and loc[0] in sections:
        names = [field.alias or name for name, field in sections[loc[0]].model_fields.items()]
        return f"known keys in {loc[0]}: {', '.join(names)}"
    return "the top level has model and compaction"


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
    try:
        config = SobaConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {_one_line(exc, merged)}") from None
    config._explicit = _explicit_keys(renamed)
    return config


def load_config(
    notebook_dir: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    user_config: Path | None = None,
) -> SobaConfig:
    """Load the layered configuration for a notebook folder."""
    environ = os.environ if environ is None else environ
    layers: list[tuple[str, Mapping[str, Any]]] = []
    user_path = (user_config or USER_CONFIG_PATH).expanduser()
    if user_path.is_file():
        layers.append((shown(user_path), _read_json(user_path)))
    project = find_project_config(notebook_dir or Path.cwd())
    if project is not None:
        layers.append((shown(project), _read_json(project)))
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
