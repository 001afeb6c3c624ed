"""What a session costs (SPEC §11): every `usage` entry priced, the cost line, and the cap.

Prices: `model.pricing`; else the catalogue's list prices (`catalogue.list_price`, as of
`PRICES_TAKEN`) when the requests go to the vendor's own API (an OpenAI model at OpenAI's,
a Claude model at Anthropic's); the embedded model costs nothing. Any other model — a local
server, a gateway (its bill is its own), a model the catalogue does not name — is not priced
until `model.pricing` says so.

Which prices a `usage` entry gets: those of the configuration in effect when it was recorded
(the latest `config` entry before it in the file), so a resumed session shows the same cost.
An entry recorded while its model had no price is priced once `model.pricing` prices that
same model (provider, baseUrl and name). Every branch of the file counts: a rewind does not
give back what a request cost. A request cut short (cancelled by the user, failed) reports no
usage and is not counted. A compaction request the deadline (`compaction.timeoutMs`) cut off
was sent all the same: it is priced for what was sent (and the characters received so far),
marked `estimated` (SPEC §16).

A request whose server sent no usage figures (one that ignores `stream_options.include_usage`)
is recorded with soba's own counts — the request's counted input, the answer's text and tool
call arguments counted with the session's counter — as a `usage` entry marked `estimated`. Those are
priced like any other (so the cap holds without usage figures), and the cost line says how many
requests were estimated.

The arithmetic is decimal: prices are decimal numbers (a JSON float through its shortest
repr, so 2.5 is exactly 2.5), token counts integers, and
cost = (uncached input × inputPerMTok + cached input × cachedInputPerMTok + output ×
outputPerMTok) / 10^6 exactly ("input" in SPEC §11's formula is the input not read from the
cache: the providers' input figures include the cached part). Only the display rounds, to
`SHOWN_PLACES`: half up, and a worst case up, so the cap's refusal never shows a figure
below what the request could reach. Anthropic's cache writes are priced as input (they cost
1.25× input at Anthropic: `model.pricing` has no key for them).

A summary model of its own (`compaction.model`, SPEC §14) is priced as its own model: the
`compaction` requests of a configuration that names one are priced at its prices
(`compaction.model.pricing`, else the catalogue's for its name), never at the main model's.

The cap (`agent.maxSessionCostUsd`) is checked before every request leaves, inference and
compaction alike: the session's cost so far plus the request's worst case (its input tokens
as if none were cached, and its maxOutputTokens, at the model's prices) must not pass it.
Fail-closed: with a cap set, a model without prices (or a session with requests that are not
priced) sends nothing, because what it would cost cannot be known.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import ROUND_HALF_UP, ROUND_UP, Decimal
from itertools import islice
from typing import Any
from urllib.parse import urlsplit

import msgspec
from msgspec import Struct, field

from soba_nb.catalogue import PRICES_TAKEN, list_price
from soba_nb.compaction.summarizer import RequestNotSent
from soba_nb.config import ModelSettings, SobaConfig
from soba_nb.config.settings import SummaryModelSettings, summary_model_settings
from soba_nb.transcript.entries import ConfigEntry, Entry, UsageEntry, UsageOperation
from soba_nb.transcript.store import Transcript

MILLION = Decimal(1_000_000)
SHOWN_PLACES = Decimal("0.0001")
"""Dollars are shown to four decimals (`$0.0123`)."""
EMBEDDED_PROVIDER = "local"
EMBEDDED_SOURCE = "embedded model, free"
VENDOR_HOSTS = {"openai": "api.openai.com", "anthropic": "api.anthropic.com"}
"""Where the catalogue's list prices apply: the vendor's own API (no baseUrl, or this host)."""
CAP_KEY = "agent.maxSessionCostUsd"
CAP_ENV = "SOBA_AGENT_MAX_SESSION_COST_USD"
OPERATIONS: tuple[UsageOperation, ...] = ("inference", "compaction")


class CostCapExceeded(RequestNotSent):
    """The request would take the session past `agent.maxSessionCostUsd`: not sent."""


def decimal_of(value: float) -> Decimal:
    """A configured figure as the decimal number it was written as (2.5 → 2.5, not the float)."""
    return Decimal(repr(value))


class Prices(Struct, frozen=True):
    """US dollars per million tokens, and where they come from."""

    input: Decimal
    cached_input: Decimal
    output: Decimal
    source: str
    """What the cost line says after `prices:`."""

    def cost(self, input_tokens: int, cached_input_tokens: int, output_tokens: int) -> Decimal:
        """Exact: `input_tokens` is the whole prompt, `cached_input_tokens` the part of it read
        from the cache."""
        cached = min(max(cached_input_tokens, 0), input_tokens)
        total = (input_tokens - cached) * self.input + cached * self.cached_input + output_tokens * self.output
        return total / MILLION


def _vendor_api(model: ModelSettings) -> bool:
    host = VENDOR_HOSTS.get(model.provider)
    if host is None:
        return False
    return model.base_url is None or (urlsplit(model.base_url).hostname or "").lower() == host


def prices_for(model: ModelSettings, set_in: str | None = None, key: str = "model.pricing") -> Prices | None:
    """The model's prices (see the module docstring), or None when it is not priced.
    `set_in`: the layer that set `key` (the pricing's key), named in the source."""
    pricing = model.pricing
    if pricing is not None:
        given = decimal_of(pricing.input_per_m_tok)
        cached = pricing.cached_input_per_m_tok
        where = f" ({set_in})" if set_in else ""
        return Prices(given, given if cached is None else decimal_of(cached), decimal_of(pricing.output_per_m_tok),
                      f"{key}{where}")
    if model.provider == EMBEDDED_PROVIDER:
        return Prices(Decimal(0), Decimal(0), Decimal(0), EMBEDDED_SOURCE)
    listed = list_price(model.name)
    if listed is None or listed.vendor != model.provider or not _vendor_api(model):
        return None
    return Prices(
        Decimal(listed.input), Decimal(listed.cached_input), Decimal(listed.output),
        f"catalogue, {listed.family} list price as of {PRICES_TAKEN}",
    )


SUMMARY_PRICING_KEY = "compaction.model.pricing"


def config_prices(config: SobaConfig) -> Prices | None:
    """The prices of a configuration's model."""
    return prices_for(config.model, config.set_by("model.pricing"))


def summary_prices(config: SobaConfig) -> Prices | None:
    """The prices of a configuration's summary model of its own (None: it has none, or there
    is none: see `SobaConfig.summary_model`)."""
    summary = config.summary_model
    if summary is None:
        return None
    return prices_for(summary, config.set_by("compaction.model"), _summary_pricing_key(config.compaction.model))


def _summary_pricing_key(given: SummaryModelSettings | None) -> str:
    """Which key the summary model's pricing comes from: its own, or `model`'s (the same model)."""
    return SUMMARY_PRICING_KEY if given is not None and given.pricing is not None else "model.pricing"


def operation_model(config: SobaConfig, operation: UsageOperation) -> ModelSettings:
    """The model a request of `operation` goes to: the summary model of its own for a
    compaction, when there is one; else `model`."""
    summary = config.summary_model if operation == "compaction" else None
    return summary or config.model


def operation_prices(config: SobaConfig, operation: UsageOperation) -> Prices | None:
    """The prices of the model a request of `operation` goes to."""
    if operation == "compaction" and config.summary_model is not None:
        return summary_prices(config)
    return config_prices(config)


def usd(amount: Decimal, rounding: str = ROUND_HALF_UP) -> str:
    """`$0.0123`: four decimals, rounded half up (`ROUND_UP` for a figure never to understate)."""
    return f"${amount.quantize(SHOWN_PLACES, rounding=rounding)}"


def _shown_cap(cap: Decimal) -> str:
    """The cap as written, with at least four decimals (`$0.5000`, `$0.00005`)."""
    exponent = cap.as_tuple().exponent
    places = SHOWN_PLACES if not isinstance(exponent, int) or exponent >= -4 else Decimal(1).scaleb(exponent)
    return f"${cap.quantize(places)}"


Identity = tuple[str, str | None, str]
"""A model as priced: (provider, baseUrl, name)."""


def identity(model: ModelSettings) -> Identity:
    return (model.provider, model.base_url, model.name)


class _Tokens(Struct):
    """Token sums of requests: priced together (a cost is linear in its tokens, and exact in
    decimals), by the prices they were recorded with or, if they had none, later if they can be."""

    uncached: int = 0
    cached: int = 0
    output: int = 0
    requests: int = 0
    estimated: int = 0
    """Requests among them priced from soba's own counts (`UsageEntry.estimated`)."""

    def add(self, entry: UsageEntry) -> None:
        cached = entry.cached_input_tokens if isinstance(entry.cached_input_tokens, int) else 0
        cached = max(min(cached, entry.input_tokens), 0)
        self.uncached += entry.input_tokens - cached
        self.cached += cached
        self.output += entry.output_tokens
        self.requests += 1
        self.estimated += entry.estimated is True

    def priced(self, prices: Prices) -> Decimal:
        return prices.cost(self.uncached + self.cached, self.cached, self.output)


class SessionCost(Struct, frozen=True):
    """The session's cost as of now."""

    inference: Decimal
    compaction: Decimal
    priced_requests: int
    unpriced_requests: int
    """Requests whose model had (and has) no price."""
    prices: Prices | None
    """The current model's prices (None: not priced)."""
    summary_model: str | None = None
    """The summary model of its own (`compaction.model`), when there is one: its name."""
    summary_prices: Prices | None = None
    """Its prices (None: not priced, or no summary model of its own)."""
    estimated_requests: int = 0
    """Priced requests whose server sent no usage: priced from soba's own counts."""

    @property
    def total(self) -> Decimal:
        return self.inference + self.compaction

    @property
    def priced(self) -> bool:
        """Something is priced: the current model, the summary model, or requests made before."""
        return self.prices is not None or self.summary_prices is not None or self.priced_requests > 0

    def line(self) -> str:
        """SPEC §11's line: `Cost: $0.0123 this session (inference $0.0100 · compaction
        $0.0023) · prices: <source>`, or `Cost: not priced`."""
        if not self.priced:
            return "Cost: not priced"
        source = self.prices.source if self.prices is not None else "none for the current model"
        text = (
            f"Cost: {usd(self.total)}{self.estimate_note()} this session (inference {usd(self.inference)} · "
            f"compaction {usd(self.compaction)}) · prices: {source}"
        )
        if self.summary_model is not None:
            shown = self.summary_prices.source if self.summary_prices is not None else "none"
            text += f" · summaries by {self.summary_model}: {shown}"
        if self.unpriced_requests:
            plural = "s" if self.unpriced_requests != 1 else ""
            text += f" · {self.unpriced_requests} request{plural} not priced"
        return text

    def estimate_note(self) -> str:
        """` (estimated: the server sent no usage for 3 requests)` after a figure that includes
        soba's own counts; empty when every priced request had the server's figures."""
        count = self.estimated_requests
        if not count:
            return ""
        return f" (estimated: the server sent no usage for {count} request{'s' if count != 1 else ''})"

    def to_json(self) -> dict[str, Any]:
        """For `soba-nb budget --json` (dollars as exact decimal strings)."""
        return {
            "line": self.line(),
            "priced": self.priced,
            "totalUsd": _plain(self.total) if self.priced else None,
            "inferenceUsd": _plain(self.inference) if self.priced else None,
            "compactionUsd": _plain(self.compaction) if self.priced else None,
            "prices": None if self.prices is None else self.prices.source,
            "summaryModel": self.summary_model,
            "summaryPrices": None if self.summary_prices is None else self.summary_prices.source,
            "pricedRequests": self.priced_requests,
            "unpricedRequests": self.unpriced_requests,
            "estimatedRequests": self.estimated_requests,
        }


def _plain(amount: Decimal) -> str:
    """The exact amount without trailing zeros or an exponent (`0.0255`, `21`)."""
    return f"{amount.normalize():f}"


def _recorded_model(entry: ConfigEntry) -> tuple[ModelSettings | None, str | None]:
    """The model section a `config` entry recorded and who set its pricing (None: a section
    today's rules refuse, whose requests are then not priced)."""
    model = entry.config.get("model") if isinstance(entry.config, dict) else None
    try:
        return msgspec.convert(model or {}, ModelSettings), entry.explicit.get("model.pricing")
    except msgspec.ValidationError:
        return None, None


Recorded = tuple[ModelSettings | None, Prices | None]
"""A model a `config` entry recorded, and its prices."""


def _recorded_summary(entry: ConfigEntry, model: ModelSettings | None) -> Recorded | None:
    """The summary model of its own a `config` entry recorded, and its prices; None when it
    recorded none (`model` wrote the summaries). A section today's rules refuse is recorded as
    a model that is not priced."""
    compaction = entry.config.get("compaction") if isinstance(entry.config, dict) else None
    given = compaction.get("model") if isinstance(compaction, dict) else None
    if given is None:
        return None
    try:
        settings = msgspec.convert(given, SummaryModelSettings)
    except msgspec.ValidationError:
        return None, None
    if model is None:
        return None, None
    summary = summary_model_settings(model, settings)
    return summary, prices_for(summary, entry.explicit.get("compaction.model"), _summary_pricing_key(settings))


class CostLedger(Struct):
    """The cost of one transcript, followed incrementally (each entry read once)."""

    _seen: int = 0
    _model: ModelSettings | None = None
    _prices: Prices | None = None
    _summary: Recorded | None = None
    """The summary model of its own the latest `config` entry recorded (None: none)."""
    _started: bool = False
    """A `config` entry was read (before one, entries are priced by the current model)."""
    _priced: dict[tuple[Prices, UsageOperation], _Tokens] = field(default_factory=dict)
    _pending: dict[tuple[Identity | None, UsageOperation], _Tokens] = field(default_factory=dict)

    def follow(self, transcript: Transcript) -> None:
        """Read what was appended since the last call."""
        if len(transcript) < self._seen:  # not the same file any more: start again
            self._seen, self._model, self._prices, self._summary, self._started = 0, None, None, None, False
            self._priced = {}
            self._pending = {}
        self.add(islice(transcript, self._seen, None))

    def add(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            self._seen += 1
            if isinstance(entry, ConfigEntry):
                self._started = True
                self._model, set_in = _recorded_model(entry)
                self._prices = None if self._model is None else prices_for(self._model, set_in)
                self._summary = _recorded_summary(entry, self._model)
            elif isinstance(entry, UsageEntry):
                self._add_usage(entry)

    def _add_usage(self, entry: UsageEntry) -> None:
        model, prices = self._model, self._prices
        if entry.operation == "compaction" and self._summary is not None:
            model, prices = self._summary  # the summary model of its own asked
        if prices is not None:
            self._priced.setdefault((prices, entry.operation), _Tokens()).add(entry)
            return
        who = None if not self._started else identity(model) if model is not None else ("", None, "")
        self._pending.setdefault((who, entry.operation), _Tokens()).add(entry)

    def cost(self, config: SobaConfig) -> SessionCost:
        """The session's cost, `config` being the one it runs with now."""
        prices = config_prices(config)
        summary = config.summary_model
        own_prices = summary_prices(config)
        known = {identity(config.model): prices}
        if summary is not None:
            known[identity(summary)] = own_prices
        totals = dict.fromkeys(OPERATIONS, Decimal(0))
        priced, unpriced, estimated = 0, 0, 0
        for (recorded, operation), tokens in self._priced.items():
            totals[operation] += tokens.priced(recorded)
            priced += tokens.requests
            estimated += tokens.estimated
        for (who, operation), tokens in self._pending.items():
            # Recorded before any `config` entry: priced as the model it would go to now.
            now = operation_prices(config, operation) if who is None else known.get(who)
            if now is not None:
                totals[operation] += tokens.priced(now)
                priced += tokens.requests
                estimated += tokens.estimated
            else:
                unpriced += tokens.requests
        return SessionCost(
            totals["inference"], totals["compaction"], priced, unpriced, prices,
            None if summary is None else summary.name, own_prices, estimated,
        )  # fmt: skip

    def check(
        self, config: SobaConfig, input_tokens: int, max_output_tokens: int, operation: UsageOperation = "inference"
    ) -> None:
        """Raise `CostCapExceeded` when a request of `input_tokens` that may answer with
        `max_output_tokens` could take the session past `agent.maxSessionCostUsd`, at the
        prices of the model a request of `operation` goes to."""
        cap = config.agent.max_session_cost_usd
        if cap is None:
            return
        limit = decimal_of(cap)
        now = self.cost(config)
        raise_it = how_to_raise(config)
        model = operation_model(config, operation)
        prices = operation_prices(config, operation)
        if prices is None:
            key = "model.pricing" if model is config.model else SUMMARY_PRICING_KEY
            raise CostCapExceeded(
                f"request not sent: {CAP_KEY} is {_shown_cap(limit)}, but {model.provider}/"
                f"{model.name} has no prices, so what a request costs cannot be known; set "
                f"{key} (inputPerMTok, outputPerMTok) in soba.json, or remove {CAP_KEY}{raise_it}"
            )
        if now.unpriced_requests:
            count = now.unpriced_requests
            raise CostCapExceeded(
                f"request not sent: {count} earlier request{'s' if count != 1 else ''} of this session "
                f"{'have' if count != 1 else 'has'} no prices, so its cost so far cannot be known against "
                f"{CAP_KEY} {_shown_cap(limit)}; "
                f"price their model with model.pricing, remove {CAP_KEY}{raise_it}, or start a new session"
            )
        reach = now.total + prices.cost(input_tokens, 0, max_output_tokens)
        if reach > limit:
            raise CostCapExceeded(
                f"request not sent: this session has cost {usd(now.total)}; the next request could "
                f"reach {usd(reach, ROUND_UP)}, over {CAP_KEY} {_shown_cap(limit)}. To go on, raise "
                f"{CAP_KEY}{raise_it} and run the cell again"
            )


def cap_note(config: SobaConfig) -> str:
    """` · cap $5.0000 (agent.maxSessionCostUsd)` after the cost line, when a cap is set."""
    cap = config.agent.max_session_cost_usd
    return "" if cap is None else f" · cap {_shown_cap(decimal_of(cap))} ({CAP_KEY})"


def how_to_raise(config: SobaConfig) -> str:
    """Where the cap was set, for the refusal: ` (in ~/proj/soba.json)`, ` (SOBA_AGENT_…)`."""
    layer = config.set_by(CAP_KEY)
    if layer == "environment":
        return f" ({CAP_ENV})"
    if layer and layer != "arguments":
        return f" (in {layer})"
    return " (soba.json)"
