"""The configuration's keys (SPEC §3): one msgspec Struct per section, strict JSON types,
ranges that make sense (SPEC §12), camelCase JSON names.

Why msgspec, not pydantic (which the tool arguments and capsules use): every `soba-nb` command
that reads a session validates the configuration it recorded, and importing pydantic and
building these models cost a whole process several times what the command itself does
(docs/performance.md). msgspec is already imported to read the transcript."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType, field, to_builtins

from soba_nb.compaction.limits import (
    SAFETY_SHARE,
    hard_limit,
    soft_limit,
)
from soba_nb.config.errors import FieldProblem
from soba_nb.config.profiles import PROVIDER_PROFILES
from soba_nb.printable import printable
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


class Section(Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    """A section of keys: camelCase in JSON, snake_case in Python, unknown keys refused.

    Values from a file, the environment or a transcript are checked by `msgspec.convert`
    (`soba_nb.config._convert`); a section built in code is trusted for its types, and its
    own checks (`__post_init__`) run either way."""


def fields_of(cls: type[Struct]) -> dict[str, msgspec.structs.FieldInfo]:
    """A section's keys by their JSON (camelCase) name."""
    return {info.encode_name: info for info in msgspec.structs.fields(cls)}


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


Price = Annotated[float, Meta(ge=0, le=MAX_PRICE_PER_MTOK)]
"""US dollars per million tokens (NaN and infinity fail the bounds)."""
Tokens = Annotated[int, Meta(ge=0, le=MAX_CONTEXT_WINDOW)]
"""A count of tokens a setting may hold (0 included)."""
PositiveTokens = Annotated[int, Meta(gt=0, le=MAX_CONTEXT_WINDOW)]
Ratio = Annotated[float, Meta(gt=0, le=1)]


class PricingSettings(Section):
    """`model.pricing` (SPEC §3, §11): US dollars per million tokens; it overrides the model
    catalogue's prices."""

    input_per_m_tok: Price
    """`inputPerMTok`: input tokens not read from the provider's prompt cache."""
    output_per_m_tok: Price
    """`outputPerMTok`: answer tokens (reasoning tokens included, as the providers bill them)."""
    cached_input_per_m_tok: Price | None = None
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
    context_window: PositiveTokens = 128000
    """The model's context window in tokens."""
    max_output_tokens: PositiveTokens = 8000
    """Tokens reserved for the answer."""
    vision: bool | None = None
    """Whether the model takes images (null: the model catalogue decides by name)."""
    pricing: PricingSettings | None = None
    """What the model costs (null: the catalogue's prices, or none: SPEC §11)."""

    def __post_init__(self) -> None:
        for key, problem in (
            ("apiKeyEnv", api_key_env_problem(self.api_key_env)),
            ("baseUrl", None if self.base_url is None else base_url_problem(self.base_url)),
        ):
            if problem is not None:
                raise FieldProblem(key, problem)


class SummaryModelSettings(Section, omit_defaults=True):
    """`compaction.model` (SPEC §14): a model of its own that writes the summaries. What is not
    given comes from `model` — but a `provider` other than `model`'s starts from that
    provider's own defaults (its key variable, its public address, its profile's window), so
    one vendor's key is never sent to another's server; and `pricing` prices one model, so it
    is carried over only to the same model (otherwise the catalogue's price for this name).
    Encoded with the keys given only (what was not given is inherited, not set)."""

    name: str
    """Model name sent to the summary model's server (required)."""
    provider: ProviderName | None = None
    """null: `model.provider`."""
    base_url: str | None | UnsetType = UNSET
    """Absent: `model.baseUrl` (same provider); null: the provider's public default."""
    api_key_env: str | None = None
    """The environment variable holding this model's key (null: `model.apiKeyEnv`)."""
    context_window: PositiveTokens | None = None
    """Its window: the summary request is fitted to it (null: `model.contextWindow`)."""
    max_output_tokens: PositiveTokens | None = None
    """The most a summary may answer with (null: `model.maxOutputTokens`)."""
    pricing: PricingSettings | None = None
    """What it costs (null: `model.pricing` for the same model, else the catalogue's price)."""

    def __post_init__(self) -> None:
        base_url = self.base_url if isinstance(self.base_url, str) else None
        for key, problem in (
            ("name", "must not be empty" if not self.name.strip() else None),
            ("apiKeyEnv", None if self.api_key_env is None else api_key_env_problem(self.api_key_env)),
            ("baseUrl", None if base_url is None else base_url_problem(base_url)),
        ):
            if problem is not None:
                raise FieldProblem(key, problem)


def summary_model_settings(model: ModelSettings, summary: SummaryModelSettings) -> ModelSettings:
    """The summary model in full: `compaction.model`'s keys over what it inherits (see
    `SummaryModelSettings`)."""
    provider = summary.provider or model.provider
    if provider == model.provider:
        base = model
    else:
        profile = PROVIDER_PROFILES.get(provider, {}).get("model", {})
        base = msgspec.convert({**profile, "provider": provider}, ModelSettings)
    base_url = base.base_url if isinstance(summary.base_url, UnsetType) else summary.base_url
    same_model = (provider, base_url, summary.name) == (model.provider, model.base_url, model.name)
    return msgspec.structs.replace(
        base,
        provider=provider,
        name=summary.name,
        base_url=base_url,
        api_key_env=base.api_key_env if summary.api_key_env is None else summary.api_key_env,
        context_window=summary.context_window or base.context_window,
        max_output_tokens=summary.max_output_tokens or base.max_output_tokens,
        pricing=summary.pricing or (model.pricing if same_model else None),
    )


def summary_safety_reserve(context_window: int, max_output_tokens: int, safety_reserve_tokens: int) -> int:
    """The safety reserve of a summary request: `safetyReserveTokens`, or a sixteenth of the
    summary model's window when that much leaves no room (a small summary model beside a large
    main one: the reserve was set for the main model's window)."""
    if hard_limit(context_window, max_output_tokens, safety_reserve_tokens) > 0:
        return safety_reserve_tokens
    return context_window // SAFETY_SHARE


MAX_USER_REQUEST_TOKENS = 1_000_000
"""More than this for quoted requests is no capsule any window takes."""


class CompactionSettings(Section):
    """Compaction thresholds (SPEC §3 defaults)."""

    auto: bool = True
    """Soft triggers on; `hard_limit` and `context_overflow` ignore this."""
    compact_on_turn_complete: bool = True
    compact_on_milestone: bool = True
    min_tokens_for_auto_compact: Tokens = 32000
    min_reclaimable_tokens: Tokens = 12000
    min_savings_ratio: Ratio = 0.25
    keep_recent_tokens: Tokens = 20000
    safety_reserve_tokens: Tokens = 8192
    auto_compact_threshold_ratio: Ratio = 0.8
    timeout_ms: Annotated[int, Meta(gt=0, le=MAX_TIMEOUT_MS)] = 15000
    """Deadline for the model summary; after it the deterministic capsule is used."""
    user_request_tokens: Annotated[int, Meta(ge=0, le=MAX_USER_REQUEST_TOKENS)] = 4000
    """`userRequestTokens`: the user's requests a capsule quotes verbatim (SPEC §14), newest
    first, within this many tokens; older ones are clipped to their head and tail."""
    model: SummaryModelSettings | None = None
    """`compaction.model` (SPEC §14): the model that writes the summaries (null: `model`)."""


MAX_IMAGES_PER_REQUEST = 64
"""More images than this in one request is no setting any model takes."""


class NotebookSettings(Section):
    """The notebook as context (SPEC §10)."""

    context_tokens: Tokens = 2000
    """The cells run since the previous turn reach the model within this many tokens (0: off)."""
    max_images_per_request: Annotated[int, Meta(ge=0, le=MAX_IMAGES_PER_REQUEST)] = 4
    """The newest images a request carries to a model that takes images."""


ApprovalMode = Literal["never", "edits", "all"]


class AgentSettings(Section):
    """The user stays in control (SPEC §11)."""

    approval: ApprovalMode = "never"
    """Which tool calls ask first: `never`, `edits` (shell, write_file, edit_file) or `all`
    (python too)."""
    max_session_cost_usd: Annotated[float, Meta(ge=0, le=MAX_SESSION_COST_USD)] | None = None
    """`maxSessionCostUsd`: no request is sent that could take the session's cost past this
    many US dollars (null: no cap)."""


MCP_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
"""What an `mcpServers` name may be: it becomes part of its tools' names (`mcp__<name>__<tool>`)."""


class McpServerSettings(Section, omit_defaults=True):
    """One MCP tool server (SPEC §19): `command` (with `args`, `env`) runs it over stdio, or
    `url` reaches it over streamable HTTP. `env` values go to the server's process only: they
    may hold tokens, and are never shown or recorded (`SobaConfig.to_json`)."""

    command: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    url: str | None = None

    def problem(self) -> tuple[str, str] | None:
        """The key (relative to the server) and the rule it breaks, or None. Called by
        `SobaConfig`, so the refusal names the server: `mcpServers.time.command`."""
        if (self.command is None) == (self.url is None):
            return "command", "give either command (a stdio server) or url (streamable HTTP), not both or neither"
        if self.url is not None:
            if self.args or self.env:
                return "url", "a url server takes no args or env (those are for a command)"
            problem = base_url_problem(self.url)
            return None if problem is None else ("url", problem)
        if not (self.command or "").strip():
            return "command", "must name the program that runs the server"
        return None


ENV_NOT_RECORDED = "(not recorded)"
"""What a recorded configuration holds for an MCP server's `env` value."""


class SobaConfig(Section, dict=True):
    """The whole configuration, and where it came from (`set_by`, `provider_source`: kept
    beside the keys, never encoded with them)."""

    model: ModelSettings = field(default_factory=ModelSettings)
    compaction: CompactionSettings = field(default_factory=CompactionSettings)
    notebook: NotebookSettings = field(default_factory=NotebookSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    mcp_servers: dict[str, McpServerSettings] = field(default_factory=dict)
    """`mcpServers`: the MCP tool servers whose tools are offered beside soba's (SPEC §19)."""

    def __post_init__(self) -> None:
        self._provider_source = "defaults"
        self._provider_steps: tuple[str, ...] = ()
        self._explicit: dict[str, str] = {}
        self._locked: dict[str, str] = {}
        self._lock_notes: tuple[str, ...] = ()
        self._check_mcp_servers()
        hard = self.hard_limit
        if hard <= 0:
            raise ValueError(
                f"hardLimit = contextWindow - maxOutputTokens - safetyReserveTokens = {hard}; it must be > 0"
            )
        keep = self.compaction.keep_recent_tokens
        if keep >= hard:
            raise FieldProblem("compaction.keepRecentTokens", f"must be < hardLimit ({hard})")
        self._check_summary_window()

    def _check_summary_window(self) -> None:
        """The summary model's own window must leave room for a summary request after its
        answer and the safety reserve (`summary_safety_reserve`)."""
        given = self.compaction.model
        summary = self.summary_model
        if given is None or summary is None:
            return
        window, output = summary.context_window, summary.max_output_tokens
        safety = summary_safety_reserve(window, output, self.compaction.safety_reserve_tokens)
        if hard_limit(window, output, safety) > 0:
            return
        key = "maxOutputTokens" if given.max_output_tokens is not None or given.context_window is None else "contextWindow"
        raise FieldProblem(
            f"compaction.model.{key}",
            f"the summary model's window ({window:,}) leaves no room for a request after maxOutputTokens "
            f"({output:,}) and a safety reserve of {safety:,}",
        )

    def _check_mcp_servers(self) -> None:
        """Each server named within the rule for tool names, and either a command or a url.
        An `env` name is refused by itself alone: the values beside it are never shown."""
        for name, server in self.mcp_servers.items():
            if MCP_SERVER_NAME.fullmatch(name) is None:
                raise FieldProblem(
                    "mcpServers", f"server name {name[:40]!r} must be 1-40 letters, digits, _ or - (it names its tools)"
                )
            problem = server.problem()
            if problem is not None:
                raise FieldProblem(f"mcpServers.{name}.{problem[0]}", problem[1])
            bad = next((env for env in server.env if ENV_NAME.fullmatch(env) is None), None)
            if bad is not None:
                raise ValueError(f"mcpServers.{name}.env: {printable(bad[:40])!r} is not an environment variable name")

    @property
    def summary_model(self) -> ModelSettings | None:
        """The model that writes the summaries in full (SPEC §14), or None: `model` does."""
        given = self.compaction.model
        return None if given is None else summary_model_settings(self.model, given)

    def record_origin(
        self,
        explicit: dict[str, str] | None = None,
        provider_source: str | None = None,
        provider_steps: tuple[str, ...] | None = None,
    ) -> SobaConfig:
        """Note which layer set each key, and how the provider was chosen; returns self."""
        if explicit is not None:
            self._explicit = explicit
        if provider_source is not None:
            self._provider_source = provider_source
        if provider_steps is not None:
            self._provider_steps = provider_steps
        return self

    def record_locks(self, locked: dict[str, str], notes: tuple[str, ...]) -> SobaConfig:
        """Note the keys the admin locked (key → the system file; `… (with model.baseUrl)` for
        a key of the summary model held with it) and the one line for each
        setting of a later layer that was ignored for it (SPEC §16); returns self."""
        self._locked, self._lock_notes = dict(locked), notes
        return self

    @property
    def locked(self) -> dict[str, str]:
        """Each key the admin locked (`"model.baseUrl"`), and the file that locked it."""
        return dict(self._locked)

    @property
    def lock_notes(self) -> tuple[str, ...]:
        """One line per setting a later layer tried to give a locked key (ignored)."""
        return self._lock_notes

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
        data: dict[str, Any] = to_builtins(self)
        if not data.get("mcpServers"):  # none: as before SPEC §19 (a recorded configuration is unchanged)
            data.pop("mcpServers", None)
        for server in data.get("mcpServers", {}).values():  # values may be tokens: names only
            if server.get("env"):
                server["env"] = dict.fromkeys(server["env"], ENV_NOT_RECORDED)
        return data

    @property
    def explicit_keys(self) -> dict[str, str]:
        """Every key a user layer set, and the layer (see `set_by`)."""
        return dict(self._explicit)
