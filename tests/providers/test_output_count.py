"""The output limit counted in tokens (SPEC §17): a stream that ignores `max_tokens` is stopped
where the limit clearly passed, whatever its characters per token."""

from __future__ import annotations

import pytest

from soba_nb.providers.output_count import BLOCK_CHARS, OutputCount, stop_tokens
from soba_nb.tokens import get_encoding

LIMIT = 8000


def streamed(piece: str, count: OutputCount, most: int = 10**6) -> int:
    """Pieces added until the count says stop; how many."""
    for index in range(most):
        if count.add(piece):
            return index + 1
    raise AssertionError("never stopped")


@pytest.mark.parametrize(
    "piece",
    ["la ", "🙂" * 50, "word ", "x" * 40, "数据分析" * 5],
    ids=["'la ' (3 characters a token)", "50 emoji a chunk", "plain words", "long runs", "Chinese"],
)
def test_a_runaway_stream_stops_near_the_limit_in_tokens(piece):
    count = OutputCount(LIMIT, "openai", "gpt-4o")
    pieces = streamed(piece, count)
    encoding = get_encoding("o200k_base")
    came = len(encoding.encode_ordinary(piece * pieces))
    assert stop_tokens(LIMIT) < count.tokens <= stop_tokens(LIMIT) + BLOCK_CHARS + len(piece)
    assert came <= stop_tokens(LIMIT) * 1.05  # about where it stopped: never 2.7× or 24× the limit


def test_an_answer_within_the_limit_is_never_stopped():
    count = OutputCount(LIMIT, "openai", "gpt-4o")
    text = "The quarterly revenue grew in every region. " * 700  # about 6,300 tokens
    assert not any(count.add(word + " ") for word in text.split(" "))


def test_a_short_answer_never_loads_a_tokenizer(forbid_tokenizer):
    forbid_tokenizer()
    count = OutputCount(LIMIT, "openai", "gpt-4o")
    assert not count.add("A short answer of a few hundred bytes. " * 20)
    assert count.tokens == 0  # bounded by its bytes, not counted


def test_the_stop_leaves_room_for_a_tokenizer_that_counts_a_little_higher():
    assert stop_tokens(LIMIT) >= LIMIT * 1.1 and stop_tokens(16) >= 16 + 32
