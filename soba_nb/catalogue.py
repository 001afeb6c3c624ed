"""Known context windows and output limits of common model families.

`contextWindow` and `maxOutputTokens` come from the active model definition (SPEC §2). When
the user names a model but not its window, the figure should follow the model (an 8k
`llama3:8b` must not be budgeted as if it had 128k). `lookup` answers from a small table
kept as data: an ordered tuple of (pattern, `CatalogueEntry`) pairs, the most specific
pattern first, the first match winning.

Names are matched case-insensitively after dropping any org/path prefix
(`meta-llama/Llama-3.1-8B-Instruct`, `openai/gpt-4o`, `hf.co/org/repo:Q4_K_M`) and a
`.gguf` suffix, so Ollama tags (`llama3:8b`), Hugging Face names (`Qwen2.5-7B-Instruct`),
GGUF file names (`qwen2.5-7b-instruct-q4_k_m.gguf`) and dated API names
(`claude-3-5-sonnet-20241022`, `gpt-4o-2024-08-06`) all find their family. The table is
consulted for every provider: an OpenAI-compatible server may well serve Llama.

Figures for hosted APIs are the vendors' published limits. Open-weight models have no
"maximum output" of their own (they can generate until the window is full), so their
`max_output_tokens` is a sensible reservation: a quarter of the window, at most
`OPEN_WEIGHTS_OUTPUT_CAP` tokens. A server may run a model with a smaller window than the
model supports (llama.cpp `-c`, Ollama `num_ctx`); `soba_nb.providers.discovery` asks the
server for its real figure, which beats this table.

Prices (SPEC §11) are a second table, `list_prices`: the vendors' public list prices in US
dollars per million tokens (input, cached input, output) for the OpenAI and Anthropic models
named here, as of `PRICES_TAKEN`. Names are matched exactly (a dated snapshot included), not
by family: a new version or a `-pro` variant is priced differently, and a model this table
does not name is not priced (`model.pricing` prices it).
"""

from __future__ import annotations

import functools
import re

from msgspec import Struct

OPEN_WEIGHTS_OUTPUT_CAP = 8192
"""Most tokens reserved for the answer of an open-weight model."""
OPEN_WEIGHTS_OUTPUT_SHARE = 4
"""An open-weight model reserves at most 1/this of its window for the answer."""
GGUF_SUFFIX = ".gguf"


PRICES_TAKEN = "2025-12"
"""When the list prices below were taken from the vendors' pricing pages (year-month)."""


class ListPrice(Struct, frozen=True):
    """A model's list price, US dollars per million tokens (decimal strings: exact)."""

    family: str
    input: str
    cached_input: str
    """Input read from the provider's prompt cache (Anthropic: a cache hit)."""
    output: str
    vendor: str = "openai"
    """Whose API bills it so (`ModelSettings.provider`): "openai" or "anthropic"."""


def _claude(family: str, input_price: str, cached_input: str, output: str) -> ListPrice:
    return ListPrice(family, input_price, cached_input, output, vendor="anthropic")


class CatalogueEntry(Struct, frozen=True):
    """What the catalogue knows about one model family."""

    family: str
    """Human name shown to users, e.g. "Llama 3", "GPT-4o", "Claude Sonnet 4"."""
    context_window: int
    """Tokens the model takes in one request, prompt and answer together."""
    max_output_tokens: int
    """The model's own maximum output (for open weights: the reservation described above)."""
    vision: bool = False
    """The model takes images in its input (SPEC §10)."""


def _hosted(family: str, context_window: int, max_output_tokens: int, *, vision: bool = False) -> CatalogueEntry:
    return CatalogueEntry(family, context_window, max_output_tokens, vision)


def _open_weights(family: str, context_window: int, *, vision: bool = False) -> CatalogueEntry:
    reserve = min(context_window // OPEN_WEIGHTS_OUTPUT_SHARE, OPEN_WEIGHTS_OUTPUT_CAP)
    return CatalogueEntry(family, context_window, reserve, vision)


# Between a family and its version: "llama3", "Llama-3", "llama_3" (GGUF files), "llama 3".
# Minor versions use "." or "_" ("llama3.1", "llama_3_1"); Anthropic's API writes
# "claude-3-5-sonnet" where OpenRouter writes "claude-3.5-sonnet", so both are accepted there.
_SEP = r"[-_ ]?"
# `(?<![a-z])` keeps "codellama" / "tinyllama" from reading as Llama, and so on.
_START = r"(?<![a-z])"

_CLAUDE_3_OUTPUT = 4096
_CLAUDE_3_5_OUTPUT = 8192
_CLAUDE_LONG_OUTPUT = 64000
_CLAUDE_OPUS_4_OUTPUT = 32000
_CLAUDE_WINDOW = 200000  # every Claude 3+ model; Sonnet 4/4.5's 1M window is an opt-in beta.
_GPT_4_OUTPUT = 4096
_O_SERIES_WINDOW = 200000
_O_SERIES_OUTPUT = 100000
_DEEPSEEK_API_WINDOW = 65536
# DeepSeek's API documents 8k as the answer limit of deepseek-chat; deepseek-reasoner allows
# a longer chain of thought, but reserving 64k of a 64k window would leave no room for input.
_DEEPSEEK_API_OUTPUT = 8192

_TABLE: tuple[tuple[str, CatalogueEntry], ...] = (
    # -- OpenAI: most specific names first (gpt-4o-mini before gpt-4o before gpt-4) --------
    (r"gpt-4o-mini", _hosted("GPT-4o mini", 128000, 16384, vision=True)),
    (r"gpt-4o", _hosted("GPT-4o", 128000, 16384, vision=True)),
    (r"gpt-4\.1", _hosted("GPT-4.1", 1047576, 32768, vision=True)),
    # gpt-5-chat-latest (the ChatGPT snapshot) has a smaller window than the GPT-5 API models.
    (r"gpt-5(?:\.\d+)?-chat", _hosted("GPT-5 Chat", 128000, 16384, vision=True)),
    (r"gpt-5", _hosted("GPT-5", 400000, 128000, vision=True)),
    # The first o1 releases were smaller than o1 proper.
    (r"^o1-preview", _hosted("o1-preview", 128000, 32768)),
    (r"^o1-mini", _hosted("o1-mini", 128000, 65536)),
    (r"^o1(?![a-z0-9])", _hosted("o1", _O_SERIES_WINDOW, _O_SERIES_OUTPUT, vision=True)),
    (r"^o3-mini", _hosted("o3-mini", _O_SERIES_WINDOW, _O_SERIES_OUTPUT)),  # text only, unlike o3
    (r"^o3(?![a-z0-9])", _hosted("o3", _O_SERIES_WINDOW, _O_SERIES_OUTPUT, vision=True)),
    (r"^o4-mini", _hosted("o4-mini", _O_SERIES_WINDOW, _O_SERIES_OUTPUT, vision=True)),
    # GPT-4 Turbo (gpt-4-turbo, gpt-4-turbo-2024-04-09) and the vision previews take images;
    # the 1106/0125 text previews do not.
    (r"gpt-4-(?:turbo|vision|\d{4}-vision)", _hosted("GPT-4 Turbo", 128000, 4096, vision=True)),
    (r"gpt-4-\d{4}-preview", _hosted("GPT-4 Turbo", 128000, 4096)),
    # OpenAI lists 8192 as GPT-4's output limit, but that is the whole shared window:
    # reserving all of it would leave no room for input, so half is reserved instead.
    (r"gpt-4(?![o.\d])", _hosted("GPT-4", 8192, _GPT_4_OUTPUT)),
    (r"gpt-3\.5-turbo(?!-instruct)", _hosted("GPT-3.5 Turbo", 16385, 4096)),
    # -- Anthropic: dated API names, Bedrock ids and dotted OpenRouter names ----------------
    (r"claude-3[-.]7", _hosted("Claude 3.7 Sonnet", _CLAUDE_WINDOW, _CLAUDE_LONG_OUTPUT, vision=True)),
    (r"claude-3[-.]5", _hosted("Claude 3.5", _CLAUDE_WINDOW, _CLAUDE_3_5_OUTPUT, vision=True)),
    (r"claude-3-(?:opus|sonnet|haiku)", _hosted("Claude 3", _CLAUDE_WINDOW, _CLAUDE_3_OUTPUT, vision=True)),
    # Opus 4.5 raised the output limit of the Opus line to that of Sonnet 4.5.
    (r"claude-opus-4[-.]5", _hosted("Claude Opus 4.5", _CLAUDE_WINDOW, _CLAUDE_LONG_OUTPUT, vision=True)),
    (r"claude-opus-4[-.]1", _hosted("Claude Opus 4.1", _CLAUDE_WINDOW, _CLAUDE_OPUS_4_OUTPUT, vision=True)),
    (r"claude-(?:opus-4|4-opus)", _hosted("Claude Opus 4", _CLAUDE_WINDOW, _CLAUDE_OPUS_4_OUTPUT, vision=True)),
    (r"claude-sonnet-4[-.]5", _hosted("Claude Sonnet 4.5", _CLAUDE_WINDOW, _CLAUDE_LONG_OUTPUT, vision=True)),
    (
        r"claude-(?:sonnet-4|4-sonnet)",
        _hosted("Claude Sonnet 4", _CLAUDE_WINDOW, _CLAUDE_LONG_OUTPUT, vision=True),
    ),
    (r"claude-haiku-4", _hosted("Claude Haiku 4.5", _CLAUDE_WINDOW, _CLAUDE_LONG_OUTPUT, vision=True)),
    # -- Google Gemini (hosted): a 1M window; 2.5 answers at length ---------------------------
    (r"gemini-2[._]5", _hosted("Gemini 2.5", 1048576, 65536, vision=True)),
    (r"gemini", _hosted("Gemini", 1048576, 8192, vision=True)),
    # -- DeepSeek, before Llama and Qwen ("DeepSeek-R1-Distill-Llama-8B" is DeepSeek's).
    # The chat/reasoner figures are the hosted API's; the open weights run longer (the R1
    # distills at 128k, V3 at 160k), so for them they are a floor until the server says more.
    (r"deepseek" + _SEP + r"coder" + _SEP + r"v2", _open_weights("DeepSeek-Coder-V2", 163840)),
    (r"deepseek" + _SEP + r"coder", _open_weights("DeepSeek Coder", 16384)),
    (
        r"deepseek" + _SEP + r"(?:reasoner|r1)",
        _hosted("DeepSeek-R1", _DEEPSEEK_API_WINDOW, _DEEPSEEK_API_OUTPUT),
    ),
    (
        r"deepseek" + _SEP + r"(?:chat|v3)",
        _hosted("DeepSeek-V3", _DEEPSEEK_API_WINDOW, _DEEPSEEK_API_OUTPUT),
    ),
    # -- Llama --------------------------------------------------------------------------
    (r"code-?llama", _open_weights("Code Llama", 16384)),
    (_START + r"llama" + _SEP + r"3[._]1(?!\d)", _open_weights("Llama 3.1", 131072)),
    (_START + r"llama" + _SEP + r"3[._]2(?!\d)", _open_weights("Llama 3.2", 131072)),
    (_START + r"llama" + _SEP + r"3[._]3(?!\d)", _open_weights("Llama 3.3", 131072)),
    (_START + r"llama" + _SEP + r"3(?![._]?\d)", _open_weights("Llama 3", 8192)),
    (_START + r"llama" + _SEP + r"2(?![._]?\d)", _open_weights("Llama 2", 4096)),
    # -- Qwen: 2.5-Coder before 2.5 before 2. The 2.5 models reach 128k only with YaRN
    # rope scaling switched on; their shipped config (and Ollama's) says 32768. ------------
    (r"qwen2[._]5" + _SEP + r"coder", _open_weights("Qwen2.5-Coder", 32768)),
    (r"qwen2[._]5", _open_weights("Qwen2.5", 32768)),
    (r"qwen2(?![._]?\d)", _open_weights("Qwen2", 32768)),
    # Qwen3 ships max_position_embeddings = 40960 (Ollama reports the same); the native
    # context is 32768 and reaches 128k only with YaRN, so 40960 is what a server runs.
    (r"qwen3(?!\d)", _open_weights("Qwen3", 40960)),
    (r"qwq", _open_weights("QwQ", 131072)),
    # -- Mistral ------------------------------------------------------------------------
    (r"mistral" + _SEP + r"nemo", _open_weights("Mistral NeMo", 131072)),
    # Mistral Small 3.1 and 3.2 have a 128k window; 22B (2409) and 3.0 (2501) have 32k.
    (
        r"mistral" + _SEP + r"small" + _SEP + r"3[._][12]",
        _open_weights("Mistral Small 3.1/3.2", 131072, vision=True),
    ),
    (r"mistral" + _SEP + r"small", _open_weights("Mistral Small", 32768)),
    (r"mistral" + _SEP + r"large", _open_weights("Mistral Large", 131072)),
    # Codestral 22B (2405); the later API-only Codestral 25.01 is larger, so this is a floor.
    (r"codestral", _open_weights("Codestral", 32768)),
    (r"ministral", _open_weights("Ministral", 131072)),
    (r"mixtral" + _SEP + r"8x22b", _open_weights("Mixtral 8x22B", 65536)),
    (r"mixtral", _open_weights("Mixtral", 32768)),
    # Mistral 7B v0.2 and later; v0.1 used an 8k sliding window inside the same 32k.
    (_START + r"mistral", _open_weights("Mistral 7B", 32768)),
    # -- Gemma: "gemma-2b" is Gemma 1 at 2B, "gemma-2-2b" is Gemma 2; Gemma 3n is not Gemma 3.
    (r"gemma" + _SEP + r"3[-_:](?:1b|270m)(?![a-z0-9])", _open_weights("Gemma 3 (small)", 32768)),
    (r"gemma" + _SEP + r"3(?![\dbn])", _open_weights("Gemma 3", 131072, vision=True)),
    (r"gemma" + _SEP + r"2(?![\db])", _open_weights("Gemma 2", 8192)),
    (
        _START + r"gemma(?:[-_ :]?(?:1\.1[-_])?[27]b(?![a-z0-9])|:latest$|$)",
        _open_weights("Gemma", 8192),
    ),
    # -- Small models ---------------------------------------------------------------------
    # Ollama's `phi3` is the 4k mini (and medium-4k); the 128k variants say so in the name.
    (_START + r"phi" + _SEP + r"3(?![._]?\d)(?!.*128k)", _open_weights("Phi-3", 4096)),
    (r"smollm2", _open_weights("SmolLM2", 8192)),
)


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]:
    """A pattern of the tables, compiled the first time a lookup reaches it (compiling them
    all at import cost every process that imports the catalogue 5 ms)."""
    return re.compile(pattern)


# A dated snapshot of the same model: `gpt-4o-2024-08-06`, `claude-sonnet-4-5-20250929`.
_DATED = r"(?:-\d{4}-\d{2}-\d{2}|-\d{8})?$"

_PRICES: tuple[tuple[str, ListPrice], ...] = (
    # -- OpenAI (platform.openai.com/docs/pricing, standard tier) --------------------------
    (r"^gpt-4o-mini", ListPrice("GPT-4o mini", "0.15", "0.075", "0.60")),
    (r"^gpt-4o-2024-05-13$", ListPrice("GPT-4o (2024-05-13)", "5.00", "5.00", "15.00")),
    (r"^gpt-4o", ListPrice("GPT-4o", "2.50", "1.25", "10.00")),
    (r"^gpt-4\.1-mini", ListPrice("GPT-4.1 mini", "0.40", "0.10", "1.60")),
    (r"^gpt-4\.1-nano", ListPrice("GPT-4.1 nano", "0.10", "0.025", "0.40")),
    (r"^gpt-4\.1", ListPrice("GPT-4.1", "2.00", "0.50", "8.00")),
    (r"^gpt-5-mini", ListPrice("GPT-5 mini", "0.25", "0.025", "2.00")),
    (r"^gpt-5-nano", ListPrice("GPT-5 nano", "0.05", "0.005", "0.40")),
    (r"^gpt-5(?:-chat-latest|-codex)?", ListPrice("GPT-5", "1.25", "0.125", "10.00")),
    (r"^gpt-5\.1(?:-chat-latest|-codex)?", ListPrice("GPT-5.1", "1.25", "0.125", "10.00")),
    (r"^gpt-5\.1-codex-mini", ListPrice("GPT-5.1 Codex mini", "0.25", "0.025", "2.00")),
    (r"^gpt-5\.2(?:-chat-latest)?", ListPrice("GPT-5.2", "1.75", "0.175", "14.00")),
    (r"^o1-mini", ListPrice("o1-mini", "1.10", "0.55", "4.40")),
    (r"^o1(?:-preview)?", ListPrice("o1", "15.00", "7.50", "60.00")),
    (r"^o3-mini", ListPrice("o3-mini", "1.10", "0.55", "4.40")),
    (r"^o3", ListPrice("o3", "2.00", "0.50", "8.00")),
    (r"^o4-mini", ListPrice("o4-mini", "1.10", "0.275", "4.40")),
    (r"^gpt-4-turbo", ListPrice("GPT-4 Turbo", "10.00", "10.00", "30.00")),
    (r"^gpt-4(?:-0613)?", ListPrice("GPT-4", "30.00", "30.00", "60.00")),
    (r"^gpt-3\.5-turbo(?:-0125)?", ListPrice("GPT-3.5 Turbo", "0.50", "0.50", "1.50")),
    # -- Anthropic (docs.anthropic.com pricing; cached input = a cache hit) -----------------
    (r"^claude-opus-4-5", _claude("Claude Opus 4.5", "5.00", "0.50", "25.00")),
    (r"^claude-opus-4-1", _claude("Claude Opus 4.1", "15.00", "1.50", "75.00")),
    (r"^claude-opus-4(?:-0)?", _claude("Claude Opus 4", "15.00", "1.50", "75.00")),
    (r"^claude-sonnet-4-5", _claude("Claude Sonnet 4.5", "3.00", "0.30", "15.00")),
    (r"^claude-sonnet-4(?:-0)?", _claude("Claude Sonnet 4", "3.00", "0.30", "15.00")),
    (r"^claude-haiku-4-5", _claude("Claude Haiku 4.5", "1.00", "0.10", "5.00")),
    (r"^claude-3-7-sonnet(?:-latest)?", _claude("Claude Sonnet 3.7", "3.00", "0.30", "15.00")),
    (r"^claude-3-5-sonnet(?:-latest)?", _claude("Claude Sonnet 3.5", "3.00", "0.30", "15.00")),
    (r"^claude-3-5-haiku(?:-latest)?", _claude("Claude Haiku 3.5", "0.80", "0.08", "4.00")),
    (r"^claude-3-opus(?:-latest)?", _claude("Claude Opus 3", "15.00", "1.50", "75.00")),
    (r"^claude-3-haiku", _claude("Claude Haiku 3", "0.25", "0.03", "1.25")),
)
"""Most specific first; each pattern is the whole name but for a date (see `_DATED`)."""


def list_price(model: str) -> ListPrice | None:
    """The list price of `model` as the vendor's own API bills it, or None when this table
    does not name it. The caller decides whether the vendor's API is the one spoken to (a
    gateway or a local server bills its own way)."""
    name = _normalize(model)
    for pattern, price in _PRICES:
        if _compiled(pattern + _DATED).match(name):
            return price
    return None


def entries() -> tuple[CatalogueEntry, ...]:
    """Every entry of the table, in matching order."""
    return tuple(entry for _, entry in _TABLE)


def _normalize(model: str) -> str:
    """The part of a model name the table matches: lower case, no org/path prefix, no
    `.gguf` suffix (`Org/Qwen2.5-7B-Instruct-Q4_K_M.gguf` → `qwen2.5-7b-instruct-q4_k_m`)."""
    name = model.strip().lower().rsplit("/", 1)[-1]
    return name[: -len(GGUF_SUFFIX)] if name.endswith(GGUF_SUFFIX) else name


VISION_NAME = re.compile(
    r"vision|llava|pixtral|moondream|minicpm-?v|(?<![a-z])vl(?![a-z])|-vl|gemma" + _SEP + r"3(?![\dbn])(?![-_:](?:1b|270m))"
)
"""Names of open-weight models that take images whatever their family (`llama3.2-vision`,
`qwen2.5-vl`, `llava`, `pixtral`, `minicpm-v`)."""


def takes_images(provider: str, model: str) -> bool:
    """Whether the catalogue knows `model` to take images (SPEC §10); `model.vision` overrides."""
    entry = lookup(provider, model)
    return (entry is not None and entry.vision) or VISION_NAME.search(_normalize(model)) is not None


def lookup(provider: str, model: str) -> CatalogueEntry | None:
    """The catalogue entry for `model`, or None when its family is unknown.

    `provider` ("openai", "anthropic" or "local") does not narrow the search: the name
    decides, because an OpenAI-compatible server can serve any family.
    """
    name = _normalize(model)
    if not name:
        return None
    for pattern, entry in _TABLE:
        if _compiled(pattern).search(name):
            return entry
    return None
