"""The model a session talks to, bound whole: its provider, the summarizer that provider
answers as, and the provider's native compaction.

The three belong together: a summary or a native item from one provider next to requests
sent to another is a mismatch (native items are replayed only to the provider and model that
made them). So they are made together (`ModelBinding.of`) and given to the compactor together
(`Compactor.bind`), and a new model or idle limit swaps the whole binding, never one part.

A summary model of its own (`compaction.model`, SPEC §14) changes one thing: the summaries are
asked of it, with its own limits (`SummaryWindow`), and the main provider's native compaction
is not asked. The user chose another model to write the summaries (a cheaper one, usually);
native compaction would have the main model do that work at its price, and its opaque item
replays only to the main model, where the portable capsule serves every model.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from soba_nb.agent.limits import summary_window
from soba_nb.agent.provider_summarizer import ProviderSummarizer
from soba_nb.compaction.compactor import SummaryModels
from soba_nb.config import SobaConfig
from soba_nb.providers import make_provider
from soba_nb.providers.base import Provider, SpendCheck
from soba_nb.providers.errors import ProviderError
from soba_nb.providers.http import DEFAULT_IDLE_TIMEOUT_S
from soba_nb.providers.native_compactors import native_compactor_for

NO_SUMMARY_MODEL = SummaryModels()
"""A summary model of its own that cannot be made: capsules are written without a model."""


@dataclass(frozen=True)
class ModelBinding:
    """A provider and the compaction models it stands behind."""

    provider: Provider
    models: SummaryModels
    summary_provider: Provider | None = None
    """The summary model's own provider (`compaction.model`), which the session closes."""

    @classmethod
    def of(
        cls,
        provider: Provider,
        spend_check: SpendCheck | None = None,
        *,
        config: SobaConfig | None = None,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ) -> ModelBinding:
        """`spend_check` runs before each compaction request leaves (the session's cap);
        `config`: the session's configuration, when its `compaction.model` may name a summary
        model of its own (made here, its key read from its own `apiKeyEnv` at each request)."""
        summary = None if config is None else config.summary_model
        window = None if config is None else summary_window(config)
        if summary is None or window is None:
            return cls(
                provider,
                SummaryModels(ProviderSummarizer(provider, spend_check), native_compactor_for(provider, spend_check)),
            )
        try:
            own = make_provider(summary, idle_timeout_s=idle_timeout_s)
        except ProviderError as error:
            # Not the main model instead: the user chose another to write the summaries.
            warnings.warn(
                f"soba-nb: compaction.model {summary.provider}/{summary.name} cannot be used ({error}); "
                "capsules are written without a model",
                RuntimeWarning,
                stacklevel=2,
            )
            return cls(provider, NO_SUMMARY_MODEL)
        return cls(provider, SummaryModels(ProviderSummarizer(own, spend_check), None, window), own)
