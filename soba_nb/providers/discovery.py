"""Ask an OpenAI-compatible server which context window it really runs the model with.

A catalogue figure says what a model *can* take; a local server decides what it *does*
take (llama.cpp `-c`, Ollama `num_ctx`, vLLM `--max-model-len`). `discover_window` asks,
in this order, and returns the first usable answer:

1. llama.cpp `GET {root}/props` → `default_generation_settings.n_ctx` (also a top-level
   `n_ctx`). The server README documents the answer as
   `{"default_generation_settings": {"id": 0, "n_ctx": 1024, "params": {...}, ...},
   "total_slots": 1, "model_path": ..., ...}` and says the endpoint needs no API key.
   The figure is the context of one slot, which is what one request can use.
2. Ollama `POST {root}/api/show` with `{"model": NAME}` → `num_ctx` from the `parameters`
   text (Modelfile lines such as `num_ctx                        8192`) when the model
   sets it, else the `<architecture>.context_length` key of `model_info` (Ollama's API
   reference and OpenAPI example: `"parameters": "temperature 0.7\\nnum_ctx 2048"`,
   `"model_info": {"general.architecture": "llama", "llama.context_length": 8192, ...}`).
   Without a `num_ctx` line Ollama runs the model with its server default
   (`OLLAMA_CONTEXT_LENGTH`), which may be smaller than the model's own `context_length`;
   the `source` line says which figure was used.
3. vLLM `GET {base_url}/models` → `max_model_len` of the entry whose `id` is the model, or
   of the only entry (vLLM's `ModelCard` in `vllm/entrypoints/openai/protocol.py`:
   `id`, `object`, `created`, `owned_by`, `root`, `parent`, `max_model_len`, ...).
4. A LiteLLM gateway `GET {root}/model/info` → `model_info.max_input_tokens` of the entries
   whose `model_name` is the model (the alias a team configures), the smallest when several
   deployments serve it. LiteLLM fills it from its model map for models it knows, or from the
   admin's `model_info` in its config; for others it is null, and the gateway says nothing
   (its `/v1/models` carries no length, and `/props` and `/api/show` are 404 through it).
   Its answer (`{"data": [{"model_name": "team-smol", "litellm_params": {...},
   "model_info": {"max_input_tokens": 2048, "max_output_tokens": null, ...}}]}`) needs the key.

The whole discovery is bounded by one deadline; each request gets only what is left of
it, with a short connect timeout. Discovery is advisory, so it never raises: an error, a
non-200 answer, non-JSON, a wrong shape or a figure that is not a positive integer moves
on to the next probe, and None means "the server did not say". The public OpenAI and
Anthropic APIs are never asked (they have no such endpoints). The API key is sent as
`Authorization: Bearer` only when given, and never logged or returned.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from soba_nb.config import MAX_CONTEXT_WINDOW
from soba_nb.window import ServerWindow as ServerWindow  # re-exported: what discovery answers

if TYPE_CHECKING:  # imported where a server is asked: `ServerWindow` alone needs no HTTP client
    import httpx

DISCOVERY_TIMEOUT_S = 2.0
"""Default bound on the whole discovery, all probes together."""
CONNECT_TIMEOUT_S = 0.5
"""A server that does not accept a connection this fast is not worth waiting for."""
MAX_ANSWER_BYTES = 4 * 1024 * 1024
"""Answers carry chat templates and licences; anything larger is not a metadata answer."""
MAX_PLAUSIBLE_WINDOW = MAX_CONTEXT_WINDOW
"""No model comes near this (the bound a configured window obeys too); a larger figure is a
broken answer, not a window."""
_MAX_DIGITS = len(str(MAX_PLAUSIBLE_WINDOW))
"""A `num_ctx` text longer than this is no window (and Python refuses to convert 4,300 digits)."""
PUBLIC_API_HOSTS = frozenset({"api.openai.com", "api.anthropic.com"})
"""Never probed, nor their subdomains (eu.api.openai.com): they have no such endpoints."""
OPENAI_PATH_SUFFIX = "/v1"

_NUM_CTX_LINE = re.compile(r"^\s*num_ctx\s+(\S+)\s*$", re.MULTILINE)
_CONTEXT_LENGTH_SUFFIX = ".context_length"
_SAFE_KEY = re.compile(r"[A-Za-z0-9_.\-]{1,100}")
"""A `model_info` key quoted in `source` must look like one (the text comes from the server)."""

logger = logging.getLogger(__name__)


class _NoAnswer(Exception):
    """A probe got no usable answer (the next probe is tried)."""


@dataclass
class _Probe:
    """Makes the discovery's requests, each bounded by what is left of the shared deadline."""

    client: httpx.Client
    deadline: float
    headers: dict[str, str]

    def json(self, method: str, url: str, body: Any = None) -> Any:
        """The JSON answer of a 200 response; `_NoAnswer` for anything else."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise _NoAnswer("out of time")
        import httpx

        timeout = httpx.Timeout(remaining, connect=min(CONNECT_TIMEOUT_S, remaining))
        with self.client.stream(
            method, url, json=body, headers=self.headers, timeout=timeout
        ) as response:
            if response.status_code != httpx.codes.OK:
                raise _NoAnswer(f"status {response.status_code}")
            data = bytearray()
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > MAX_ANSWER_BYTES or time.monotonic() > self.deadline:
                    raise _NoAnswer("answer too long or too slow")
        try:
            return json.loads(data)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise _NoAnswer("not JSON") from exc


def _window(value: Any) -> int:
    """`value` when it is a plausible window: a positive JSON integer (not a bool, not a
    float) below `MAX_PLAUSIBLE_WINDOW`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _NoAnswer(f"not an integer: {type(value).__name__}")
    if not 0 < value <= MAX_PLAUSIBLE_WINDOW:
        raise _NoAnswer("not a plausible window")
    return value


def _num_ctx(parameters: Any) -> int | None:
    """The `num_ctx` of Ollama's `parameters` text, when it holds a usable one."""
    match = _NUM_CTX_LINE.search(parameters) if isinstance(parameters, str) else None
    if match is None or not match.group(1).isdigit() or len(match.group(1)) > _MAX_DIGITS:
        return None
    try:
        return _window(int(match.group(1)))
    except _NoAnswer:
        return None


def _llama_cpp(probe: _Probe, root: str, base_url: str, model: str) -> ServerWindow:
    answer = probe.json("GET", f"{root}/props")
    if not isinstance(answer, dict):
        raise _NoAnswer("not an object")
    settings = answer.get("default_generation_settings")
    if isinstance(settings, dict):
        try:
            return ServerWindow(_window(settings.get("n_ctx")), "llama.cpp GET /props n_ctx")
        except _NoAnswer:
            pass  # older or newer builds may carry it at the top level instead
    return ServerWindow(_window(answer.get("n_ctx")), "llama.cpp GET /props n_ctx")


def _ollama(probe: _Probe, root: str, base_url: str, model: str) -> ServerWindow:
    answer = probe.json("POST", f"{root}/api/show", {"model": model})
    if not isinstance(answer, dict):
        raise _NoAnswer("not an object")
    num_ctx = _num_ctx(answer.get("parameters"))
    if num_ctx is not None:
        return ServerWindow(num_ctx, "Ollama POST /api/show num_ctx")
    model_info = answer.get("model_info")
    if not isinstance(model_info, dict):
        raise _NoAnswer("no model_info")
    for key, value in model_info.items():
        if isinstance(key, str) and key.endswith(_CONTEXT_LENGTH_SUFFIX):
            shown = key if _SAFE_KEY.fullmatch(key) else "model_info context_length"
            return ServerWindow(_window(value), f"Ollama POST /api/show {shown}")
    raise _NoAnswer("no context_length")


def _vllm(probe: _Probe, root: str, base_url: str, model: str) -> ServerWindow:
    url = f"{base_url}/models"
    answer = probe.json("GET", url)
    entries = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(entries, list):
        raise _NoAnswer("no data list")
    cards = [entry for entry in entries if isinstance(entry, dict)]
    named = [card for card in cards if card.get("id") == model]
    if named:
        card = named[0]
    elif len(entries) == 1 and cards:
        card = cards[0]
    else:
        raise _NoAnswer("model not listed")
    path = urlsplit(url).path
    return ServerWindow(_window(card.get("max_model_len")), f"vLLM GET {path} max_model_len")


def _litellm(probe: _Probe, root: str, base_url: str, model: str) -> ServerWindow:
    answer = probe.json("GET", f"{root}/model/info")
    entries = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(entries, list):
        raise _NoAnswer("no data list")
    windows = []
    for entry in entries:
        info = entry.get("model_info") if isinstance(entry, dict) and entry.get("model_name") == model else None
        if isinstance(info, dict):
            with contextlib.suppress(_NoAnswer):
                windows.append(_window(info.get("max_input_tokens")))
    if not windows:
        raise _NoAnswer("model not listed, or no max_input_tokens")
    return ServerWindow(min(windows), "LiteLLM GET /model/info max_input_tokens")


_PROBES: tuple[tuple[str, Callable[[_Probe, str, str, str], ServerWindow]], ...] = (
    ("llama.cpp", _llama_cpp),
    ("Ollama", _ollama),
    ("vLLM", _vllm),
    ("LiteLLM", _litellm),
)


def _without_key(window: ServerWindow, api_key: str | None) -> ServerWindow:
    """`window` with the key cut out of `source` (a hostile server could echo it back)."""
    if api_key and api_key in window.source:
        return ServerWindow(window.context_window, window.source.replace(api_key, "[redacted]"))
    return window


def _is_public_api(base_url: str) -> bool:
    """True for the public OpenAI and Anthropic API hosts and their subdomains."""
    try:
        host = (urlsplit(base_url).hostname or "").lower().rstrip(".")
    except ValueError:
        return False
    return any(host == public or host.endswith("." + public) for public in PUBLIC_API_HOSTS)


def discover_window(
    base_url: str,
    model: str,
    *,
    api_key: str | None = None,
    timeout_s: float = DISCOVERY_TIMEOUT_S,
    client: httpx.Client | None = None,
) -> ServerWindow | None:
    """The context window the server at `base_url` runs `model` with, or None.

    `base_url` is an OpenAI-compatible base URL, usually ending in `/v1`; the server root
    is that URL without the `/v1`. Never raises; returns within about `timeout_s`.
    """
    if not base_url or _is_public_api(base_url):
        return None
    deadline = time.monotonic() + timeout_s
    base = base_url.rstrip("/")
    root = base[: -len(OPENAI_PATH_SUFFIX)] if base.endswith(OPENAI_PATH_SUFFIX) else base
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    import httpx

    own_client = client is None
    http = httpx.Client() if client is None else client
    try:
        probe = _Probe(http, deadline, headers)
        for name, ask in _PROBES:
            try:
                return _without_key(ask(probe, root, base, model), api_key)
            except Exception as exc:  # advisory: any failure means "ask the next one"
                # The type only: messages can quote URLs and answers, never worth the risk.
                logger.debug("context window probe %s: no answer (%s)", name, type(exc).__name__)
        return None
    finally:
        if own_client:
            http.close()
