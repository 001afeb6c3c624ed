"""Classification of servers' error answers (SPEC §6 `context_overflow`, §9 retries)."""

from __future__ import annotations

import json
from email.utils import formatdate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from soba_nb.providers.classify import (
    MAX_MESSAGE_CHARS,
    classify_http_error,
    classify_stream_error,
    parse_json_answer,
    parse_retry_after,
)
from soba_nb.providers.errors import (
    BadResponseError,
    ContextOverflowError,
    IncompleteResponseError,
    ProviderError,
    RateLimitError,
    RequestRejectedError,
    ServerError,
)

SOURCE = "openai (127.0.0.1:8080)"


def openai_error(message: str, code: str | None = None, kind: str = "invalid_request_error") -> str:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


# Each server's own overflow answer: (status, body, stated limit, stated prompt size).
OVERFLOW_ANSWERS = {
    "openai": (
        400,
        openai_error(
            "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
            code="context_length_exceeded",
        ),
        8192,
        9000,
    ),
    "openai code only": (
        400,
        openai_error("Input too long.", code="context_length_exceeded"),
        None,
        None,
    ),
    "anthropic": (
        400,
        json.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 210000 tokens > 200000 maximum",
                },
            }
        ),
        200000,
        210000,
    ),
    "anthropic input plus max_tokens": (
        400,
        json.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "input length and `max_tokens` exceed context limit: 197000 + 8000 > 200000, "
                    "decrease input length or `max_tokens` and try again",
                },
            }
        ),
        200000,
        197000,
    ),
    "anthropic 413": (
        413,
        json.dumps(
            {
                "type": "error",
                "error": {
                    "type": "request_too_large",
                    "message": "Request exceeds the maximum size",
                },
            }
        ),
        None,
        None,
    ),
    "llama.cpp with figures": (
        400,
        json.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "request (9000 tokens) exceeds the available context size (8192 tokens), try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 9000,
                    "n_ctx": 8192,
                }
            }
        ),
        8192,
        9000,
    ),
    "llama.cpp older wording": (
        400,
        json.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                }
            }
        ),
        None,
        None,
    ),
    "vllm requested": (
        400,
        json.dumps(
            {
                "object": "error",
                "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
                "(4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        ),
        4096,
        4000,
    ),
    "vllm input tokens": (
        400,
        json.dumps(
            {
                "object": "error",
                "message": "This model's maximum context length is 32768 tokens. However, your request has 40000 "
                "input tokens. Please reduce the length of the input messages.",
                "type": "BadRequestError",
            }
        ),
        32768,
        40000,
    ),
    "vllm decoder prompt": (
        400,
        json.dumps(
            {
                "object": "error",
                "message": "The decoder prompt (length 5000) is longer than the maximum model length of 4096. Make sure that `max_model_len` is no smaller than the number of text tokens.",
            }
        ),
        4096,
        5000,
    ),
    "ollama": (
        400,
        json.dumps({"error": "the input length exceeds the context length"}),
        None,
        None,
    ),
    "ollama 500": (
        500,
        json.dumps({"error": "input length exceeds maximum context length"}),
        None,
        None,
    ),
    "lm studio": (
        400,
        json.dumps(
            {
                "error": "Trying to keep the first 5000 tokens when context the overflows. However, the model is loaded "
                "with context length of only 4096 tokens, which is not enough."
            }
        ),
        4096,
        None,
    ),
    "gemini compatible": (
        400,
        json.dumps(
            [
                {
                    "error": {
                        "message": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."
                    }
                }
            ]
        ),
        1048576,
        1200000,
    ),
    "numbers with commas": (
        400,
        openai_error(
            "This model's maximum context length is 128,000 tokens. However, your messages resulted in 130,512 tokens."
        ),
        128000,
        130512,
    ),
}


@pytest.mark.parametrize("server_kind", list(OVERFLOW_ANSWERS))
def test_each_servers_overflow_wording_is_recognised(server_kind: str) -> None:
    status, body, limit, requested = OVERFLOW_ANSWERS[server_kind]

    error = classify_http_error(SOURCE, status, body)

    assert isinstance(error, ContextOverflowError), str(error)
    assert (error.limit, error.requested) == (limit, requested)
    assert not error.retryable
    assert str(error).startswith(f"{SOURCE}: context overflow")


def test_rate_limit_is_never_an_overflow_even_when_it_mentions_context() -> None:
    body = openai_error(
        "maximum context length exceeded for your tier", code="context_length_exceeded"
    )
    error = classify_http_error(SOURCE, 429, body, {"Retry-After": "7"})
    assert isinstance(error, RateLimitError)
    assert error.retry_after_s == 7
    assert error.retryable


def test_retry_after_as_http_date() -> None:
    now = 1_700_000_000.0
    header = formatdate(now + 30, usegmt=True)
    error = classify_http_error(SOURCE, 429, "slow down", {"retry-after": header}, now=now)
    assert isinstance(error, RateLimitError)
    assert error.retry_after_s == pytest.approx(30, abs=1)


def test_retry_after_ms_wins() -> None:
    error = classify_http_error(SOURCE, 429, "", {"retry-after-ms": "1500", "retry-after": "2"})
    assert isinstance(error, RateLimitError) and error.retry_after_s == 1.5


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("3", 3.0),
        ("0.5", 0.5),
        (" 10 ", 10.0),
        ("-4", 0.0),
        ("soon", None),
        ("", None),
        (None, None),
        ("nan", None),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value) == expected


def test_past_http_date_means_no_wait() -> None:
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1_700_000_000.0) == 0.0


@pytest.mark.parametrize("status", [500, 502, 503, 529])
def test_server_errors_are_retryable(status: int) -> None:
    error = classify_http_error(
        SOURCE, status, openai_error("upstream failed", kind="server_error"), {"Retry-After": "2"}
    )
    assert isinstance(error, ServerError) and error.retryable
    assert error.retry_after_s == 2


def test_other_4xx_is_a_one_line_rejection_naming_provider_status_and_message() -> None:
    long_message = "The model `gpt-99`\ndoes not exist " + "x" * 2000
    error = classify_http_error(SOURCE, 404, openai_error(long_message, code="model_not_found"))

    assert isinstance(error, RequestRejectedError) and not error.retryable
    text = str(error)
    assert text.startswith(f"{SOURCE}: HTTP 404: The model `gpt-99` does not exist")
    assert "\n" not in text
    assert len(text) <= len(SOURCE) + len(": HTTP 404: ") + MAX_MESSAGE_CHARS


def test_plain_text_and_empty_bodies() -> None:
    assert "Bad Gateway" in str(classify_http_error(SOURCE, 502, "<html>Bad Gateway</html>"))
    assert "(empty body)" in str(classify_http_error(SOURCE, 401, ""))


def test_stream_error_events() -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert isinstance(classify_stream_error("anthropic", overloaded), ServerError)
    limited = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    assert isinstance(classify_stream_error("anthropic", limited), RateLimitError)
    too_long = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 5 tokens > 4 maximum",
        },
    }
    error = classify_stream_error("anthropic", too_long)
    assert isinstance(error, ContextOverflowError) and error.limit == 4


@pytest.mark.parametrize(
    "stated",
    ["0", "-5", "100000001", "1" + "0" * 30, "9" * 5000],
    ids=["zero", "negative", "over 100,000,000", "10^30", "5,000 digits"],
)
def test_an_absurd_stated_limit_is_no_limit(stated: str) -> None:
    """A server's words are data (SPEC §12): the overflow stays an overflow, without a limit."""
    body = openai_error(
        f"This model's maximum context length is {stated} tokens. However, your messages resulted in {stated} tokens.",
        "context_length_exceeded",
    )
    error = classify_http_error(SOURCE, 400, body)
    assert isinstance(error, ContextOverflowError)
    assert (error.limit, error.requested) == (None, None)


@pytest.mark.parametrize("n_ctx", [0, -4096, 10**12, True])
def test_an_absurd_n_ctx_field_gives_way_to_the_message(n_ctx: object) -> None:
    body = json.dumps(
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size (4096 tokens), try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": -1,
                "n_ctx": n_ctx,
            }
        }
    )
    error = classify_http_error(SOURCE, 400, body)
    assert isinstance(error, ContextOverflowError)
    assert (error.limit, error.requested) == (4096, None)


@pytest.mark.parametrize("body", ["{not json", "[1, 2]", '"text"'])
def test_unparseable_200_answers_are_bad_responses(body: str) -> None:
    with pytest.raises(BadResponseError, match=SOURCE.split(" ")[0]):
        parse_json_answer(SOURCE, body)


def test_an_empty_200_body_is_an_incomplete_answer() -> None:
    with pytest.raises(IncompleteResponseError, match="empty body"):
        parse_json_answer(SOURCE, "  ")


@given(st.integers(min_value=400, max_value=599), st.text())
def test_classification_never_crashes_and_stays_one_line(status: int, body: str) -> None:
    error = classify_http_error(SOURCE, status, body)
    assert isinstance(error, ProviderError)
    assert "\n" not in str(error)
    if status == 429:
        assert isinstance(error, RateLimitError)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    )
)
def test_classification_of_any_json_body(data: object) -> None:
    error = classify_http_error(SOURCE, 400, json.dumps(data))
    assert isinstance(error, ProviderError)
