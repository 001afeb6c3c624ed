"""How long soba waits on a model server, and what counts as the answer moving on (SPEC §12).

SPEC §12: every wait on a provider ends within `WAIT_CEILING_S` with default settings — a stall
before or after the headers, keep-alive pings with nothing else, and an answer that streams on
past `maxOutputTokens` included — while a stream that keeps delivering tokens within
`maxOutputTokens` is progress, not a wait (a slow local model may take minutes).

One *wait* is the time the answer does not grow. `Silence` is its clock: one per call, started
with the call, reset only when the answer grows, and bounded by the idle limit
(`%config SobaMagics.idle_timeout_s`). It is shared by all the attempts of a call and their
backoff waits, so a retry never restarts it. Before the first byte, a local server reading a
long prompt is given longer (`Silence.reading_s`, SPEC §17, `soba_nb.providers.reading`):

- A retry is made only while there is time left of the wait for it (a reset connection, a quick
  5xx, a short `Retry-After`); a backoff that would pass the idle limit is not started.
- A stall (the idle limit reached) is therefore never retried. Retrying it once, as before,
  made two idle waits of 60 s plus a backoff — 122 s of nothing on the screen — and a server
  that sent nothing for a whole minute is seldom saved by asking again; the user can ask again.
- What grows the answer is content the parser folds into it: text, tool-call pieces, reasoning
  (`TextSink`). Headers, SSE comments, Anthropic `ping` events and empty deltas do not, so a
  stream of keep-alives is a stall like any other.
- Everything that counts as growth also counts toward `maxOutputTokens`, so a stream cannot
  keep a call alive by growing forever either: once it is clearly past the limit it is stopped
  there, as a server honouring the limit would have (finish reason `length`).

So the longest wait is the idle limit plus one poll of the caller's thread (`longest_wait_s`),
whatever the retry policy; the overall deadline (`timeout_s`, the turn's `turn_timeout_s`) bounds
the rest, a slow answer that keeps coming.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from soba_nb.messages import ToolCall
from soba_nb.providers.base import TextCallback
from soba_nb.providers.errors import StalledError
from soba_nb.providers.output_count import OutputCount
from soba_nb.providers.reading import LOCAL_READING_TOKENS_PER_S

WAIT_CEILING_S = 90.0
"""SPEC §12: every wait on a provider ends within this with default settings (a test checks
the defaults below against it)."""
DEFAULT_IDLE_TIMEOUT_S = 60.0
"""Longest wait for the answer to grow: from the request to the answer's first content (a long
prompt may take a while to process), retries and their backoff included, and between two pieces
of a stream. `%config SobaMagics.idle_timeout_s`. A minute leaves room for a slow server to read
a long prompt and stays well under `WAIT_CEILING_S`."""
POLL_S = 0.1
"""How often the caller's thread looks at cancel, the deadline and the silence clock: the most
a wait can outlast its limit before it is noticed."""
IDLE_SETTING = "%config SobaMagics.idle_timeout_s"
"""How error messages tell the user to change the idle limit."""

LENGTH_FINISH = "length"
"""The finish reason of an answer stopped at its output limit (what a server says when it
stops at `max_tokens` itself; the loop keeps such an answer, the summarizer refuses it)."""


def longest_wait_s(idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S) -> float:
    """The longest one wait on a provider lasts with this idle limit: the limit (retries and
    their backoff fit inside it or are not made) plus one poll before the caller notices. A
    server on this machine or a private network reading a long prompt is the one exception,
    before its first byte only (`Silence.reading_s`, SPEC §17): 1 s per 40 prompt tokens."""
    return idle_timeout_s + POLL_S


def content_text(value: Any, skip: Iterable[str] = ()) -> str:
    """The strings of a JSON value (a delta, a content block) joined, leaving out the fields
    named in `skip` at every depth (its shown text, its type, its ids): what it adds to an
    answer. Numbers, booleans and empty strings add nothing. Walked with a stack, not
    recursion: a server's JSON may be nested as deep as the parser allows."""
    skipped = frozenset(skip)
    found: list[str] = []
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            pending.extend(child for key, child in item.items() if key not in skipped)
        elif isinstance(item, list):
            pending.extend(item)
    return "".join(found)


class Silence:
    """The clock of one call's wait: how long since the answer last grew (see the module)."""

    def __init__(
        self,
        limit_s: float,
        *,
        reading_s: float | None = None,
        reading_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limit_s = limit_s
        """The idle limit."""
        self.reading_s = max(limit_s, reading_s or 0.0)
        """The wait for the first byte: the idle limit, or more for a local server reading a
        long prompt (`soba_nb.providers.reading`, SPEC §17); the idle limit once the answer grows."""
        self.reading_tokens = reading_tokens
        """The prompt a local server was given `reading_s` to read (None: no such allowance)."""
        self._clock = clock
        self._since = clock()
        self.grown = False
        """True once the answer has some content: a stall after that is mid-answer."""
        self.keepalives = 0
        """Lines heard since the answer last grew (comments, pings, empty events): a stall
        with some says so, since the connection itself was alive."""

    def progress(self) -> None:
        """The answer grew: a new wait starts."""
        self._since = self._clock()
        self.grown = True
        self.keepalives = 0

    def heard(self) -> None:
        """A line came that may not grow the answer (its parser decides)."""
        self.keepalives += 1

    @property
    def reading(self) -> bool:
        """True while a local server is given more than the idle limit to read the prompt."""
        return not self.grown and self.reading_s > self.limit_s

    def remaining(self) -> float:
        """Seconds left of the idle limit (never negative): what a retry and its backoff must
        fit in. Never the reading allowance: a failure after a local server has read for longer
        than the idle limit is not retried, since asking again makes it read the whole prompt
        again, with nothing of the allowance given back."""
        return max(0.0, self.limit_s - (self._clock() - self._since))

    def expired(self) -> bool:
        """True once the answer has not grown for the idle limit (before the first byte, for
        the reading allowance)."""
        return self._clock() - self._since > (self.reading_s if self.reading else self.limit_s)

    def stalled(self, source: str, *, headers: bool) -> StalledError:
        """The one-line error for a wait that reached the idle limit (or the reading allowance).

        A local server that has not answered when its reading allowance runs out is not asked
        again either: it would read the same long prompt from the start, minutes more; a shorter
        context (`%compact`), a faster model or a higher idle limit is what helps."""
        where = "mid-answer" if self.grown else ("after the headers" if headers else "before the headers")
        if self.keepalives:
            where += ", only pings or empty events"
        if self.reading:
            return StalledError(
                f"{source}: nothing of the answer came for {self.reading_s:.0f} s ({where}), the time a local "
                f"server is given to read {self.reading_tokens or 0:,} prompt tokens (1 s per "
                f"{LOCAL_READING_TOKENS_PER_S}, at least the idle limit); not retried, it would read them all again; {IDLE_SETTING} above that gives it longer"
            )
        return StalledError(
            f"{source}: nothing of the answer came for {self.limit_s:g} s ({where}); "
            f"that is the idle limit, {IDLE_SETTING} changes it"
        )

    def retry_refused(self, error: BaseException, delay_s: float) -> str:
        """`error`'s message saying why it is not retried."""
        waited = self._clock() - self._since
        if self.reading and waited > self.limit_s:
            return (
                f"{error} (not retried: the local server had been reading the prompt for {waited:.0f} s, "
                "and asking again would make it read it all again)"
            )
        return (
            f"{error} (not retried: a {delay_s:.1f} s wait would pass the idle limit of "
            f"{self.limit_s:g} s, {IDLE_SETTING})"
        )


class AnswerOverrun(Exception):
    """A stream went clearly past `maxOutputTokens` (`output_count.stop_tokens`); raised by
    `TextSink` to stop reading it. Internal: the provider turns it into an answer with finish
    `length`, keeping the calls that were still arriving (cut)."""


class TextSink:
    """The answer as a parser reads it: shows its text and marks how far it has grown.

    Parsers call the sink with each piece of answer text, and `grow` with any other content
    (tool-call pieces, reasoning): both reset the call's `Silence` and count toward
    `maxOutputTokens` in tokens (`OutputCount`), which raises `AnswerOverrun` once clearly
    passed. A parser sets `calls` to what tells the calls so far, so a stream stopped there
    keeps them (cut)."""

    def __init__(
        self,
        on_text: TextCallback | None,
        *,
        silence: Silence | None = None,
        count: OutputCount | None = None,
    ):
        self._on_text = on_text
        self.silence = silence
        self.delivered = False
        """True once any text reached the callback: a failure after that is not retried,
        or the user would see the start of the answer twice."""
        self.shown: list[str] = []
        """The text shown so far: the answer kept when the stream is stopped at its limit."""
        self.count = count
        """The answer's tokens against `maxOutputTokens` (None: not counted)."""
        self.calls: Callable[[], list[ToolCall]] = list
        """The tool calls so far, arguments as they came (the parser's)."""

    def __call__(self, text: str) -> None:
        """A piece of answer text: shown, then counted (what was shown is kept if it stops)."""
        if not text:
            return
        self.show(text)
        self.grow(text)

    def show(self, text: str) -> None:
        """Show text without counting it (a whole answer that came in one piece)."""
        if not text:
            return
        self.delivered = True
        self.shown.append(text)
        if self._on_text is not None:
            self._on_text(text)

    def working(self) -> None:
        """The server says how far it is (a long prompt computed chunk by chunk): progress, so
        the silence starts again, but no content toward `maxOutputTokens`."""
        if self.silence is not None:
            self.silence.progress()

    def grow(self, content: str) -> None:
        """The answer gained `content` (text, a tool call's piece, reasoning)."""
        if not content:
            return
        if self.silence is not None:
            self.silence.progress()
        if self.count is not None and self.count.add(content):
            raise AnswerOverrun(f"about {self.count.tokens:,} tokens")
