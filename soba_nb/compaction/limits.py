"""Per-request token limits (SPEC §2)."""

from __future__ import annotations

import math
from fractions import Fraction


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
