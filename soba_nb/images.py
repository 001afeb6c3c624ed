"""Images in model input (SPEC §10): the size an image is sent at and what it costs in tokens.

An image the agent's code displayed is kept whole as an artifact; a request carries a copy no
larger than `MAX_SENT_EDGE` on its long side and `MAX_SENT_PIXELS` in all (the size Anthropic
recommends, which OpenAI's high-detail rule would scale it to or below anyway), so a
20-megapixel plot costs what a screen-sized one does. Its tokens follow the provider's
published rule on that size:

- OpenAI (Chat Completions, Responses and every OpenAI-compatible server): the image is scaled
  to fit 2048×2048, then its short side to 768; each 512-pixel tile costs 170 tokens, plus 85.
- Anthropic: width × height / 750.

This module imports nothing of soba's: the token counter and the request builder both use it.
"""

from __future__ import annotations

import math
from enum import Enum

MAX_SENT_EDGE = 1568
"""The long side of an image as a request carries it, at most."""
MAX_SENT_PIXELS = 1_150_000
"""Width × height of an image as a request carries it, at most."""
OPENAI_FIT = 2048
OPENAI_SHORT_SIDE = 768
OPENAI_TILE = 512
OPENAI_TILE_TOKENS = 170
OPENAI_BASE_TOKENS = 85
ANTHROPIC_PIXELS_PER_TOKEN = 750


class ImageRule(Enum):
    """How a model counts an image: it takes none, or by OpenAI's or Anthropic's rule."""

    NONE = "none"
    TILES = "tiles"
    AREA = "area"


def sent_size(width: int, height: int) -> tuple[int, int]:
    """The size a request carries an image of `width` × `height` at (never larger)."""
    scale = min(1.0, MAX_SENT_EDGE / max(width, height, 1), math.sqrt(MAX_SENT_PIXELS / max(width * height, 1)))
    return max(1, int(width * scale)), max(1, int(height * scale))


def _scaled_to(width: int, height: int, factor: float) -> tuple[float, float]:
    return (width * factor, height * factor) if factor < 1 else (width, height)


def openai_tokens(width: int, height: int) -> int:
    """OpenAI's high-detail tile rule."""
    w, h = _scaled_to(width, height, OPENAI_FIT / max(width, height, 1))
    w, h = _scaled_to(int(w), int(h), OPENAI_SHORT_SIDE / max(min(w, h), 1))
    tiles = math.ceil(w / OPENAI_TILE) * math.ceil(h / OPENAI_TILE)
    return OPENAI_BASE_TOKENS + OPENAI_TILE_TOKENS * tiles


def anthropic_tokens(width: int, height: int) -> int:
    """Anthropic's rule: pixels / 750."""
    return math.ceil(width * height / ANTHROPIC_PIXELS_PER_TOKEN)


def image_tokens(rule: ImageRule, width: int, height: int) -> int:
    """Tokens an image of `width` × `height` (as displayed) costs in a request (0: not sent)."""
    if rule is ImageRule.NONE:
        return 0
    w, h = sent_size(width, height)
    return openai_tokens(w, h) if rule is ImageRule.TILES else anthropic_tokens(w, h)
