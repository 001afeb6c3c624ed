"""Provider profiles: the keys a provider starts from before any layer (SPEC §3).

Used twice: under `model` when a layer names the provider, and under `compaction.model` when
the summary model names a provider other than `model`'s (`settings.summary_model_settings`)."""

from __future__ import annotations

from typing import Any

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
"""The one model provider `local` runs (`soba_nb.providers.local`)."""

# The embedded model is tiny (8192-token window): the spec's defaults would give a negative
# hard limit, so a local model starts from its own profile unless the user sets the keys.
PROVIDER_PROFILES: dict[str, dict[str, Any]] = {
    "local": {
        "model": {
            "name": EMBEDDED_MODEL_NAME,
            "apiKeyEnv": "",
            "contextWindow": 8192,
            "maxOutputTokens": 512,
        },
        "compaction": {
            "minTokensForAutoCompact": 3000,
            "minReclaimableTokens": 1000,
            "keepRecentTokens": 1500,
            "safetyReserveTokens": 512,
            "timeoutMs": 8000,
        },
    },
    "anthropic": {
        "model": {
            "name": "claude-sonnet-4-5",
            "apiKeyEnv": "ANTHROPIC_API_KEY",
            "contextWindow": 200000,
            "maxOutputTokens": 8000,
        }
    },
}
