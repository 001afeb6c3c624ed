"""How much of `maxOutputTokens` a streamed answer has used, counted in tokens (SPEC §17).

A server that honours `max_tokens` stops there itself (finish `length`); one that does not
streams on, and the stream is stopped where the limit clearly passed. Counted in tokens, not
characters: `"la "` is one token in three characters and an emoji two or three tokens in one,
so a character count let one run to 21,420 tokens and the other to 192,900 against 8,000.

The tokenizer is the model family's (`tokens.choose_encoding`), raw: no fallback factor (which
would stop an honest answer of a family we count high), and a little slack for tokenizers
that differ from the server's. It is loaded only once the answer could have passed the limit:
a token is at least one byte, so until the answer's UTF-8 bytes pass the stopping point it has
not, and most answers never load it.
"""

from __future__ import annotations

from collections.abc import Callable

from soba_nb.tokens import choose_encoding, get_encoding

STOP_FACTOR = 1.1
"""The stream is stopped once our count passes this multiple of `maxOutputTokens` (plus
`STOP_SLACK_TOKENS`): our tokenizer may count a server's tokens a little higher than it does."""
STOP_SLACK_TOKENS = 32
"""So a small limit (a 16-token probe) is not cut by the noise of a few long words."""


def stop_tokens(max_output_tokens: int) -> int:
    """Tokens an answer may bring before its stream is stopped."""
    return int(max_output_tokens * STOP_FACTOR) + STOP_SLACK_TOKENS


BLOCK_CHARS = 256
"""Text is counted in blocks of about this many characters, cut before a space: a stream's
pieces need not end where tokens do ("revenue" + " grew" is one token more than " revenue" +
" grew"), and counting each piece alone counted plain prose at twice its tokens."""


class OutputCount:
    """The tokens of an answer's content as it streams in (text, tool call arguments,
    reasoning): `add` says when it has passed `stop_tokens`."""

    def __init__(self, max_output_tokens: int, provider: str, model: str):
        self.stop = stop_tokens(max_output_tokens)
        self._encoding = choose_encoding(provider, model).encoding
        self._count: Callable[[str], int] | None = None
        self._pending = ""
        self._bytes = 0
        self.tokens = 0
        """Tokens counted so far (0 until the tokenizer is needed: the bytes bound them)."""

    def add(self, text: str) -> bool:
        """Count `text`; True once the answer is past the stopping point."""
        if not text:
            return False
        self._pending += text
        if self._count is None:
            self._bytes += len(text.encode("utf-8", "surrogatepass"))
            if self._bytes <= self.stop:
                return False  # fewer bytes than the stop: fewer tokens too
            encoding = get_encoding(self._encoding)
            self._count = lambda piece: len(encoding.encode_ordinary(piece))
        if len(self._pending) >= BLOCK_CHARS:
            cut = self._pending.rfind(" ", 1)
            cut = cut if cut > 0 else len(self._pending)
            self.tokens += self._count(self._pending[:cut])
            self._pending = self._pending[cut:]
        return self.tokens > self.stop
