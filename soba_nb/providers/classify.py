"""Classify a server's error answer into the typed errors of `errors.py`.

The important distinction is context overflow (SPEC §6 `context_overflow`): the server
refused the request because the prompt is larger than its real window. Every server
says so in its own words, so detection is by status and wording, and the stated
window and prompt size are read when the message carries numbers (the recovery
compaction uses them). Everything else maps by status: 429 is a rate limit (never an
overflow, whatever the wording), 5xx a server error, other 4xx a rejected request.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from soba_nb.config import MAX_CONTEXT_WINDOW
from soba_nb.providers.errors import (
    BadResponseError,
    ContextOverflowError,
    EmptyAnswerError,
    ProviderError,
    RateLimitError,
    RequestRejectedError,
    ServerError,
)
from soba_nb.text import one_line as text_one_line

HTTP_TOO_MANY_REQUESTS = 429
HTTP_PAYLOAD_TOO_LARGE = 413
"""Anthropic's `request_too_large`: the request body is over its byte limit; a smaller
model input is the only cure, so it is handled as an overflow (with no stated limit)."""
HTTP_SERVER_ERROR_MIN = 500

MAX_MESSAGE_CHARS = 300
"""Server messages are clipped to this many characters in our one-line errors."""

OVERFLOW_CODES = frozenset(
    {
        "context_length_exceeded",  # OpenAI, Groq, DeepSeek, ...
        "exceed_context_size_error",  # llama.cpp server (error type)
        "request_too_large",  # Anthropic 413
    }
)

# Lower-cased phrases that only appear in "your prompt does not fit" answers.
OVERFLOW_PHRASES = (
    "maximum context length",  # OpenAI, vLLM, Ollama, LM Studio
    "context_length_exceeded",
    "context length exceeded",
    "prompt is too long",  # Anthropic
    "exceed context limit",  # Anthropic: input length and `max_tokens` exceed context limit
    "exceeds the available context size",  # llama.cpp server
    "exceed_context_size",
    "longer than the maximum model length",  # vLLM: the decoder prompt (length N) is longer ...
    "exceeds the context window",  # OpenAI Responses wording
    "exceeds the context length",  # Ollama: the input length exceeds the context length
    "exceeds context length",
    "exceeds model's maximum context",
    "too large for model with",  # Mistral
    "context size has been exceeded",  # LM Studio
    "context the overflows",  # LM Studio: "...when context the overflows"
    "maximum number of tokens allowed",  # Gemini (OpenAI-compatible endpoint)
    "reduce the length of the messages",
)

_NUMBER = r"(\d[\d,]*)"
_SIGNED = r"(-?\s*\d[\d,.]*)"
"""Any figure a server may state, a negative or fractional one included (`_stated_absurd_limit`)."""
# Patterns for the window the server states, most specific first.
_LIMIT_TEXTS = (
    rf"maximum context length (?:is|of) {_NUMBER}",
    rf">\s*{_NUMBER}\s*maximum",
    rf"context limit:[\s\d,+]*>\s*{_NUMBER}",
    rf"available context size \({_NUMBER}",
    rf"maximum model length (?:is |of )?{_NUMBER}",
    rf"maximum number of tokens allowed \({_NUMBER}",
    rf"with {_NUMBER} maximum context length",
    rf"context length of only {_NUMBER}",
    rf"context (?:window|length|size) (?:is |of )?{_NUMBER}",
)
_LIMIT_PATTERNS = tuple(re.compile(pattern, re.IGNORECASE) for pattern in _LIMIT_TEXTS)
_STATED_LIMIT_PATTERNS = tuple(
    re.compile(pattern.replace(_NUMBER, _SIGNED), re.IGNORECASE) for pattern in _LIMIT_TEXTS
)
# Patterns for the prompt size the server states.
_REQUESTED_PATTERNS = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        rf"\({_NUMBER} in the messages",
        rf"prompt is too long: {_NUMBER}",
        rf"context limit: {_NUMBER}",
        rf"request \({_NUMBER} tokens?\)",
        rf"prompt \(length {_NUMBER}\)",
        rf"input token count \({_NUMBER}\)",
        rf"prompt contains {_NUMBER}",
        rf"(?:resulted in|you requested|request has|you have|input length of) {_NUMBER}",
        rf"input length \({_NUMBER}\)",
    )
)
# llama.cpp server puts the figures in fields of its error object.
_LIMIT_FIELDS = ("n_ctx", "context_window", "max_context_length")
_REQUESTED_FIELDS = ("n_prompt_tokens", "prompt_tokens")

_WHITESPACE = re.compile(r"\s+")


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A server's message on one line, at most `limit` characters (`soba_nb.text.one_line`)."""
    return text_one_line(text, limit)


_MAX_DIGITS = len(str(MAX_CONTEXT_WINDOW))
"""More digits than this is no token figure (and Python refuses to convert 4,300 or more)."""


def _plausible(value: int | None) -> int | None:
    """`value` when it can be a token figure: 1 to `MAX_CONTEXT_WINDOW`. A server's words are
    data (SPEC §12): "maximum context length is 0 tokens" states no limit at all."""
    return value if value is not None and 0 < value <= MAX_CONTEXT_WINDOW else None


def _to_int(text: str) -> int | None:
    digits = text.replace(",", "")
    return int(digits) if digits.isdigit() and len(digits) <= _MAX_DIGITS else None


def _first_number(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    for pattern in patterns:
        match = pattern.search(text)
        if match:
            value = _plausible(_to_int(match.group(1)))
            if value is not None:
                return value
    return None


def _stated_absurd_limit(details: ErrorDetails) -> bool:
    """The error states a limit, yet none that can be a token figure: "maximum context length
    is -5 tokens", 0, a fraction, thousands of digits, or such a figure in a field."""
    if any(pattern.search(details.message) for pattern in _STATED_LIMIT_PATTERNS):
        return True
    return any(isinstance(details.error.get(name), int | float) for name in _LIMIT_FIELDS)


def _int_field(error: Mapping[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = error.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and _plausible(value) is not None:
            return value
    return None


@dataclass(frozen=True)
class ErrorDetails:
    """What a server's error body says."""

    message: str
    """The server's own message (or the raw body when it has no known shape)."""
    codes: tuple[str, ...]
    """Lower-cased `code` and `type` words of the error object."""
    error: Mapping[str, Any]
    """The error object itself (llama.cpp puts token figures in it)."""


def error_details(body: str) -> ErrorDetails:
    """Read the message and code words out of an error body in any known shape.

    Shapes: OpenAI/llama.cpp `{"error": {"message", "type", "code"}}`, Anthropic
    `{"type": "error", "error": {"type", "message"}}`, Ollama `{"error": "text"}`,
    vLLM `{"object": "error", "message", "type"}`, FastAPI `{"detail": ...}`, or plain text.
    """
    try:
        data: Any = json.loads(body)
    except (ValueError, RecursionError):
        return ErrorDetails(body, (), {})
    if not isinstance(data, dict):
        return ErrorDetails(body, (), {})
    return error_details_from_json(data)


def error_details_from_json(data: Mapping[str, Any]) -> ErrorDetails:
    """Like `error_details`, for an already parsed JSON object (e.g. a stream's error event)."""
    error: Any = data.get("error", data)
    if isinstance(error, str):
        return ErrorDetails(error, (), data)
    if not isinstance(error, Mapping):
        return ErrorDetails(json.dumps(data), (), data)
    message = error.get("message", error.get("detail", data.get("detail")))
    if not isinstance(message, str):
        message = json.dumps(message if message is not None else data)
    codes = tuple(
        str(error[key]).lower() for key in ("code", "type") if isinstance(error.get(key), str)
    )
    return ErrorDetails(message, codes, error)


def overflow_from_details(
    source: str, status: int | None, details: ErrorDetails
) -> ContextOverflowError | None:
    """A `ContextOverflowError` when the details describe a context overflow, else None."""
    if status == HTTP_TOO_MANY_REQUESTS:
        return None
    lowered = details.message.lower()
    is_overflow = (
        status == HTTP_PAYLOAD_TOO_LARGE
        or any(code in OVERFLOW_CODES for code in details.codes)
        or any(phrase in lowered for phrase in OVERFLOW_PHRASES)
    )
    if not is_overflow:
        return None
    limit = _int_field(details.error, _LIMIT_FIELDS) or _first_number(
        _LIMIT_PATTERNS, details.message
    )
    requested = _int_field(details.error, _REQUESTED_FIELDS) or _first_number(
        _REQUESTED_PATTERNS, details.message
    )
    where = f" (HTTP {status})" if status is not None else ""
    return ContextOverflowError(
        f"{source}: context overflow{where}: {one_line(details.message)}",
        limit=limit,
        requested=requested,
        absurd_limit=limit is None and _stated_absurd_limit(details),
    )


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` header: delta-seconds or an HTTP date."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


def retry_after_from_headers(
    headers: Mapping[str, str], *, now: float | None = None
) -> float | None:
    """Retry-After, or OpenAI's millisecond variant `retry-after-ms` when present."""
    lowered = {key.lower(): value for key, value in headers.items()}
    millis = parse_retry_after(lowered.get("retry-after-ms"), now=now)
    if millis is not None:
        return millis / 1000
    return parse_retry_after(lowered.get("retry-after"), now=now)


def classify_http_error(
    source: str,
    status: int,
    body: str,
    headers: Mapping[str, str] | None = None,
    *,
    now: float | None = None,
) -> ProviderError:
    """The typed error for an HTTP answer with an error status.

    `source` names the provider in the message (e.g. "openai (127.0.0.1:8080)").
    Overflow is recognised before the status rules, except for 429: a rate limit is
    never an overflow even when its wording mentions the context.
    """
    details = error_details(body)
    retry_after = retry_after_from_headers(headers or {}, now=now)
    message = f"{source}: HTTP {status}: {one_line(details.message) or '(empty body)'}"
    if status == HTTP_TOO_MANY_REQUESTS:
        return RateLimitError(message, retry_after_s=retry_after)
    overflow = overflow_from_details(source, status, details)
    if overflow is not None:
        return overflow
    if status >= HTTP_SERVER_ERROR_MIN:
        return ServerError(message, retry_after_s=retry_after)
    return RequestRejectedError(message)


def classify_stream_error(source: str, payload: Mapping[str, Any]) -> ProviderError:
    """The typed error for an error object sent inside a 200 stream.

    Anthropic sends `event: error` (e.g. `overloaded_error`); vLLM and llama.cpp may send
    `data: {"error": ...}`. An overflow stays an overflow; anything else is treated as a
    server-side failure, so it is retried.
    """
    details = error_details_from_json(payload)
    overflow = overflow_from_details(source, None, details)
    if overflow is not None:
        return overflow
    if any("rate_limit" in code for code in details.codes):
        return RateLimitError(f"{source}: error in stream: {one_line(details.message)}")
    return ServerError(f"{source}: error in stream: {one_line(details.message)}")


def parse_json_answer(source: str, text: str) -> dict[str, Any]:
    """Parse a 200 answer's JSON body; anything but a JSON object is a `BadResponseError`.

    An empty body is an `EmptyAnswerError` (a failure, never an empty answer), like an
    empty stream.
    """
    if not text.strip():
        raise EmptyAnswerError(f"{source}: the server answered 200 with an empty body")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadResponseError(
            f"{source}: answer is not valid JSON ({exc.msg}): {one_line(text)}"
        ) from None
    except RecursionError:
        raise BadResponseError(f"{source}: answer JSON is nested too deeply") from None
    if not isinstance(data, dict):
        raise BadResponseError(f"{source}: answer is not a JSON object: {one_line(text)}")
    return data
