"""Typed provider errors. Classification of raw HTTP answers lives in `classify.py`."""

from __future__ import annotations


class ProviderError(Exception):
    """Any failure talking to a model server. The message is one clear line."""

    retryable: bool = False


class ContextOverflowError(ProviderError):
    """The server refused the request because the prompt is larger than its window."""

    def __init__(
        self, message: str, *, limit: int | None = None, requested: int | None = None, absurd_limit: bool = False
    ):
        super().__init__(message)
        self.limit = limit
        """The window the server stated in its error, when it could be read."""
        self.absurd_limit = absurd_limit
        """The error states a limit that is no token figure (0, negative, thousands of digits):
        the server's words are data (SPEC §12, §16), never a window or a diagnosis."""
        self.requested = requested
        """The prompt size the server stated in its error, when it could be read."""


class RateLimitError(ProviderError):
    """HTTP 429. Retryable; never an overflow."""

    retryable = True

    def __init__(self, message: str, *, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServerError(ProviderError):
    """HTTP 5xx or a dropped connection. Retryable."""

    retryable = True

    def __init__(self, message: str, *, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StalledError(ServerError):
    """The answer did not grow for the idle limit (before it began, or mid-stream).

    Not retried: the idle limit bounds the whole wait, retries included, and a stall has used
    it up (SPEC §12: every wait on a provider ends within 90 s; see `providers.waits`)."""

    retryable = False


class IncompleteResponseError(ProviderError):
    """A stream that ended without a finish reason (some servers answer an oversized
    prompt with HTTP 200 and an empty stream). Never treated as an empty answer."""

    retryable = True


class EmptyAnswerError(IncompleteResponseError):
    """HTTP 200 with nothing in it: an empty body, or a stream with no event at all.

    llama.cpp and Ollama answer so when the prompt is at or over their real window; for a
    request near the window it is therefore an overflow, not a reason for ordinary retries."""


class BadResponseError(ProviderError):
    """The server answered something we cannot parse (malformed JSON, wrong shape)."""


class RequestRejectedError(ProviderError):
    """A 4xx that is not an overflow or rate limit (bad key, bad model name, ...)."""


class ProviderTimeout(ProviderError):
    """The request's deadline passed."""


class Cancelled(ProviderError):
    """The caller's cancel signal was set; the stream was closed."""


class MissingApiKeyError(ProviderError):
    """The environment variable named by `apiKeyEnv` is not set."""
