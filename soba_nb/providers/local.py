"""The embedded offline model: provider `local` (extra `soba-nb[local]`).

SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) runs in-process through
`llama-cpp-python`. It is a *tiny* model: good enough to exercise a whole session offline
(a turn, the budget, a real compaction), not to do serious work. Finding, loading and
caching the GGUF is `soba_nb.providers.local_model`; the text protocol that carries tool
calls (the model has none natively) is `soba_nb.providers.local_tools`.

The prompt is rendered and tokenized exactly as `create_chat_completion` does, so the
prompt token count is exact, checked before any generation: a prompt that leaves no room
for one answer token raises `ContextOverflowError(limit=n_ctx)`. When it fits but
`max_output_tokens` does not, the answer is cut at the window (finish reason `length`), as
llama.cpp does.

Threading. Generation holds the loaded model's lock (llama.cpp contexts are not
reentrant); waiting for it counts against the deadline and honours the cancel event.

Cancel and deadline are checked between streamed tokens, and during prompt evaluation
(which can take tens of seconds for a long prompt on 2 cores) through llama.cpp's abort
callback, armed only until the first token arrives so generation pays nothing for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soba_nb.config import ModelSettings
from soba_nb.providers.base import (
    ModelRequest,
    ModelResponse,
    TextCallback,
    ToolCall,
    Usage,
)
from soba_nb.providers.errors import (
    Cancelled,
    ContextOverflowError,
    IncompleteResponseError,
    ProviderError,
    ProviderTimeout,
)
from soba_nb.providers.local_model import (
    N_THREADS,
    LoadedModel,
    context_length_from_metadata,
    count_tokens,
    load_model,
    local_model_available,
    local_model_path,
)
from soba_nb.providers.local_tools import (
    ToolBlockFilter,
    parse_tool_calls,
    render_message,
    render_tool_call,
    tools_prompt,
)

PROVIDER_NAME = "local"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_TIMEOUT_S = 600.0
"""Overall deadline of a call whose caller gives none."""
TEMPERATURE = 0.2
REPEAT_PENALTY = 1.1
"""The 135M model loops easily; a mild repeat penalty keeps short answers sane."""
SEED = 0
"""Fixed sampling seed: the same request gives the same answer (demos and CI)."""
LOCK_POLL_S = 0.05
"""How often a caller waiting for the model's lock re-checks its cancel event."""
LLAMA_ABORTED = "llama_decode returned 2"
"""What llama-cpp-python raises when the abort callback stopped a decode."""

# HTTP-only keywords `make_provider` may pass to every provider; meaningless here.
_IGNORED_OPTIONS = frozenset(
    {
        "client",
        "max_retries",
        "backoff_base_s",
        "backoff_max_s",
        "retry_after_cap_s",
        "jitter_ratio",
        "connect_timeout_s",
        "idle_timeout_s",
        "rng",
    }
)


def chat_messages(request: ModelRequest) -> list[dict[str, str]]:
    """The request as chat-template messages: system (with tools), then the conversation."""
    system_parts = [request.system.strip()] if request.system.strip() else []
    if request.tools:
        system_parts.append(tools_prompt(request.tools))
    messages = [{"role": "system", "content": "\n\n".join(system_parts)}] if system_parts else []
    return messages + [render_message(message) for message in request.messages]


# -- the provider -------------------------------------------------------------------------------


@dataclass
class _Stream:
    text: list[str]
    completion_tokens: int = 0
    finish_reason: str | None = None


class LocalProvider:
    """Provider `local`: the embedded GGUF through llama-cpp-python, in-process.

    `LocalProvider(settings)` as `make_provider` builds it. The model is the GGUF, not a
    name: answers report `SmolLM2-135M-Instruct` (or the stem of `model_path`) whatever
    `settings.name` says. `n_ctx` (default: the GGUF's window) and `n_threads` tune
    the context; `model_path` points at another GGUF with a chat template. HTTP-only
    keywords (`client`, `max_retries`, …) are accepted and ignored; `default_timeout_s`
    is the deadline of a call that gives none. The model loads on first use.
    """

    name = PROVIDER_NAME

    def __init__(
        self,
        settings: ModelSettings | None = None,
        *,
        model_path: Path | str | None = None,
        n_ctx: int | None = None,
        n_threads: int = N_THREADS,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        **http_options: Any,
    ):
        unknown = set(http_options) - _IGNORED_OPTIONS
        if unknown:
            raise TypeError(f"LocalProvider got unexpected options: {', '.join(sorted(unknown))}")
        self.settings = settings
        self.model_path = Path(model_path) if model_path is not None else None
        self.model = self.model_path.stem if self.model_path is not None else DEFAULT_MODEL_NAME
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.default_timeout_s = default_timeout_s
        self.source = PROVIDER_NAME

    # -- model facts ---------------------------------------------------------------

    def loaded(self) -> LoadedModel:
        """The loaded model (loads it on first use; cached for the whole process)."""
        return load_model(self.model_path, n_ctx=self.n_ctx, n_threads=self.n_threads)

    @property
    def context_window(self) -> int:
        """The window requests must fit in (the allocated context, ≤ the GGUF's window)."""
        return self.loaded().n_ctx

    def count_tokens(self, text: str) -> int:
        """Exact token count of `text` with this model's own tokenizer."""
        return self.loaded().count_tokens(text)

    def prompt_tokens(self, request: ModelRequest) -> int:
        """Exact token count of the prompt `request` would be sent as."""
        return len(self.loaded().format_prompt(chat_messages(request))[1])

    # -- Provider protocol ------------------------------------------------------------

    def complete(
        self,
        request: ModelRequest,
        *,
        on_text: TextCallback | None = None,
        cancel: threading.Event | None = None,
        timeout_s: float | None = None,
    ) -> ModelResponse:
        limit_s = self.default_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit_s
        self._check(cancel, deadline, limit_s)
        model = self.loaded()
        messages = chat_messages(request)
        _, prompt = model.format_prompt(messages)
        if len(prompt) >= model.n_ctx:
            raise ContextOverflowError(
                f"local: context overflow: the prompt is {len(prompt)} tokens, the model's "
                f"window is {model.n_ctx} tokens",
                limit=model.n_ctx,
                requested=len(prompt),
            )
        filter_ = ToolBlockFilter() if request.tools else None

        def emit(text: str) -> None:
            shown = filter_.feed(text) if filter_ is not None else text
            if shown and on_text is not None and request.stream:
                on_text(shown)

        self._acquire(model.lock, cancel, deadline, limit_s)
        try:
            stream = self._generate(model, messages, request, cancel, deadline, limit_s, emit)
        finally:
            model.lock.release()
        if filter_ is not None:
            rest = filter_.flush()
            if rest and on_text is not None and request.stream:
                on_text(rest)
        if stream.finish_reason is None:
            raise IncompleteResponseError("local: generation ended without a finish reason")
        text = "".join(stream.text)
        calls: list[ToolCall] = []
        if request.tools:
            text, calls = parse_tool_calls(text)
        finish = stream.finish_reason
        if calls and finish == "stop":
            finish = "tool_calls"
        return ModelResponse(
            text=text,
            tool_calls=calls,
            finish_reason=finish,
            usage=Usage(input_tokens=len(prompt), output_tokens=stream.completion_tokens),
            model=self.model,
            provider=self.name,
        )

    # -- internals ------------------------------------------------------------------------

    def _check(self, cancel: threading.Event | None, deadline: float, limit_s: float) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled("local: request cancelled")
        if time.monotonic() >= deadline:
            raise ProviderTimeout(f"local: no answer within the deadline of {limit_s:g} s")

    def _acquire(
        self, lock: threading.Lock, cancel: threading.Event | None, deadline: float, limit_s: float
    ) -> None:
        """Wait for the model (another thread may be generating), bounded and cancellable."""
        while not lock.acquire(timeout=LOCK_POLL_S):
            self._check(cancel, deadline, limit_s)

    def _generate(
        self,
        model: LoadedModel,
        messages: list[dict[str, str]],
        request: ModelRequest,
        cancel: threading.Event | None,
        deadline: float,
        limit_s: float,
        emit: Callable[[str], None],
    ) -> _Stream:
        """Stream one chat completion; call with `model.lock` held."""
        self._check(cancel, deadline, limit_s)
        stream = _Stream(text=[])

        def should_abort() -> bool:
            return (cancel is not None and cancel.is_set()) or time.monotonic() >= deadline

        chunks: Iterator[dict[str, Any]] | None = None
        model.abort_when(should_abort)
        armed = True
        try:
            chunks = model.llama.create_chat_completion(
                messages=messages,
                stream=True,
                max_tokens=request.max_output_tokens,
                temperature=TEMPERATURE,
                repeat_penalty=REPEAT_PENALTY,
                seed=SEED,
            )
            for chunk in chunks:
                if armed:  # the prompt is evaluated; from here on, check between tokens
                    model.abort_when(None)
                    armed = False
                self._check(cancel, deadline, limit_s)
                choice = chunk["choices"][0]
                delta = choice.get("delta") or {}
                content = delta.get("content")
                if isinstance(content, str):
                    stream.completion_tokens += 1
                    if content:
                        stream.text.append(content)
                        emit(content)
                if choice.get("finish_reason"):
                    stream.finish_reason = str(choice["finish_reason"])
        except RuntimeError as exc:
            if LLAMA_ABORTED in str(exc):
                try:
                    self._check(cancel, deadline, limit_s)
                except ProviderError as stop:
                    raise stop from None
            raise ProviderError(f"local: llama.cpp failed: {exc}") from None
        except ValueError as exc:
            if "exceed context window" in str(exc):
                raise ContextOverflowError(
                    f"local: context overflow: {exc}", limit=model.n_ctx
                ) from None
            raise ProviderError(f"local: llama.cpp refused the request: {exc}") from None
        finally:
            model.abort_when(None)
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        return stream


# The model and tool-protocol names are re-exported: callers import them from here.
__all__ = [
    "N_THREADS",
    "LoadedModel",
    "LocalProvider",
    "ToolBlockFilter",
    "chat_messages",
    "context_length_from_metadata",
    "count_tokens",
    "load_model",
    "local_model_available",
    "local_model_path",
    "parse_tool_calls",
    "render_tool_call",
    "tools_prompt",
]
