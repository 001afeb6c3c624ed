"""Image sizes and tokens (SPEC §10): the published rules, on their published examples."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from soba_nb.images import (
    MAX_SENT_EDGE,
    MAX_SENT_PIXELS,
    ImageRule,
    anthropic_tokens,
    image_tokens,
    openai_tokens,
    sent_size,
)


def test_openai_tile_rule_matches_its_documented_examples() -> None:
    assert openai_tokens(1024, 1024) == 765  # 768×768: four tiles
    assert openai_tokens(2048, 4096) == 1105  # 1024×2048 → 768×1536: six tiles
    assert openai_tokens(100, 100) == 255  # one tile


def test_anthropic_area_rule() -> None:
    assert anthropic_tokens(1000, 1000) == 1334
    assert anthropic_tokens(200, 200) == 54


def test_a_model_without_images_counts_none() -> None:
    assert image_tokens(ImageRule.NONE, 5000, 4000) == 0


def test_twenty_megapixels_are_sent_at_a_bounded_size_and_cost() -> None:
    width, height = sent_size(5000, 4000)
    assert max(width, height) <= MAX_SENT_EDGE and width * height <= MAX_SENT_PIXELS
    assert image_tokens(ImageRule.AREA, 5000, 4000) <= MAX_SENT_PIXELS // 750 + 1
    assert image_tokens(ImageRule.TILES, 5000, 4000) == openai_tokens(width, height)


@given(st.integers(1, 30000), st.integers(1, 30000))
@example(101, 14398)
@example(1, 30000)
@example(30000, 2)
def test_sent_size_never_grows_and_keeps_the_shape(width: int, height: int) -> None:
    w, h = sent_size(width, height)
    assert 1 <= w <= width and 1 <= h <= height
    assert max(w, h) <= MAX_SENT_EDGE and w * h <= MAX_SENT_PIXELS
    # Both sides are cut to whole pixels, each by less than one: the shape is kept up to that.
    # (A 101 × 14398 strip is sent 10 pixels wide, not 10.9996: 9% off, and as close as pixels go.)
    if min(w, h) > 1:  # a side below one pixel is sent as one
        assert abs(w / h - width / height) / (width / height) < 2 / min(w, h) + 1e-9
