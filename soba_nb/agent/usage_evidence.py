"""What a provider's usage figure tells about the prompt it measured (SPEC §2, §13).

A usage figure is evidence, not truth. It may be the server's own count (another tokenizer, a
chat template, tool schemas left out: llama.cpp's server renders no tools for most models), or
a gateway's count made up when the server sent none (LiteLLM counts a llama.cpp stream with
its own tokenizer: 341–502 where the server counted 432–598 and we sent about 1,440). None of
those differences is a cut prompt, and one figure cannot tell them from one.

What does tell is a **ceiling**: a server that cuts prompts silently (Ollama does when its
`num_ctx` is smaller) reports about the same count however much more is sent. So a cut is
concluded only when the server's counts stop growing with what is sent, two steps in a row
(`ceiling`): one step that does not grow can be a figure on another scale (a gateway's count
after the server's own), two cannot. A figure that cannot be a count of any request at all —
less than half of the system prompt every request starts with — is not used (`is_count`).

Or a figure far below anything a tokenizer or unrendered tool schemas could explain: under
half of the text of the request's messages alone (the conversation: no system prompt, no tool
schemas — a server may not render the schemas, and LiteLLM's own count of a llama.cpp stream
left both out: 478 where the conversation was 446 of our 1,665) is a cut prompt at once
(`cut_at_once`): Ollama's `num_ctx` cut of a long first request is caught on its first figure
(SPEC §17).

Images are left out of every comparison: their tokens are someone else's rule (OpenAI's tiles,
a local vision model's patches, or not counted at all), so what we estimate for them is taken
off what was sent (`UsageEntry.sent_image_tokens`), and the evidence is the growth of text.

No figure at all (a server that ignores `stream_options.include_usage`): the request is
recorded with our own counts, marked `estimated` (`transcript.estimated`), so the cost cap holds
(SPEC §11, §16). Those entries are priced, never evidence about the server's counting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from soba_nb.messages import ToolCall
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import CapsuleEntry, Entry, UsageEntry

TRUNCATION_SHARE = 0.5
"""A step "does not grow" when the server's count grew by less than this share of what it
should have: the growth we sent, at the server's own rate per token of ours."""
TRUNCATION_MIN_TOKENS = 1024
"""Below this size, tokenizers may disagree too much for the comparison to mean anything."""
TRUNCATION_MIN_GROWTH = 256
"""A step counts only when the request grew by this much (our count) since the figure before."""
STALLED_STEPS = 2
"""Steps in a row whose counts did not grow: the ceiling of a server that cuts prompts."""
COUNT_FLOOR_SHARE = 0.5
"""Every request carries the system prompt: a count below this share of our count of it is
no count of the request (whatever the tokenizer), e.g. a server that reports 0."""
CUT_AT_ONCE_SHARE = 0.5
"""A count under this share of the messages' text (ours, the conversation alone: no tokenizer
differs by half, and the system prompt and tool schemas a count may leave out are left out) is
a prompt cut at once."""


@dataclass(frozen=True)
class Figure:
    """One usage figure and the request it measured."""

    count: int
    """The server's input tokens."""
    sent: int
    """Our count of the request."""


def stalled(earlier: Figure, later: Figure) -> bool:
    """`later` was sent larger by at least `TRUNCATION_MIN_GROWTH` (the earlier prompt is its
    prefix), yet the server's count grew by less than `TRUNCATION_SHARE` of that growth at its
    own rate per token of ours."""
    growth = later.sent - earlier.sent
    if growth < TRUNCATION_MIN_GROWTH or earlier.sent <= 0:
        return False
    rate = min(earlier.count / earlier.sent, 1.0)
    return later.count < earlier.count + TRUNCATION_SHARE * rate * growth


def figures_since_capsule(path: Sequence[Entry], limit: int = STALLED_STEPS) -> list[Figure]:
    """The latest `limit` inference figures on `path` after its latest capsule, oldest first.

    Only figures whose request's prompt is a prefix of the next one compare: a capsule breaks
    that; a figure judged cut or not a count is left out."""
    found: list[Figure] = []
    for entry in reversed(path):
        if isinstance(entry, CapsuleEntry):
            break
        if (
            isinstance(entry, UsageEntry)
            and entry.operation == "inference"
            and entry.sent_tokens
            and not entry.truncated
            and entry.estimated is not True
        ):
            found.append(Figure(entry.input_tokens, text_sent(entry.sent_tokens, entry.sent_image_tokens)))
            if len(found) == limit:
                break
    return found[::-1]


def ceiling(path: Sequence[Entry], current: Figure) -> int | None:
    """The size the server cuts prompts to, when its counts stopped growing with what was sent
    for `STALLED_STEPS` steps in a row ending at `current` (not yet on `path`); else None."""
    if current.sent < TRUNCATION_MIN_TOKENS:
        return None
    chain = [*figures_since_capsule(path, STALLED_STEPS), current]
    if len(chain) <= STALLED_STEPS:
        return None
    if all(stalled(earlier, later) for earlier, later in zip(chain[:-1], chain[1:], strict=True)):
        return max(figure.count for figure in chain[1:])
    return None


def cut_prompt(path: Sequence[Entry], count: int, *, text: int, messages_text: int) -> tuple[int, str] | None:
    """The size a server cut a prompt to (`count` measured a request of `text` tokens of text,
    `messages_text` of them its messages'), and how that shows; None for no cut."""
    if cut_at_once(count, messages_text):
        return count, "less than half of the messages' text alone"
    cut_at = ceiling(path, Figure(count, text))
    return None if cut_at is None else (cut_at, "and its counts have stopped growing with what is sent")


def text_sent(sent: int, image_tokens: int | object) -> int:
    """What was sent but for our estimate of its images (absent or unset: none)."""
    return sent - image_tokens if isinstance(image_tokens, int) else sent


def cut_at_once(count: int, messages_text: int) -> bool:
    """One figure is a cut prompt: under `CUT_AT_ONCE_SHARE` of our count of the messages'
    text (the conversation: no system prompt, no tool schemas, no images), once that text is
    large enough for the comparison to mean anything (`TRUNCATION_MIN_TOKENS`)."""
    return messages_text >= TRUNCATION_MIN_TOKENS and count < CUT_AT_ONCE_SHARE * messages_text


def is_count(count: int, system_tokens: int) -> bool:
    """A figure that can be a count of a request that starts with a system prompt of
    `system_tokens` (our count)."""
    return count >= COUNT_FLOOR_SHARE * system_tokens


def received_tokens(text: str, calls: Sequence[ToolCall], counter: TokenCounter) -> int:
    """Our count of what a server streamed back: the answer's text and each tool call's name
    and arguments."""
    return counter.count_text(text) + sum(counter.count_text(call.name) + counter.count_text(call.arguments) for call in calls)
