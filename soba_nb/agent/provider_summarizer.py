"""The compaction `Summarizer` implemented on a provider (`X-Soba-Operation: compaction`):
the session's spending cap is checked before the request leaves, and its usage figures come
back with the summary (`operation: compaction`) for the barrier to record once it ended; a
server that sends none gets our own counts of the prompt and the summary, marked estimated."""

from __future__ import annotations

import threading

from soba_nb.agent.cost import EMBEDDED_PROVIDER
from soba_nb.agent.usage_evidence import received_tokens
from soba_nb.compaction.summarizer import ProgressCallback, SummaryOutput
from soba_nb.providers.base import ChatMessage, ModelRequest, Provider, SpendCheck
from soba_nb.tokens import TokenCounter, choose_encoding
from soba_nb.transcript.entries import UsageEntry
from soba_nb.transcript.estimated import estimated_usage, tokens_of_chars


class ProviderSummarizer:
    """Asks the session's model for the capsule, streaming so progress can be shown."""

    def __init__(self, provider: Provider, spend_check: SpendCheck | None = None):
        self.provider_impl = provider
        self.model = provider.model
        self.provider = provider.name
        self.spend_check = spend_check

    def summarize(
        self,
        system: str,
        user: str,
        *,
        max_output_tokens: int,
        operation_id: str,
        cancel: threading.Event,
        on_progress: ProgressCallback | None,
        timeout_s: float,
    ) -> SummaryOutput:
        received = 0

        def on_text(text: str) -> None:
            nonlocal received
            received += len(text)
            if on_progress is not None:
                on_progress(received)

        request = ModelRequest(
            system=system,
            messages=[ChatMessage(role="user", content=user)],
            max_output_tokens=max_output_tokens,
            operation="compaction",
            operation_id=operation_id,
            stream=True,
        )
        if self.spend_check is not None:
            self.spend_check(request)
        response = self.provider_impl.complete(request, on_text=on_text, cancel=cancel, timeout_s=timeout_s)
        usage = response.usage
        estimate = None
        if usage is None and self.provider != EMBEDDED_PROVIDER:  # no figures: the cap still counts it
            counter = self._counter()
            estimate = estimated_usage(
                self._sent(system, user, counter), received_tokens(response.text, response.tool_calls, counter),
                provider=response.provider, model=response.model, operation_id=operation_id, operation="compaction",
            )  # fmt: skip
        return SummaryOutput(
            text=response.text,
            finish_reason=response.finish_reason,
            has_tool_calls=bool(response.tool_calls),
            model=response.model,
            provider=response.provider,
            usage=estimate
            if usage is None
            else usage.entry(
                provider=response.provider, model=response.model, operation="compaction", operation_id=operation_id
            ),
        )

    def cut_off_usage(self, system: str, user: str, *, received_chars: int, operation_id: str) -> UsageEntry | None:
        if self.provider == EMBEDDED_PROVIDER:
            return None  # the embedded model costs nothing
        received = tokens_of_chars(received_chars)
        return estimated_usage(
            self._sent(system, user, self._counter()), received, provider=self.provider, model=self.model,
            operation_id=operation_id, operation="compaction",
        )  # fmt: skip

    def _counter(self) -> TokenCounter:
        return TokenCounter(choose_encoding(self.provider, self.model))

    @staticmethod
    def _sent(system: str, user: str, counter: TokenCounter) -> int:
        return counter.count_text(system) + counter.count_message("user", user)
