"""The model a session talks to, bound whole: its provider, the summarizer that provider
answers as, and the provider's native compaction.

The three belong together: a summary or a native item from one provider next to requests
sent to another is a mismatch (native items are replayed only to the provider and model that
made them). So they are made together (`ModelBinding.of`) and given to the compactor together
(`Compactor.bind`), and a new model or idle limit swaps the whole binding, never one part.
"""

from __future__ import annotations

from dataclasses import dataclass

from soba_nb.agent.provider_summarizer import ProviderSummarizer
from soba_nb.compaction.compactor import SummaryModels
from soba_nb.providers.base import Provider, SpendCheck
from soba_nb.providers.native_compactors import native_compactor_for


@dataclass(frozen=True)
class ModelBinding:
    """A provider and the compaction models it stands behind."""

    provider: Provider
    models: SummaryModels

    @classmethod
    def of(cls, provider: Provider, spend_check: SpendCheck | None = None) -> ModelBinding:
        """`spend_check` runs before each compaction request leaves (the session's cap)."""
        return cls(
            provider,
            SummaryModels(ProviderSummarizer(provider, spend_check), native_compactor_for(provider, spend_check)),
        )
