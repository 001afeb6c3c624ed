"""The `usage` entry of a request whose server sent no figures (SPEC §11, §16): soba's own
counts of what was sent and received, marked `estimated`: priced like any other, never a
budget figure nor evidence about the server's counting."""

from __future__ import annotations

from soba_nb.transcript.entries import UsageEntry, UsageOperation


def estimated_usage(
    sent: int,
    received: int,
    *,
    provider: str | None,
    model: str | None,
    operation_id: str,
    operation: UsageOperation = "inference",
) -> UsageEntry:
    """The `usage` entry of a request whose server sent no figures: our own counts of what was
    sent and received, marked `estimated` (priced, never a budget figure)."""
    return UsageEntry(
        input_tokens=max(sent, 0),
        output_tokens=max(received, 0),
        provider=provider,
        model=model,
        operation_id=operation_id,
        operation=operation,
        sent_tokens=max(sent, 0) if operation == "inference" else None,
        estimated=True,
    )


CHARS_PER_TOKEN_RECEIVED = 4
"""What is known of an answer only by its length is priced at this many characters a token."""


def tokens_of_chars(chars: int) -> int:
    """Our estimate of an answer known only by its length (a cut-off summary, an encrypted
    native item): characters / 4, rounded up."""
    return -(-max(chars, 0) // CHARS_PER_TOKEN_RECEIVED)
