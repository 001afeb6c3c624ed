"""Native continuation (SPEC §5 item 2): the provider's own compaction, beside our capsule.

Some providers compact a conversation themselves (OpenAI's `/responses/compact`, Anthropic's
`compact_20260112` edit) and hand back an item to replay in later requests; it carries state
our summary cannot (the model's reasoning). Our barrier still decides *when* (same triggers,
gates, deadline and fallback): for a provider that offers it, the compaction operation asks
for the native item and records it in the capsule entry beside the portable capsule, which
is always written too (rewind, export and a model switch need it).

This module is the provider-neutral part: what a target accepts, the `NativeCompactor`
interface the provider layer implements, and how many tokens a native item costs in model
input. No provider or IPython import: the compaction core stays pure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from msgspec import Struct

from soba_nb.messages import ChatMessage, ToolSchema
from soba_nb.tokens import TOKENS_PER_MESSAGE, TokenCounter
from soba_nb.transcript.entries import CapsuleEntry, Continuation, NativeContinuation, UsageEntry

ENCRYPTED_FIELD = "encrypted_content"
"""The providers' name for opaque state (OpenAI items, Anthropic compaction blocks)."""
ENCRYPTED_CHARS_PER_TOKEN = 4
"""What an opaque string is assumed to cost: its size in the model's context is not
published, so it is counted like prose (one token per 4 characters), which is on the safe
side for the hard limit; the provider's usage figure on the next request replaces it."""
REQUEST_FRAME = "The request being worked on, verbatim (it was compacted with the earlier context):\n\n"


class NativeRefused(RuntimeError):
    """The provider did not compact (the request was below its minimum, it answered without
    a compaction item, or the model does not support it). The portable path runs."""


class NativeTarget(Struct, frozen=True):
    """The provider and model the next requests go to, and the kinds of item it replays."""

    provider: str
    model: str
    kinds: frozenset[str]

    def accepts(self, native: NativeContinuation | None) -> bool:
        """Only the provider and model that produced an item may receive it (SPEC §5)."""
        return (
            native is not None
            and native.provider == self.provider
            and native.model == self.model
            and native.kind in self.kinds
        )


class NativeRequest(Struct, frozen=True):
    """What the compaction operation sends: the history it replaces, as model input."""

    operation_id: str
    system: str
    tools: tuple[ToolSchema, ...]
    messages: tuple[ChatMessage, ...]
    """The region being compacted (the previous capsule's continuation first)."""
    native: NativeContinuation | None
    """The previous native item, replayed first, when the target accepts it."""
    input_tokens: int
    """Our count of the request (the provider's minimum trigger is checked against it)."""
    soft_limit: int
    max_output_tokens: int


UsageSink = Callable[[UsageEntry], None]
"""Receives the usage figures of a request the operation made (`operation: compaction`)."""


class NativeCompactor(Protocol):
    """The provider side of native compaction (`soba_nb.providers.native_compactors`)."""

    target: NativeTarget

    def compact(
        self,
        request: NativeRequest,
        *,
        cancel: threading.Event,
        timeout_s: float,
        on_usage: UsageSink | None = None,
    ) -> NativeContinuation:
        """The provider's compaction of `request`. Raises `NativeRefused` when the provider
        did not compact, `RequestNotSent` when it was not asked (the spending cap), any other
        error when the request failed; stops promptly on cancel. `on_usage` gets the figures
        of the request it answered, refused or not."""
        ...


def native_tokens(native: NativeContinuation, counter: TokenCounter) -> int:
    """Tokens the native item (and the request quoted after it) costs in model input.

    Readable text is counted exactly; opaque strings at `ENCRYPTED_CHARS_PER_TOKEN`."""

    def walk(value: Any, key: str | None = None) -> int:
        if isinstance(value, str):
            if key == ENCRYPTED_FIELD:
                return -(-len(value) // ENCRYPTED_CHARS_PER_TOKEN)
            return counter.count_text(value)
        if isinstance(value, Mapping):
            return sum(walk(item, name) for name, item in value.items())
        if isinstance(value, Sequence):
            return sum(TOKENS_PER_MESSAGE + walk(item) for item in value)
        return 0

    quote = counter.count_message("user", REQUEST_FRAME + native.request) if native.request else 0
    return TOKENS_PER_MESSAGE + walk(native.payload) + quote


def request_message(native: NativeContinuation) -> ChatMessage | None:
    """The user message quoting the request after the native item, when there is one."""
    if not native.request:
        return None
    return ChatMessage(role="user", content=REQUEST_FRAME + native.request)


def continuation_label(capsule: CapsuleEntry) -> Continuation | None:
    """What a result line says about the continuation: `native`, `portable`, `fallback`, or
    nothing for a full capsule where native compaction was not on offer (the older wording)."""
    if capsule.continuation is not None:
        return capsule.continuation
    return "fallback" if capsule.quality == "degraded" else None
