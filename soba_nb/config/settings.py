"""The configuration's keys (SPEC §3): one pydantic model per section, strict types, ranges
that make sense (SPEC §12), camelCase JSON names."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from soba_nb.compaction.limits import (
    hard_limit,
    soft_limit,
)
from soba_nb.redact import redact

ProviderName = Literal["openai", "anthropic", "local"]


ApiName = Literal["chat", "responses"]


MAX_CONTEXT_WINDOW = 100_000_000
"""No model comes near this many tokens (SPEC §12): a larger window, or any token figure
above it, is a typo or a broken answer, never a setting. Server figures obey it too."""


MAX_TIMEOUT_MS = 3_600_000
"""An hour: the longest a summary may be waited for. Beyond it the deadline means "never",
and a timer that large overflows the platform's wait call."""


BASE_URL_SCHEMES = frozenset({"http", "https"})
"""The only schemes a model server is spoken to over (httpx would refuse the rest per request)."""


class Section(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
"""What `model.apiKeyEnv` may hold: a shell's environment variable name."""


def api_key_env_problem(name: str) -> str | None:
    """Why `name` cannot be `model.apiKeyEnv` (None when it can; empty: no key is sent). A key
    pasted there instead of its variable's name is refused before anything shows or records it."""
    if name and (ENV_NAME.fullmatch(name) is None or redact(name, {}) != name or _looks_random(name)):
        return (
            "must be the name of the environment variable that holds the key (letters, digits and _), "
            "not the key itself"
        )
    return None


KEY_LIKE_CHARS = 24
"""A name longer than this that mixes cases and digits is taken for a key (`_looks_random`)."""


def _looks_random(name: str) -> bool:
    """A long name mixing lower case, upper case and digits is a key (`sk_live_51Hx…`,
    `AIzaSy…`), not a variable's name (`OPENAI_API_KEY`, `TeamKey2`)."""
    return len(name) > KEY_LIKE_CHARS and not name.isupper() and not name.islower() and any(c.isdigit() for c in name)


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


MAX_PRICE_PER_MTOK = 100_000.0
"""US dollars per million tokens: no model is priced near this; a larger figure is a typo."""


MAX_SESSION_COST_USD = 1_000_000.0
"""The largest session cap accepted (a larger one is a typo, or no cap: use null)."""


class PricingSettings(Section):
    """`model.pricing` (SPEC §3, §11): US dollars per million tokens; it overrides the model
    catalogue's prices."""

    input_per_m_tok: float = Field(ge=0, le=MAX_PRICE_PER_MTOK, strict=True, allow_inf_nan=False)
    """`inputPerMTok`: input tokens not read from the provider's prompt cache."""
    output_per_m_tok: float = Field(ge=0, le=MAX_PRICE_PER_MTOK, strict=True, allow_inf_nan=False)
    """`outputPerMTok`: answer tokens (reasoning tokens included, as the providers bill them)."""
    cached_input_per_m_tok: float | None = Field(
        None, ge=0, le=MAX_PRICE_PER_MTOK, strict=True, allow_inf_nan=False
    )
    """`cachedInputPerMTok`: input tokens read from the prompt cache; null: priced as input."""


class ModelSettings(Section):
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
    vision: bool | None = Field(None, strict=True)
    """Whether the model takes images (null: the model catalogue decides by name)."""
    pricing: PricingSettings | None = None
    """What the model costs (null: the catalogue's prices, or none: SPEC §11)."""

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str) -> str:
        problem = api_key_env_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        problem = None if value is None else base_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class CompactionSettings(Section):
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


MAX_IMAGES_PER_REQUEST = 64
"""More images than this in one request is no setting any model takes."""


class NotebookSettings(Section):
    """The notebook as context (SPEC §10)."""

    context_tokens: int = Field(2000, ge=0, le=MAX_CONTEXT_WINDOW, strict=True)
    """The cells run since the previous turn reach the model within this many tokens (0: off)."""
    max_images_per_request: int = Field(4, ge=0, le=MAX_IMAGES_PER_REQUEST, strict=True)
    """The newest images a request carries to a model that takes images."""


ApprovalMode = Literal["never", "edits", "all"]


class AgentSettings(Section):
    """The user stays in control (SPEC §11)."""

    approval: ApprovalMode = "never"
    """Which tool calls ask first: `never`, `edits` (shell, write_file, edit_file) or `all`
    (python too)."""
    max_session_cost_usd: float | None = Field(
        None, ge=0, le=MAX_SESSION_COST_USD, strict=True, allow_inf_nan=False
    )
    """`maxSessionCostUsd`: no request is sent that could take the session's cost past this
    many US dollars (null: no cap)."""


class SobaConfig(Section):
    """The whole configuration."""

    model: ModelSettings = Field(default_factory=lambda: ModelSettings())
    compaction: CompactionSettings = Field(default_factory=lambda: CompactionSettings())
    notebook: NotebookSettings = Field(default_factory=lambda: NotebookSettings())
    agent: AgentSettings = Field(default_factory=lambda: AgentSettings())
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

