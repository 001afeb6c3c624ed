"""What the HTTP providers share: keys, headers, deadlines, retries, streaming guards.

`HttpProvider.complete` is the whole request life cycle; a wire format (OpenAI-style,
Anthropic) only says how to build the body and how to read an answer or a stream.

- The API key is read from the environment variable that `ModelSettings.api_key_env`
  names, at each call (so a key exported after loading works), and never appears in an
  error message: anything the server echoes back is redacted (`soba_nb.providers.keys`).
- Every request carries `X-Soba-Operation` and `X-Soba-Operation-Id` (SPEC §9), retries too.
- Every network wait is bounded: one `Silence` per call ends any wait for the answer to grow
  at the idle limit, retries included (`soba_nb.providers.waits`, SPEC §12); the overall
  deadline is checked between stream chunks; httpx's own timeouts are a backstop.
- A stream that runs on clearly past `maxOutputTokens` is stopped there: the answer so far,
  finish reason `length`.
- A stream that brings nothing — no event, no finish reason, or a finished answer with no text
  and no tool call (a gateway's disguised overflow, SPEC §13) — is asked again once unstreamed,
  where an overflow shows its words.
- Cancellation is checked between stream chunks and during backoff waits; leaving the
  stream closes the connection.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from soba_nb.config import ModelSettings
from soba_nb.providers.base import (
    ModelRequest,
    ModelResponse,
    Operation,
    TextCallback,
    WaitCallback,
)
from soba_nb.providers.classify import (
    classify_http_error,
    classify_stream_error,
    one_line,
    parse_json_answer,
)
from soba_nb.providers.errors import (
    BadResponseError,
    ContextOverflowError,
    EmptyAnswerError,
    IncompleteResponseError,
    ProviderError,
    ServerError,
    StalledError,
)
from soba_nb.providers.feed import WAITING, Feed
from soba_nb.providers.keys import is_local_url, read_api_key, redact
from soba_nb.providers.output_count import OutputCount
from soba_nb.providers.reading import (
    is_private_server,
    prompt_tokens,
    reading_allowance_s,
    reading_status,
)
from soba_nb.providers.retry import (
    DEFAULT_BACKOFF_BASE_S,
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_JITTER_RATIO,
    DEFAULT_MAX_RETRIES,
    DEFAULT_RETRY_AFTER_CAP_S,
    Deadline,
    RetryPolicy,
    call_with_retries,
    check_cancel,
)
from soba_nb.providers.sse import ServerSentEvent, iter_sse_events
from soba_nb.providers.waits import (
    DEFAULT_IDLE_TIMEOUT_S,
    IDLE_SETTING,
    LENGTH_FINISH,
    AnswerOverrun,
    Silence,
    TextSink,
)

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_IDLE_TIMEOUT_S",  # defined with the other waits; the settings read it here
    "DEFAULT_TIMEOUT_S",
    "OPERATION_HEADER",
    "OPERATION_ID_HEADER",
    "HttpProvider",
    "TextSink",  # likewise: what a wire format's parser writes the answer to
    "is_local_url",  # and these three with the keys, where the tests read them
    "read_api_key",
    "redact",
]

OPERATION_HEADER = "X-Soba-Operation"
OPERATION_ID_HEADER = "X-Soba-Operation-Id"

DEFAULT_TIMEOUT_S = 600.0
"""Overall deadline of a call whose caller gives none: no wait is ever unbounded."""
DEFAULT_CONNECT_TIMEOUT_S = 10.0
"""Longest wait for a connection; well inside the idle limit, so a retry on a new connection
still fits in the same wait."""
READ_TIMEOUT_MARGIN_S = 5.0
"""httpx's own read timeout is the idle limit plus this: a backstop that ends an abandoned
worker thread whose socket could not be shut down."""
HTTP_ERROR_MIN = 300
STOP_FINISH = "stop"
"""The normalised finish reason of an answer the model ended itself: an empty one may be a
disguised overflow. (An empty answer cut at its length limit, or paused for a native
compaction, is no disguise, and asking again would only repeat it.)"""

_ProviderT = TypeVar("_ProviderT", bound="HttpProvider")


def said_nothing(response: ModelResponse) -> bool:
    """A finished answer with no text and no tool call: from a stream, possibly an overflow a
    gateway disguised (SPEC §13), so it is asked again unstreamed (`HttpProvider.complete`)."""
    return response.finish_reason == STOP_FINISH and not response.text and not response.tool_calls


class HttpProvider(ABC):
    """A provider that talks to a model server over HTTP with httpx (sync)."""

    name: str = ""
    """Provider kind, set by each subclass."""
    default_base_url: str = ""

    def __init__(
        self,
        settings: ModelSettings,
        *,
        client: httpx.Client | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff_base_s: float = DEFAULT_BACKOFF_BASE_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        retry_after_cap_s: float = DEFAULT_RETRY_AFTER_CAP_S,
        jitter_ratio: float = DEFAULT_JITTER_RATIO,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        rng: random.Random | None = None,
    ):
        self.settings = settings
        self.model = settings.name
        self.base_url = (settings.base_url or self.default_base_url).rstrip("/")
        self.source = f"{self.name} ({urlsplit(self.base_url).netloc or self.base_url})"
        """How error messages name this provider and server."""
        self.policy = RetryPolicy(
            max_retries=max_retries,
            backoff_base_s=backoff_base_s,
            backoff_max_s=backoff_max_s,
            retry_after_cap_s=retry_after_cap_s,
            jitter_ratio=jitter_ratio,
        )
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.default_timeout_s = default_timeout_s
        self._rng = rng or random.Random()
        self._owns_client = client is None
        self._client = client if client is not None else httpx.Client()

    def bad_answer(self, what: str, data: Any) -> BadResponseError:
        """A one-line error for an answer of the wrong shape."""
        return BadResponseError(f"{self.source}: unexpected answer ({what}): {one_line(json.dumps(data))}")

    def json_events(
        self, events: Iterator[ServerSentEvent], what: str, *, until_done: bool = True
    ) -> Iterator[tuple[ServerSentEvent, dict[str, Any]]]:
        """Each event with its data as a JSON object (`what` names it in the one-line error
        for anything else); with `until_done`, the `[DONE]` event ends the stream."""
        for event in events:
            if until_done and event.is_done:
                return
            try:
                payload = json.loads(event.data)
            except json.JSONDecodeError:
                raise BadResponseError(f"{self.source}: {what} is not valid JSON: {one_line(event.data)}") from None
            if not isinstance(payload, dict):
                raise self.bad_answer(f"{what} is not an object", payload)
            yield event, payload

    # -- what a wire format provides -------------------------------------------------

    @abstractmethod
    def endpoint(self) -> str:
        """The URL requests are POSTed to."""

    @abstractmethod
    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        """Headers carrying the key (and any fixed headers of the API)."""

    def request_headers(self, request: ModelRequest) -> dict[str, str]:
        """Headers one request needs besides the key (a beta feature it uses); none by default."""
        return {}

    @abstractmethod
    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body for `request`."""

    @abstractmethod
    def parse_answer(self, data: dict[str, Any]) -> ModelResponse:
        """A non-streamed answer; a wrong shape is a `BadResponseError`."""

    @abstractmethod
    def parse_stream(self, events: Iterator[ServerSentEvent], emit: TextSink) -> ModelResponse:
        """A streamed answer; a stream that ends without a finish reason is an
        `IncompleteResponseError`."""

    # -- the request life cycle ------------------------------------------------------

    def complete(
        self,
        request: ModelRequest,
        *,
        on_text: TextCallback | None = None,
        cancel: threading.Event | None = None,
        timeout_s: float | None = None,
        on_wait: WaitCallback | None = None,
    ) -> ModelResponse:
        """Send the request (with retries) and return the finished answer (see `Provider`)."""
        deadline = Deadline(timeout_s if timeout_s is not None else self.default_timeout_s)
        silence = self._silence(request)
        api_key = read_api_key(self.settings.api_key_env, self.base_url)
        headers = {
            **self.auth_headers(api_key),
            **self.request_headers(request),
            OPERATION_HEADER: request.operation,
            OPERATION_ID_HEADER: request.operation_id,
        }
        body = self.build_body(request)
        sink = TextSink(on_text, silence=silence, count=self.output_count(request))
        # Some servers (llama.cpp) answer an oversized prompt with HTTP 200 and an empty
        # stream, and gateways (LiteLLM) with one empty `finish_reason: stop` chunk; asked
        # without streaming they give the real error (400, overflow). So a stream that brought
        # nothing is asked again, once, as a plain request.
        plain = self.build_body(request.model_copy(update={"stream": False})) if request.stream else body
        streaming = request.stream

        def attempt(_index: int) -> ModelResponse:
            nonlocal streaming
            while True:
                try:
                    response = self._send(streaming, body if streaming else plain, headers, sink, cancel, deadline, silence, on_wait)
                except ProviderError as exc:
                    if isinstance(exc, IncompleteResponseError) and streaming and not sink.delivered:
                        streaming = False
                    elif isinstance(exc, EmptyAnswerError) and request.near_window:
                        raise self._empty_overflow(request) from None
                    if exc.retryable and sink.delivered:
                        exc.retryable = False
                        exc.args = (f"{exc} (not retried: part of the answer was already shown)",)
                    raise
                if not (streaming and said_nothing(response)):
                    break
                streaming = False  # an overflow the gateway hid shows its words unstreamed
            if request.stream and not streaming and not sink.delivered:
                # The plain answer that replaced an empty stream is shown as a streamed one
                # would have been: it reached only the transcript, never the cell.
                sink.show(response.text)
            return response

        try:
            return call_with_retries(
                attempt,
                policy=self.policy,
                deadline=deadline,
                source=self.source,
                cancel=cancel,
                rng=self._rng,
                silence=silence,
            )
        except ProviderError as exc:
            redact(exc, api_key)
            raise

    def post_json(
        self,
        url: str,
        body: dict[str, Any],
        *,
        operation: Operation,
        operation_id: str,
        headers: dict[str, str] | None = None,
        cancel: threading.Event | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """One non-streamed JSON request to `url` (a native compaction endpoint) with the life
        cycle of `complete`: the key, `X-Soba-Operation` headers, deadline, cancel, retries and
        error classification (an overflow is never retried). Returns the answer's JSON object."""
        deadline = Deadline(timeout_s if timeout_s is not None else self.default_timeout_s)
        silence = Silence(self.idle_timeout_s)
        api_key = read_api_key(self.settings.api_key_env, self.base_url)
        sent = {
            **self.auth_headers(api_key),
            **(headers or {}),
            OPERATION_HEADER: operation,
            OPERATION_ID_HEADER: operation_id,
        }

        def attempt(_index: int) -> dict[str, Any]:
            feed = Feed(cancel=cancel, deadline=deadline, silence=silence, source=self.source)
            timeout, bounded_by_deadline = self._timeout(deadline, silence)
            feed.start(lambda feed: self._io(feed, False, body, sent, timeout, url=url))
            with self._httpx_errors(deadline, bounded_by_deadline):
                head = feed.head()
                if head.status >= HTTP_ERROR_MIN:
                    raise classify_http_error(self.source, head.status, head.text or "", head.headers)
                data = parse_json_answer(self.source, head.text or "")
            check_cancel(cancel, self.source)
            return data

        try:
            return call_with_retries(
                attempt,
                policy=self.policy,
                deadline=deadline,
                source=self.source,
                cancel=cancel,
                rng=self._rng,
                silence=silence,
            )
        except ProviderError as exc:
            redact(exc, api_key)
            raise

    def _silence(self, request: ModelRequest) -> Silence:
        """The call's wait clock: the idle limit, and before the first byte the time a local
        server is given to read a long prompt (SPEC §17, `soba_nb.providers.reading`)."""
        if not is_private_server(self.base_url):
            return Silence(self.idle_timeout_s)
        tokens = prompt_tokens(request)
        return Silence(self.idle_timeout_s, reading_s=reading_allowance_s(tokens, self.idle_timeout_s), reading_tokens=tokens)

    def _empty_overflow(self, request: ModelRequest) -> ContextOverflowError:
        size = f"about {request.input_tokens:,} tokens" if request.input_tokens else "a prompt"
        return ContextOverflowError(
            f"{self.source}: the server answered 200 with nothing to {size}, near the model's "
            "window: read as a context overflow (llama.cpp and Ollama answer an oversized prompt so)"
        )

    def _timeout(self, deadline: Deadline, silence: Silence) -> tuple[httpx.Timeout, bool]:
        """httpx timeouts for one attempt, and whether the deadline is what bounds them."""
        remaining = deadline.remaining()
        backstop = silence.reading_s + READ_TIMEOUT_MARGIN_S
        read = min(backstop, remaining)
        timeout = httpx.Timeout(read, connect=min(self.connect_timeout_s, remaining))
        return timeout, remaining <= backstop

    def _send(
        self,
        stream: bool,
        body: dict[str, Any],
        headers: dict[str, str],
        sink: TextSink,
        cancel: threading.Event | None,
        deadline: Deadline,
        silence: Silence,
        on_wait: WaitCallback | None = None,
    ) -> ModelResponse:
        """One attempt: POST, check the status, read the answer. httpx errors become ours.

        The I/O runs in a worker (`Feed`), so a cancel, the deadline or the answer not growing
        for `idle_timeout_s` (the call's `Silence`) ends the wait within a fraction of a second."""
        status = reading_status(silence.reading_tokens or 0) if silence.reading else WAITING
        feed = Feed(cancel=cancel, deadline=deadline, silence=silence, source=self.source, on_wait=on_wait, status=status)
        timeout, bounded_by_deadline = self._timeout(deadline, silence)
        feed.start(lambda feed: self._io(feed, stream, body, headers, timeout))
        with self._httpx_errors(deadline, bounded_by_deadline):
            head = feed.head()
            if head.status >= HTTP_ERROR_MIN:
                raise classify_http_error(self.source, head.status, head.text or "", head.headers)
            if head.text is not None:
                data = parse_json_answer(self.source, head.text)
                if stream and data.get("error"):
                    # Some servers answer a streamed request with one JSON object (often an error).
                    raise classify_stream_error(self.source, data)
                result = self.parse_answer(data)
                if stream:
                    sink.show(result.text)  # whole and finished: nothing to stop
            else:
                result = self._parse_lines(feed, sink)
        # An answer that finished after the caller cancelled is dropped all the same.
        check_cancel(cancel, self.source)
        return result

    @contextlib.contextmanager
    def _httpx_errors(self, deadline: Deadline, bounded_by_deadline: bool) -> Iterator[None]:
        """httpx's exceptions as our typed errors (one attempt's worth)."""
        try:
            yield
        except httpx.TimeoutException as exc:
            if bounded_by_deadline or deadline.expired():
                raise deadline.timeout_error(self.source) from None
            if isinstance(exc, httpx.ConnectTimeout):
                # Only the connection failed: a new one may work, within what is left of the wait.
                raise ServerError(f"{self.source}: no connection within {self.connect_timeout_s:g} s") from None
            raise StalledError(
                f"{self.source}: timed out waiting for the server ({type(exc).__name__}); {IDLE_SETTING} sets the idle limit"
            ) from None
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            # A configuration mistake: retrying cannot help.
            raise ProviderError(
                f"{self.source}: bad model.baseUrl {self.base_url!r} ({exc}); "
                "it must start with http:// or https://"
            ) from None
        except httpx.DecodingError as exc:
            raise BadResponseError(f"{self.source}: answer could not be decoded ({exc})") from None
        except httpx.RequestError as exc:
            raise ServerError(
                f"{self.source}: connection failed ({type(exc).__name__}: {exc})"
            ) from None

    def _io(
        self,
        feed: Feed,
        stream: bool,
        body: dict[str, Any],
        headers: dict[str, str],
        timeout: httpx.Timeout,
        *,
        url: str | None = None,
    ) -> None:
        """The worker's part: send, and hand over the head, then the lines of a stream."""
        if not stream:
            response = self._client.post(url or self.endpoint(), json=body, headers=headers, timeout=timeout)
            feed.put_head(response, response.text)
            return
        with self._client.stream(
            "POST", self.endpoint(), json=body, headers={**headers, "Accept": "text/event-stream"}, timeout=timeout
        ) as response:
            whole = response.status_code >= HTTP_ERROR_MIN or response.headers.get("content-type", "").startswith(
                "application/json"
            )
            if whole:
                response.read()
                feed.put_head(response, response.text)
                return
            feed.put_head(response, None)
            for line in response.iter_lines():
                if not feed.put_line(line):
                    return

    def _parse_lines(self, feed: Feed, sink: TextSink) -> ModelResponse:
        """A streamed answer; an empty stream (no line at all) is an `EmptyAnswerError`, and
        one that runs clearly past `maxOutputTokens` is stopped there (`_stopped_at_limit`)."""
        seen = [0]
        lines = feed.lines()

        def counted() -> Iterator[str]:
            for line in lines:
                seen[0] += bool(line.strip())
                yield line

        try:
            return self.parse_stream(iter_sse_events(counted()), sink)
        except AnswerOverrun:
            lines.close()  # stops the worker and closes the connection now, not at garbage collection
            return self._stopped_at_limit(sink)
        except IncompleteResponseError:
            if not seen[0]:
                raise EmptyAnswerError(f"{self.source}: the server answered 200 with an empty stream") from None
            raise

    def output_count(self, request: ModelRequest) -> OutputCount | None:
        """How the answer's tokens are counted against `maxOutputTokens` (SPEC §17)."""
        return OutputCount(request.max_output_tokens, self.name, self.model)

    def _stopped_at_limit(self, sink: TextSink) -> ModelResponse:
        """The answer of a stream stopped past `maxOutputTokens`: what a server honouring the
        limit would have sent — the text so far, the calls so far (their arguments cut), finish
        `length` — so every caller treats it as any answer cut at its limit (the loop says so
        and tells the model of a cut call). No usage: the server sends it only at the end."""
        return ModelResponse(
            text="".join(sink.shown), tool_calls=sink.calls(), finish_reason=LENGTH_FINISH, model=self.model,
            provider=self.name, stopped_at_tokens=sink.count.tokens if sink.count is not None else None,
        )  # fmt: skip

    # -- resources -------------------------------------------------------------------

    def close(self) -> None:
        """Close the HTTP client if this provider created it."""
        if self._owns_client:
            self._client.close()

    def __enter__(self: _ProviderT) -> _ProviderT:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
