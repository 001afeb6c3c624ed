"""The embedded offline model: provider `local` (extra `soba-nb[local]`).

SmolLM2-135M-Instruct runs in a child process (`soba_nb.providers.local_process`) that
serves the OpenAI Chat Completions wire format on 127.0.0.1, so this provider is the
OpenAI one pointed at it: streaming, usage, deadlines, the idle limit and cancel all work
the same way, and a crash, an out-of-memory kill or a hang of the model is a clear error in
the cell while the kernel and its variables live on (the next request starts a fresh
engine). It is a *tiny* model: good enough to exercise a whole session offline (a turn, the
budget, a real compaction), not to do serious work. Tool calls travel as text
(`soba_nb.engine.tool_text`), translated by the engine.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

from soba_nb.config import EMBEDDED_MODEL_NAME, ModelSettings
from soba_nb.engine.tool_text import parse_tool_calls, render_tool_call, tools_prompt
from soba_nb.providers.base import ModelRequest, ModelResponse, TextCallback, WaitCallback
from soba_nb.providers.errors import ProviderError, ServerError
from soba_nb.providers.local_model import (
    local_model_available,
    local_model_path,
    model_facts,
)
from soba_nb.providers.local_process import EngineProcess, engine_for
from soba_nb.providers.openai import OpenAIProvider
from soba_nb.providers.output_count import OutputCount

PROVIDER_NAME = "local"
DEFAULT_MODEL_NAME = EMBEDDED_MODEL_NAME
ENGINE_RETRIES = 0
"""Nothing flaky sits between the kernel and its own engine: an error is final."""
EXIT_SETTLE_S = 1.0
"""After a broken connection, how long to wait for the engine's exit status before deciding
it still runs (a crashed engine's socket closes just before its status exists)."""


class LocalProvider(OpenAIProvider):
    """Provider `local`: the embedded GGUF, served by a child process on 127.0.0.1.

    `LocalProvider(settings)` as `make_provider` builds it; `model_path` points at another
    llama-architecture GGUF with a chat template. The engine starts on first use. It streams
    how far it has computed a long prompt (`prompt_progress`, as llama.cpp's server does), so
    the usual idle limit holds for it too (SPEC §12: every wait ends within 90 s by default).
    """

    name = PROVIDER_NAME

    def __init__(self, settings: ModelSettings | None = None, *, model_path: Path | str | None = None, **http_options: Any):
        path = Path(model_path) if model_path is not None else local_model_path()
        self.engine: EngineProcess = engine_for(path)
        wire = ModelSettings(provider="openai", name=path.stem.split(".")[0], base_url="http://127.0.0.1:9/v1", api_key_env="")
        http_options.setdefault("max_retries", ENGINE_RETRIES)
        super().__init__(wire, **http_options)
        self.settings = settings or wire
        self.model_path = path
        self.source = PROVIDER_NAME

    # -- model facts ---------------------------------------------------------------

    def output_count(self, request: ModelRequest) -> OutputCount | None:
        """None: the embedded engine stops at `max_tokens` itself (counting would load a
        second tokenizer beside its own)."""
        return None

    @property
    def context_window(self) -> int:
        """The model's window, from the GGUF."""
        return model_facts(self.model_path).context_window

    def count_tokens(self, text: str) -> int:
        """Exact token count of `text` with this model's own tokenizer."""
        return model_facts(self.model_path).count_tokens(text)

    def warm_up(self) -> None:
        """Start the engine in the background, so the first turn does not wait for it."""
        threading.Thread(target=self._quiet_start, daemon=True, name="soba-engine-start").start()

    def _quiet_start(self) -> None:
        with contextlib.suppress(ProviderError):  # the first request reports it, with the log
            self.engine.url()

    # -- Provider protocol ------------------------------------------------------------

    def complete(
        self,
        request: ModelRequest,
        *,
        on_text: TextCallback | None = None,
        cancel: threading.Event | None = None,
        timeout_s: float | None = None,
        on_wait: WaitCallback | None = None,
    ) -> ModelResponse:
        self.base_url = self.engine.url(cancel=cancel, on_progress=on_wait) + "/v1"
        try:
            response = super().complete(request, on_text=on_text, cancel=cancel, timeout_s=timeout_s, on_wait=on_wait)
        except ServerError as exc:
            if self.engine.alive(settle_s=EXIT_SETTLE_S):
                raise
            raise ProviderError(
                f"local: the embedded model {self.engine.describe_exit()} during the request; the kernel and "
                f"your variables are fine, and the next request starts the model again (log: {self.engine.log_path})"
            ) from exc
        return response.model_copy(update={"provider": PROVIDER_NAME})


__all__ = [
    "DEFAULT_MODEL_NAME",
    "LocalProvider",
    "local_model_available",
    "local_model_path",
    "model_facts",
    "parse_tool_calls",
    "render_tool_call",
    "tools_prompt",
]
