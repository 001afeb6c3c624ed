"""Configuration: the keys of SPEC §3, layered loading and one-line validation errors.

Layers, later wins: defaults → provider profile → `~/.soba/config.json` → nearest
`soba.json` (the notebook's folder or a parent) → `SOBA_*` environment → explicit
overrides (magic arguments). JSON keys are camelCase exactly as in the spec.
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from soba_nb.compaction.limits import (
    KEEP_SHARE,
    MAX_OUTPUT_SHARE,
    MIN_AUTO_SHARE,
    MIN_RECLAIMABLE_SHARE,
    SAFETY_SHARE,
    hard_limit,
    soft_limit,
)
from soba_nb.layout import PROJECT_CONFIG_NAME, USER_CONFIG_PATH
from soba_nb.paths import shown
from soba_nb.printable import printable
from soba_nb.resolution import resolve_provider

ProviderName = Literal["openai", "anthropic", "local"]
ApiName = Literal["chat", "responses"]

ENV_PREFIX = "SOBA_"
DEPRECATED_ALIASES = {"backgroundTimeoutMs": "timeoutMs"}

MAX_CONTEXT_WINDOW = 100_000_000
"""No model comes near this many tokens (SPEC §12): a larger window, or any token figure
above it, is a typo or a broken answer, never a setting. Server figures obey it too."""
MAX_TIMEOUT_MS = 3_600_000
"""An hour: the longest a summary may be waited for. Beyond it the deadline means "never",
and a timer that large overflows the platform's wait call."""
BASE_URL_SCHEMES = frozenset({"http", "https"})
"""The only schemes a model server is spoken to over (httpx would refuse the rest per request)."""
MAX_CONFIG_BYTES = 1024 * 1024
"""A configuration is a few hundred bytes; a larger file is not one, and `/dev/zero` must
not be read forever."""
MAX_CONFIG_DEPTH = 16
"""The deepest key is two levels down (`compaction.timeoutMs`); deeper nesting is not a
configuration, and nesting thousands deep would exhaust the parser's recursion."""


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


# Numeric and boolean fields are strict: in lax mode pydantic reads JSON `true` as 1,
# "65000" as 65000 and "yes" or "on" as true, so `"timeoutMs": true` would silently become a
# 1 ms deadline, while "ja" or "enabled" would be refused: a user cannot tell which words
# work (SPEC §12: booleans are JSON booleans).


def base_url_problem(url: str) -> str | None:
    """Why `url` cannot be a model server's base URL (None when it can)."""
    if any(char.isspace() or not char.isprintable() for char in url):
        return "must not contain spaces or control characters"
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port that is not a number in 0-65535 raises here
    except ValueError:
        return "is not a valid URL"
    if parts.scheme.lower() not in BASE_URL_SCHEMES:
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "must name a host (http://HOST[:PORT]/...)"
    return None


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
    """Server URL (http or https only); null means the provider's public default."""
    api_key_env: str = "OPENAI_API_KEY"
    """Name of the environment variable holding the API key (the key itself is never stored)."""
    context_window: int = Field(128000, gt=0, le=MAX_CONTEXT_WINDOW, strict=True)
    """The model's context window in tokens."""
    max_output_tokens: int = Field(8000, gt=0, le=MAX_CONTEXT_WINDOW, strict=True)
    """Tokens reserved for the answer."""

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        problem = None if value is None else base_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class CompactionSettings(_Section):
    """Compaction thresholds (SPEC §3 defaults)."""

    auto: bool = Field(True, strict=True)
    """Soft triggers on; `hard_limit` and `context_overflow` ignore this."""
    compact_on_turn_complete: bool = Field(True, strict=True)
    compact_on_milestone: bool = Field(True, strict=True)
    min_tokens_for_auto_compact: int = Field(32000, ge=0, le=MAX_CONTEXT_WINDOW, strict=True)
    min_reclaimable_tokens: int = Field(12000, ge=0, le=MAX_CONTEXT_WINDOW, strict=True)
    min_savings_ratio: float = Field(0.25, gt=0, le=1, strict=True)
    keep_recent_tokens: int = Field(20000, ge=0, le=MAX_CONTEXT_WINDOW, strict=True)
    safety_reserve_tokens: int = Field(8192, ge=0, le=MAX_CONTEXT_WINDOW, strict=True)
    auto_compact_threshold_ratio: float = Field(0.8, gt=0, le=1, strict=True)
    timeout_ms: int = Field(15000, gt=0, le=MAX_TIMEOUT_MS, strict=True)
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
        """A configuration as a session recorded it (`ConfigEntry`); a `ConfigError` when
        today's rules refuse it (a transcript is data, and may be hand-edited)."""
        try:
            config = cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(f"the recorded configuration is refused: {_one_line(exc, data)}") from None
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


_FILE_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_a_file(path: Path, mode: int) -> ConfigError | None:
    """The refusal for anything but a regular file (links are followed to their target)."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
    return ConfigError(f"{path}: cannot read config file: it is {kind}, not a JSON file")


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, refusing what is not a small regular file without waiting on it.

    `stat` first, so a FIFO is never opened (an open for reading blocks until a writer
    comes); the open is non-blocking all the same and checked again, as the name may be
    replaced in between. At most `MAX_CONFIG_BYTES` are read, so a file that never ends
    (`/dev/zero` behind a link, a growing log) ends here."""
    try:
        refusal = _not_a_file(path, os.stat(path).st_mode)
        if refusal is not None:
            raise refusal
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        refusal = _not_a_file(path, info.st_mode)
        if refusal is not None:
            raise refusal
        data = b"" if info.st_size > MAX_CONFIG_BYTES else file.read(MAX_CONFIG_BYTES + 1)
    if info.st_size > MAX_CONFIG_BYTES or len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: config file is larger than {MAX_CONFIG_BYTES:,} bytes; not a configuration")
    return data


def _depth(value: Any) -> int:
    """How deeply `value` nests (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            if deepest > MAX_CONFIG_DEPTH:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _read_json(path: Path) -> dict[str, Any]:
    data = _read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None

    def not_a_number(name: str) -> Any:
        # Python's json reads NaN and Infinity, which are not JSON and no figure can be.
        raise ConfigError(f"{path}: not valid JSON ({name} is not a JSON number)")

    too_deep = ConfigError(f"{path}: nested too deeply (more than {MAX_CONFIG_DEPTH} levels); not a configuration")
    try:
        parsed = json.loads(text, parse_constant=not_a_number)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise too_deep from None
    except ConfigError:
        raise
    except ValueError:  # an integer of thousands of digits: Python refuses to convert it
        raise ConfigError(f"{path}: a number in it has too many digits to be a setting") from None
    if _depth(parsed) > MAX_CONFIG_DEPTH:
        raise too_deep
    if not isinstance(parsed, dict):
        raise ConfigError(f"{path}: the top level must be a JSON object")
    return parsed


def find_project_config(start: Path) -> Path | None:
    """The `soba.json` in `start` or its nearest parent holding one.

    Whatever stands under that name counts (a folder, a FIFO, a link to a device): it is
    refused when read, rather than skipped for a parent's file or the defaults (SPEC §12)."""
    start = start.resolve()
    for folder in (start, *start.parents):
        candidate = folder / PROJECT_CONFIG_NAME
        if os.path.lexists(candidate):
            return candidate
    return None


_SECTIONS: dict[str, type[_Section]] = {"model": ModelSettings, "compaction": CompactionSettings}


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
    if _depth(value) > MAX_CONFIG_DEPTH:
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
        return f"{key}: unknown key (value {_clip(json.dumps(value, default=str))}); {_known_keys(loc)}"
    if err["type"] == "value_error":
        rule = rule.removeprefix("Value error, ")
        # A field's own check (baseUrl) gets the key and value; the limits check words its own.
        return f"{key} = {_clip(json.dumps(value, default=str))}: {rule}" if loc else rule
    if err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return f"{key} = {_clip(json.dumps(value, default=str))}: must be a JSON object"
    return f"{key} = {_clip(json.dumps(value, default=str))}: {rule.lower()}"


VALUE_SHOWN_CHARS = 80


def _clip(text: str) -> str:
    return text if len(text) <= VALUE_SHOWN_CHARS else text[: VALUE_SHOWN_CHARS - 1] + "…"


def _known_keys(loc: list[str]) -> str:
    """The keys that may stand where an unknown one was found."""
    if len(loc) >= 2 and loc[0] in _SECTIONS:
        names = [field.alias or name for name, field in _SECTIONS[loc[0]].model_fields.items()]
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
) -> SobaConfig:
    """Load the layered configuration for a notebook folder."""
    environ = os.environ if environ is None else environ
    layers: list[tuple[str, Mapping[str, Any]]] = []
    user_path = (user_config or USER_CONFIG_PATH).expanduser()
    if os.path.lexists(user_path):  # a folder or FIFO there is refused, not skipped
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
