"""The arithmetic of effective tokens (SPEC §2): a provider's figure for one request, carried
to the input as it is now by our own counts.

A figure measured what was sent, not the path: when the assembler clipped tool outputs to
fit (`model_input._emergency_clip`), the request held less than the path by our count, and
the figure is of that smaller request. Paired with the path's count instead, the clip read as
a server that counts that much less, and every later figure — a capsule's `tokensBefore`
carries it on — understated the input by it: an input the clip had kept under the hard limit
was then sent whole, over the server's window (6,102 tokens to a 6,000-token window, sized
4,880). So the figure pairs with `measured_count`: the usage entry's `sentTokens` when that is
less than the path's count.
"""

from __future__ import annotations


def effective_from(figure: int, counted_then: int, counted_now: int) -> int:
    """The effective size now, from a provider's `figure` for an input we counted
    `counted_then`, the input being `counted_now` by our count (SPEC §2: the figure plus what
    was added since, minus what a compaction removed).

    Growth and a server that counts more carry over as a difference. But a server that counts
    less, after the input shrank (a capsule replaced most of it), has what was removed taken
    off at its own rate, not ours: a difference of -1,770 carried onto a one-line capsule's
    1,011 tokens made a size of -759. The rate keeps it a size, and is the larger of the two."""
    carried = figure + (counted_now - counted_then)
    if figure < counted_then and counted_now < counted_then:
        return max(carried, -(-figure * counted_now // counted_then))
    return carried


def measured_count(path_count: int, sent: int | None) -> int:
    """Our count of what a usage figure measured: the path's count where its request was
    sent whole, `sent` (the usage entry's `sentTokens`) where less was sent — tool outputs
    clipped to fit, images left out (those then count as sent: never under). None (or 0, no
    count of a request): an entry written without `sentTokens`, paired with the path."""
    return min(path_count, sent) if sent else path_count
