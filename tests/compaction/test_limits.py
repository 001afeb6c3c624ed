"""SPEC §2: hardLimit and softLimit, exactly as the formulas."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from soba_nb.compaction.limits import hard_limit, soft_limit
from soba_nb.config import SobaConfig

DEFAULT_MIN_TOKENS = 32000
DEFAULT_RATIO = 0.8


def test_worked_example() -> None:
    hard = hard_limit(65000, 8000, 8192)
    assert hard == 48808
    assert soft_limit(hard, DEFAULT_MIN_TOKENS, DEFAULT_RATIO) == 39046


def test_worked_example_through_the_config() -> None:
    config = msgspec.convert({"model": {"contextWindow": 65000, "maxOutputTokens": 8000}}, SobaConfig)
    assert (config.hard_limit, config.soft_limit) == (48808, 39046)


def test_min_tokens_raises_the_soft_limit() -> None:
    # floor(48808 * 0.5) = 24404 < 32000, so the minimum applies.
    assert soft_limit(48808, 32000, 0.5) == 32000


def test_soft_limit_stays_below_a_small_hard_limit() -> None:
    # The minimum would put the soft limit above the hard one; hard - 1 caps it.
    assert soft_limit(10000, 32000, 0.8) == 9999


def test_ratio_is_applied_as_its_decimal_value() -> None:
    # 100 * 0.29 is 28.999999999999996 in binary floating point.
    assert soft_limit(100, 0, 0.29) == 29
    assert soft_limit(1000, 0, 0.57) == 570
    assert soft_limit(100, 0, 0.7) == 70


def test_ratio_of_one_still_leaves_soft_below_hard() -> None:
    assert soft_limit(48808, 0, 1.0) == 48807


def test_hard_limit_can_be_non_positive() -> None:
    # The formula itself does not clamp; the config refuses such settings.
    assert hard_limit(16000, 8000, 8192) == -192


hard_limits = st.integers(min_value=1, max_value=2_000_000)
min_tokens = st.integers(min_value=0, max_value=2_000_000)
ratios = st.floats(min_value=0.0, max_value=1.0, exclude_min=True, allow_nan=False)
# Decimal ratios people write: 0.01 … 1.00.
decimal_ratios = st.integers(min_value=1, max_value=100).map(lambda hundredths: hundredths / 100)


@given(hard_limits, min_tokens, ratios)
def test_soft_is_below_hard(hard: int, minimum: int, ratio: float) -> None:
    assert soft_limit(hard, minimum, ratio) < hard


@given(hard_limits, min_tokens, ratios)
def test_soft_is_at_least_the_minimum_or_hard_minus_one(
    hard: int, minimum: int, ratio: float
) -> None:
    assert soft_limit(hard, minimum, ratio) >= min(hard - 1, minimum)


@given(
    st.integers(min_value=1, max_value=2_000_000),
    st.integers(min_value=0, max_value=100_000),
    st.integers(min_value=0, max_value=100_000),
    st.integers(min_value=0, max_value=100_000),
    min_tokens,
    ratios,
)
def test_monotonic_in_context_window(
    window: int, growth: int, max_output: int, reserve: int, minimum: int, ratio: float
) -> None:
    small = hard_limit(window, max_output, reserve)
    large = hard_limit(window + growth, max_output, reserve)
    assert large - small == growth
    assert soft_limit(large, minimum, ratio) >= soft_limit(small, minimum, ratio)


@given(hard_limits, decimal_ratios)
def test_decimal_ratio_is_exact(hard: int, ratio: float) -> None:
    hundredths = round(ratio * 100)
    assert soft_limit(hard, 0, ratio) == min(hard - 1, hard * hundredths // 100)


@given(hard_limits, min_tokens, ratios)
def test_soft_limit_matches_the_formula(hard: int, minimum: int, ratio: float) -> None:
    soft = soft_limit(hard, minimum, ratio)
    threshold = soft if soft < hard - 1 else None
    if threshold is not None and threshold != minimum:
        # Away from the caps, soft is floor(hard * ratio) within float rounding.
        assert abs(threshold - hard * ratio) <= 1
