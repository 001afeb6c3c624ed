"""The session's limits (SPEC §2): where the context window comes from, and what follows.

`contextWindow` is the figure every limit hangs on, and a wrong one is worse than none: with
128,000 configured for a llama.cpp server started with `-c 8192`, the hard limit is fiction
and every turn relies on overflow recovery. So the window is resolved, in this order:

1. the base: `model.contextWindow` when a config file, the environment or a magic argument
   sets it; otherwise the model catalogue (`soba_nb.catalogue`) when it knows the model's
   family; otherwise the provider profile or the default (128,000);
2. the server's own figure, when it can tell (`soba_nb.providers.discovery`): it replaces a
   catalogue or default base, and caps an explicit one (a server cannot take more than it
   was started with);
3. what the session learned (`window` entries in the transcript): an overflow error that
   stated the limit, or a server whose counts stopped growing with what was sent (it cuts
   prompts silently: `agent.usage_evidence`). It caps everything above for the rest of the
   session, resumed or not (`%soba --new` starts afresh); an explicit `contextWindow` it lowers
   gets a note saying so (SPEC §13).

`maxOutputTokens` is the configured figure (explicit, or the default 8,000) capped at the
model's own maximum from the catalogue. When the window ends up smaller than the configured
one, the figures the user did not set are scaled to it (their `*_SHARE` of the window or of
the hard limit). A figure the user set is kept while it still fits (SPEC §12): the hard
limit stays positive and keepRecentTokens below it. Only a figure that cannot hold gives
way, to its share, with a note: a session is never stranded by a limit arithmetic that
cannot hold, and a setting that can hold is never second-guessed.

`auto`: a `setting` entry in the transcript (`%auto_compact on|off`) wins over the config.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from msgspec import Struct

from soba_nb.catalogue import CatalogueEntry
from soba_nb.compaction.limits import (
    KEEP_SHARE,
    MAX_OUTPUT_SHARE,
    MIN_AUTO_SHARE,
    MIN_RECLAIMABLE_SHARE,
    SAFETY_SHARE,
    hard_limit,
    soft_limit,
)
from soba_nb.compaction.triggers import Thresholds
from soba_nb.config import SobaConfig
from soba_nb.transcript.entries import SettingEntry, WindowEntry

AUTO_KEY: Literal["compaction.auto"] = "compaction.auto"
LEARNED_SOURCES = {"overflow": "overflow error", "truncation": "truncated prompt", "server": "server"}


class ServerWindow(Struct, frozen=True):
    """A context window the server reported (`soba_nb.providers.discovery` asks for it; a
    `window` entry records it)."""

    context_window: int
    source: str
    """Where the figure came from, e.g. "llama.cpp GET /props n_ctx"."""


class SessionLimits(Struct, frozen=True):
    """The figures a session works with, and where its window came from."""

    context_window: int
    max_output_tokens: int
    window_source: str
    """One line, e.g. "catalogue: Llama 3", "server: llama.cpp GET /props n_ctx"."""
    safety_reserve_tokens: int
    keep_recent_tokens: int
    min_tokens_for_auto_compact: int
    min_reclaimable_tokens: int
    auto: bool
    auto_source: str
    """"config" or "session setting" (`%auto_compact`, kept in the transcript)."""
    notes: tuple[str, ...] = ()
    """Adjustments a user should know about (an explicit figure that did not fit)."""

    @property
    def hard_limit(self) -> int:
        return hard_limit(self.context_window, self.max_output_tokens, self.safety_reserve_tokens)

    def soft_limit(self, config: SobaConfig) -> int:
        c = config.compaction
        return soft_limit(self.hard_limit, self.min_tokens_for_auto_compact, c.auto_compact_threshold_ratio)

    def thresholds(self, config: SobaConfig) -> Thresholds:
        c = config.compaction
        return Thresholds(
            hard_limit=self.hard_limit,
            soft_limit=self.soft_limit(config),
            auto=self.auto,
            compact_on_turn_complete=c.compact_on_turn_complete,
            compact_on_milestone=c.compact_on_milestone,
            min_tokens_for_auto_compact=self.min_tokens_for_auto_compact,
            min_reclaimable_tokens=self.min_reclaimable_tokens,
            min_savings_ratio=c.min_savings_ratio,
            keep_recent_tokens=self.keep_recent_tokens,
        )


def model_key(config: SobaConfig) -> str:
    """`provider/name`: what `window` entries are scoped to."""
    return f"{config.model.provider}/{config.model.name}"


def learned_window(entries: Sequence[WindowEntry], model: str) -> WindowEntry | None:
    """The smallest window an overflow or truncation taught this session for `model`."""
    learned = [e for e in entries if e.model == model and e.source != "server"]
    return min(learned, key=lambda e: e.context_window, default=None)


TRUNCATION_MARGIN = 0.95
"""Usage figures within 5% of a truncation window may measure a cut prompt."""


def usage_ceiling(entries: Sequence[WindowEntry], model: str) -> int | None:
    """Usage figures at or above this may measure a prompt the server cut (see
    `BudgetTracker.distrust_usage_from`); None when the server never cut one."""
    cuts = [e.context_window for e in entries if e.model == model and e.source == "truncation"]
    return int(min(cuts) * TRUNCATION_MARGIN) if cuts else None


def recorded_server_window(entries: Sequence[WindowEntry], model: str) -> ServerWindow | None:
    """The latest figure a server gave for `model`, as recorded in the transcript."""
    for entry in reversed(entries):
        if entry.model == model and entry.source == "server":
            return ServerWindow(entry.context_window, entry.detail)
    return None


def _base_window(config: SobaConfig, catalogue: CatalogueEntry | None) -> tuple[int, str, bool]:
    """(window, source, explicit) before the server and the session have their say."""
    window = config.model.context_window
    layer = config.set_by("model.contextWindow")
    if layer is not None:
        return window, f"model.contextWindow from {layer}", True
    if catalogue is not None:
        return catalogue.context_window, f"catalogue: {catalogue.family}", False
    if config.model.provider == "local":
        return window, "embedded model", False
    return window, "default (model not in the catalogue; set model.contextWindow)", False


def _window(
    config: SobaConfig,
    catalogue: CatalogueEntry | None,
    server: ServerWindow | None,
    learned: WindowEntry | None,
    notes: list[str],
) -> tuple[int, str]:
    window, source, explicit = _base_window(config, catalogue)
    if server is not None and (not explicit or server.context_window < window):
        if explicit:
            notes.append(f"{source} is {window:,}, but the server says {server.context_window:,}: using the server's")
        window, source = server.context_window, f"server: {server.source}"
    if learned is not None and learned.context_window < window:
        what = LEARNED_SOURCES[learned.source]
        detail = f" ({learned.detail})" if learned.detail else ""
        if explicit:  # an explicit window is never lowered silently (SPEC §13)
            notes.append(
                f"model.contextWindow {config.model.context_window:,} (from {config.set_by('model.contextWindow')}) "
                f"is more than the server takes: the {what}{detail} showed {learned.context_window:,}; "
                f"using {learned.context_window:,}"
            )
        window, source = learned.context_window, f"{what}{detail}"
    return window, source


def _follow(config: SobaConfig, key: str, value: int, share: int, smaller: bool) -> int:
    """A figure the user did not set follows a window smaller than the configured one down
    to its `share`; one the user set stays (it gives way only when it cannot hold)."""
    if smaller and config.set_by(key) is None:
        return min(value, share)
    return value


def _give_way(config: SobaConfig, key: str, value: int, share: int, why: str, notes: list[str]) -> int:
    """`share` for a figure that cannot hold (`why`), with a note when the user set it."""
    layer = config.set_by(key)
    if layer is not None:
        notes.append(f"{key} {value:,} (from {layer}) {why}: using {share:,}")
    return share


def _fit_hard_limit(config: SobaConfig, window: int, max_output: int, safety: int, notes: list[str]) -> tuple[int, int]:
    """(maxOutputTokens, safetyReserveTokens) with a positive hard limit. While it is not,
    the figure furthest over its share of the window gives way first, then the other."""
    figures = {
        "model.maxOutputTokens": [max_output, max(window // MAX_OUTPUT_SHARE, 1)],
        "compaction.safetyReserveTokens": [safety, window // SAFETY_SHARE],
    }
    for key in sorted(figures, key=lambda name: figures[name][1] - figures[name][0]):
        values = [value for value, _ in figures.values()]
        if hard_limit(window, *values) > 0:
            break
        value, share = figures[key]
        if value > share:
            why = f"leaves no hard limit in a window of {window:,}"
            figures[key][0] = _give_way(config, key, value, share, why, notes)
    return figures["model.maxOutputTokens"][0], figures["compaction.safetyReserveTokens"][0]


def resolve_limits(
    config: SobaConfig,
    *,
    catalogue: CatalogueEntry | None = None,
    server: ServerWindow | None = None,
    learned: WindowEntry | None = None,
    auto_setting: SettingEntry | None = None,
) -> SessionLimits:
    """The session's limits from the config and what is known of the model and server."""
    notes: list[str] = []
    window, source = _window(config, catalogue, server, learned, notes)
    smaller = window < config.model.context_window
    c = config.compaction
    max_output = config.model.max_output_tokens
    if catalogue is not None and config.set_by("model.maxOutputTokens") is None:
        max_output = min(max_output, catalogue.max_output_tokens)
    max_output = _follow(config, "model.maxOutputTokens", max_output, max(window // MAX_OUTPUT_SHARE, 1), smaller)
    safety = _follow(config, "compaction.safetyReserveTokens", c.safety_reserve_tokens, window // SAFETY_SHARE, smaller)
    max_output, safety = _fit_hard_limit(config, window, max_output, safety, notes)
    hard = hard_limit(window, max_output, safety)
    keep_key, keep_share = "compaction.keepRecentTokens", hard // KEEP_SHARE
    keep = _follow(config, keep_key, c.keep_recent_tokens, keep_share, smaller)
    if keep >= hard:
        keep = _give_way(config, keep_key, keep, keep_share, f"is not below the hard limit ({hard:,})", notes)
    # The trigger floors cannot break the arithmetic (softLimit is at most hardLimit - 1 by
    # its formula), so a figure the user set stays whatever the window.
    min_auto = _follow(
        config, "compaction.minTokensForAutoCompact", c.min_tokens_for_auto_compact, hard // MIN_AUTO_SHARE, smaller
    )
    min_reclaimable = _follow(
        config, "compaction.minReclaimableTokens", c.min_reclaimable_tokens, hard // MIN_RECLAIMABLE_SHARE, smaller
    )
    auto, auto_source = c.auto, "config"
    if auto_setting is not None:
        auto, auto_source = auto_setting.value, "session setting (%auto_compact)"
    return SessionLimits(
        context_window=window,
        max_output_tokens=max_output,
        window_source=source,
        safety_reserve_tokens=safety,
        keep_recent_tokens=keep,
        min_tokens_for_auto_compact=min_auto,
        min_reclaimable_tokens=min_reclaimable,
        auto=auto,
        auto_source=auto_source,
        notes=tuple(notes),
    )
