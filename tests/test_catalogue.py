"""The model catalogue: a model's window follows its name, however the name is spelled."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from soba_nb.catalogue import CatalogueEntry, entries, lookup

# (model name as users write it, family, context window)
SPECIFIC_BEFORE_GENERAL = [
    ("llama3.1:8b", "Llama 3.1", 131072),
    ("llama3:8b", "Llama 3", 8192),
    ("gpt-4o-mini", "GPT-4o mini", 128000),
    ("gpt-4o", "GPT-4o", 128000),
    ("gpt-4-turbo", "GPT-4 Turbo", 128000),
    ("gpt-4", "GPT-4", 8192),
    ("qwen2.5-coder:7b", "Qwen2.5-Coder", 32768),
    ("qwen2.5:7b", "Qwen2.5", 32768),
    ("qwen2:7b", "Qwen2", 32768),
    ("deepseek-coder-v2:16b", "DeepSeek-Coder-V2", 163840),
    ("deepseek-coder:6.7b", "DeepSeek Coder", 16384),
    ("codellama:7b", "Code Llama", 16384),
    ("gemma3:1b", "Gemma 3 (small)", 32768),
    ("gemma3:4b", "Gemma 3", 131072),
    ("mistral-nemo:12b", "Mistral NeMo", 131072),
    ("mistral:7b", "Mistral 7B", 32768),
    ("claude-opus-4-1-20250805", "Claude Opus 4.1", 200000),
    ("claude-opus-4-20250514", "Claude Opus 4", 200000),
]

NAME_VARIANTS = [
    # Ollama tags
    ("qwen2.5-coder:7b-instruct-q4_K_M", "Qwen2.5-Coder"),
    ("llama3.2:3b-instruct-q8_0", "Llama 3.2"),
    ("llama3.3:70b", "Llama 3.3"),
    ("llama2:13b", "Llama 2"),
    ("gemma2:9b", "Gemma 2"),
    ("gemma:7b", "Gemma"),
    ("qwen3:8b", "Qwen3"),
    ("qwq:32b", "QwQ"),
    ("mixtral:8x7b", "Mixtral"),
    ("phi3:mini", "Phi-3"),
    ("deepseek-r1:7b", "DeepSeek-R1"),
    # org / path prefixes
    ("meta-llama/Llama-3.1-8B-Instruct", "Llama 3.1"),
    ("openai/gpt-4o", "GPT-4o"),
    ("anthropic/claude-3.5-sonnet", "Claude 3.5"),
    ("hf.co/bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M", "Llama 3.2"),
    # Hugging Face names
    ("Qwen2.5-7B-Instruct", "Qwen2.5"),
    ("Meta-Llama-3-8B-Instruct", "Llama 3"),
    ("google/gemma-2-9b-it", "Gemma 2"),
    ("google/gemma-2b-it", "Gemma"),
    ("google/gemma-3-1b-it", "Gemma 3 (small)"),
    ("mistralai/Mistral-Small-24B-Instruct-2501", "Mistral Small"),
    ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", "Mistral Small 3.1/3.2"),
    ("mistralai/Ministral-8B-Instruct-2410", "Ministral"),
    ("microsoft/Phi-3-mini-4k-instruct", "Phi-3"),
    ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "SmolLM2"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "DeepSeek-R1"),
    # GGUF file names
    ("qwen2.5-7b-instruct-q4_k_m.gguf", "Qwen2.5"),
    ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "Llama 3.1"),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2"),
    ("/models/codestral-22b-v0.1-Q4_K_M.gguf", "Codestral"),
    # dated and aliased API names
    ("claude-3-5-sonnet-20241022", "Claude 3.5"),
    ("claude-3-5-haiku-latest", "Claude 3.5"),
    ("claude-3-7-sonnet-20250219", "Claude 3.7 Sonnet"),
    ("claude-3-opus-20240229", "Claude 3"),
    ("claude-3-haiku-20240307", "Claude 3"),
    ("claude-sonnet-4-20250514", "Claude Sonnet 4"),
    ("claude-sonnet-4-5-20250929", "Claude Sonnet 4.5"),
    ("claude-haiku-4-5-20251001", "Claude Haiku 4.5"),
    ("anthropic.claude-3-5-sonnet-20241022-v2:0", "Claude 3.5"),
    ("gpt-4o-2024-08-06", "GPT-4o"),
    ("gpt-4o-mini-2024-07-18", "GPT-4o mini"),
    ("gpt-4.1-mini-2025-04-14", "GPT-4.1"),
    ("gpt-4-0613", "GPT-4"),
    ("gpt-4-1106-preview", "GPT-4 Turbo"),
    ("gpt-3.5-turbo-0125", "GPT-3.5 Turbo"),
    ("gpt-5-mini-2025-08-07", "GPT-5"),
    ("o3-mini-2025-01-31", "o3-mini"),
    ("o4-mini", "o4-mini"),
    ("o1-2024-12-17", "o1"),
    ("deepseek-chat", "DeepSeek-V3"),
    ("deepseek-reasoner", "DeepSeek-R1"),
    ("mistral-large-latest", "Mistral Large"),
]

# Names the catalogue must not guess at: None lets the configured figure stand.
UNKNOWN = [
    "",
    "   ",
    "my-private-finetune",
    "gpt-oss:20b",
    "tinyllama:1.1b",
    "llama4:scout",
    "phi3.5:3.8b",
    "microsoft/Phi-3-mini-128k-instruct",
    "gemma3n:e4b",
    "codegemma:7b",
    "command-r",
    "nomic-embed-text",
    "text-embedding-3-small",
    "foo1",
]


@pytest.mark.parametrize(("model", "family", "window"), SPECIFIC_BEFORE_GENERAL)
def test_the_most_specific_family_wins(model: str, family: str, window: int) -> None:
    entry = lookup("local", model)
    assert entry is not None
    assert (entry.family, entry.context_window) == (family, window)


@pytest.mark.parametrize(("model", "family"), NAME_VARIANTS)
def test_name_variants_find_their_family(model: str, family: str) -> None:
    entry = lookup("openai", model)
    assert entry is not None, model
    assert entry.family == family


@pytest.mark.parametrize("model", UNKNOWN)
def test_unknown_names_are_none(model: str) -> None:
    assert lookup("openai", model) is None


def test_the_8k_llama3_no_longer_reads_as_128k() -> None:
    entry = lookup("openai", "llama3:8b")
    assert entry == CatalogueEntry("Llama 3", 8192, 2048)


@pytest.mark.parametrize(
    ("model", "window", "max_output"),
    [
        ("gpt-4o-mini", 128000, 16384),
        ("gpt-4.1", 1047576, 32768),
        ("gpt-5", 400000, 128000),
        ("o3", 200000, 100000),
        ("gpt-4-turbo-2024-04-09", 128000, 4096),
        ("gpt-4", 8192, 4096),  # the window is shared: all 8192 would leave no input
        ("gpt-3.5-turbo", 16385, 4096),
        ("claude-3-opus-latest", 200000, 4096),
        ("claude-3-5-sonnet-latest", 200000, 8192),
        ("claude-3-7-sonnet-latest", 200000, 64000),
        ("claude-opus-4-0", 200000, 32000),
        ("claude-sonnet-4-5", 200000, 64000),
        ("claude-haiku-4-5", 200000, 64000),
        ("deepseek-chat", 65536, 8192),
    ],
)
def test_hosted_models_carry_the_vendors_output_limit(
    model: str, window: int, max_output: int
) -> None:
    entry = lookup("anthropic" if model.startswith("claude") else "openai", model)
    assert entry is not None
    assert (entry.context_window, entry.max_output_tokens) == (window, max_output)


@pytest.mark.parametrize(
    ("model", "max_output"),
    [("llama2", 1024), ("llama3", 2048), ("llama3.1", 8192), ("phi3", 1024), ("smollm2", 2048)],
)
def test_open_weight_models_reserve_a_quarter_of_the_window_at_most_8k(
    model: str, max_output: int
) -> None:
    entry = lookup("local", model)
    assert entry is not None
    assert entry.max_output_tokens == max_output


def test_the_provider_does_not_narrow_the_search() -> None:
    assert lookup("openai", "llama3.1:8b") == lookup("local", "llama3.1:8b")
    assert lookup("local", "claude-sonnet-4-5") == lookup("anthropic", "claude-sonnet-4-5")


@pytest.mark.parametrize("entry", entries(), ids=lambda entry: entry.family)
def test_every_entry_leaves_room_for_input(entry: CatalogueEntry) -> None:
    assert entry.context_window > entry.max_output_tokens > 0


KNOWN_NAMES = [model for model, *_ in SPECIFIC_BEFORE_GENERAL + NAME_VARIANTS]
PREFIX = st.from_regex(r"[A-Za-z0-9_.-]{1,12}(/[A-Za-z0-9_.-]{1,12}){0,2}", fullmatch=True)


@given(name=st.sampled_from(KNOWN_NAMES), prefix=PREFIX)
def test_case_and_org_prefix_do_not_change_the_answer(name: str, prefix: str) -> None:
    expected = lookup("openai", name)
    assert lookup("openai", name.upper()) == expected
    assert lookup("openai", f"{prefix}/{name}") == expected


@given(st.text())
def test_lookup_never_raises(name: str) -> None:
    entry = lookup("local", name)
    assert entry is None or entry.context_window > 0
