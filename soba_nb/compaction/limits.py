"""Per-request token limits (SPEC §2)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

MAX_OUTPUT_SHARE = 4
"""A scaled maxOutputTokens is at most a quarter of the window."""
SAFETY_SHARE = 16
"""A scaled safetyReserveTokens is at most a sixteenth of the window."""
KEEP_SHARE = 4
"""A scaled keepRecentTokens is at most a quarter of the hard limit."""
MIN_AUTO_SHARE = 2
"""A scaled minTokensForAutoCompact is at most half the hard limit."""
MIN_RECLAIMABLE_SHARE = 8
"""A scaled minReclaimableTokens is at most an eighth of the hard limit."""


def hard_limit(context_window: int, max_output_tokens: int, safety_reserve_tokens: int) -> int:
    """hardLimit = contextWindow - maxOutputTokens - safetyReserveTokens."""
    return context_window - max_output_tokens - safety_reserve_tokens


def soft_limit(hard: int, min_tokens_for_auto_compact: int, auto_compact_threshold_ratio: float) -> int:
    """softLimit = min(hardLimit - 1, max(minTokensForAutoCompact, floor(hardLimit * ratio)))."""
    return min(
        hard - 1,
        # Fraction of the ratio's decimal text: 100 * 0.29 is 29, not 28.999… as in binary floats.
        max(min_tokens_for_auto_compact, math.floor(hard * Fraction(repr(auto_compact_threshold_ratio)))),
    )


@dataclass(frozen=True)
class SummaryWindow:
    """The limits of a summary model of its own (`compaction.model`, SPEC §14), which are not
    the session's: the summary request is fitted to them."""

    context_window: int
    """Its window."""
    input_tokens: int
    """What a summary request (instructions and history) may take: its hard limit."""
    output_tokens: int
    """Its `maxOutputTokens`: the summary's `max_tokens` never asks for more."""
