"""Exact o200k_base counts of plain text from the encoding's plain tokens (soba_nb/plain_counts.py):
the same number tiktoken's encoder makes, over every character of the alphabet (ASCII, Latin-1,
general punctuation), or None and tiktoken counts; the classes are the Unicode ones; the table
is kept only for the pattern transcribed, read only when it is the one expected, and a
`TokenCounter` uses it until a text it cannot count, then the encoder."""

from __future__ import annotations

import json
import re
import string
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soba_nb import plain_counts, tokenizer_cache, tokens
from soba_nb.plain_counts import (
    FILE_NAME,
    MAX_PIECE,
    PlainCounter,
    build,
    keep_tokens,
    plain_counter,
)
from soba_nb.tokens import EncodingChoice, TokenCounter

ASCII = "".join(map(chr, range(128)))
PLAIN = "".join(chr(code) for code in range(0x2070) if plain_counts.is_plain(chr(code)))
FRAGMENTS = [
    "café", " naïve", "Ærø", "ÉCOLE", "straße", "l’été", "’s", " “quoted”", "—", " – ", "…", "•", "°C", "±1",
    "×", "÷", "½", "²", " ³", "µs", "ª", "º", "¿Qué?", "¡Sí!", "\xa0", "\u2009", "\u202f", "\u2028", "\u2029",
    "\u200b", "\u2060", "\u2066x\u2069", "‰", "′″", "‹›", "«»", "§1", "©", "®", "¬", "\xad", "É’S", "DON’T",
    "the", " the", "The", " THE", "don't", " I'm", "WE'LL", "they'Re", "'s", "'", "it's",
    "0", "12", "2024-09-12", "1234567", "3.14159", " 42", "$1,234.56", "1e-9",
    " ", "  ", "    ", "\t", "\n", "\n\n", "\r\n", " \n", "\t\n  ", "\x0b", "\x0c", "\x1c", "\x1f", "\x00", "\x7f",
    "df.groupby('region').revenue.sum()", 'print(f"{x!r}")', "// c", "/*", "*/", "a/b/c\n", "x+=1;",
    '{"code": "df.describe()"}', "<|endoftext|>", "https://example.com/a?b=c", "---", "===", "...", "!!!",
    "CamelCase", "snake_case_name", "HTTPServer", "getHTTPResponse", "iPhone", "ABCdef", "xX",
    "    return None\n", "# comment\n", "date,region,cohort\n", "a" * 40, " " * 40, "-" * 40,
]
plain_texts = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(alphabet=ASCII, max_size=6), st.text(alphabet=PLAIN, max_size=6)),
    max_size=30,
).map("".join)


@pytest.fixture(scope="module")
def encoding():
    return tokens.get_encoding("o200k_base")


def published_ranks() -> dict[bytes, int]:
    return tokens._mergeable_ranks("o200k_base", tokens._packaged_bpe("o200k_base"))


@pytest.fixture(scope="module")
def counter() -> PlainCounter:
    return PlainCounter(build(published_ranks()))


@settings(max_examples=600, deadline=None)
@given(plain_texts)
def test_every_plain_text_counts_as_tiktoken_counts_it(counter: PlainCounter, encoding, text: str) -> None:
    expected = len(encoding.encode_ordinary(text))
    assert counter.count(text) in (expected, None)
    if all(len(piece.encode()) <= MAX_PIECE for piece in plain_counts.PATTERN.findall(text)):
        assert counter.count(text) == expected


@pytest.mark.parametrize("character", list(PLAIN), ids=lambda c: f"U+{ord(c):04X}")
def test_each_character_between_others_counts_as_tiktoken_counts_it(counter: PlainCounter, encoding, character: str) -> None:
    """Python's `\\s` is not tiktoken's (\\x1c-\\x1f): each character alone, in runs and
    between words, capitals, spaces, digits and newlines."""
    for text in (character, character * 3, f"a{character}b", f" {character} ", f"1{character}2", f"\n{character}\n",
                 f"x {character}y's", f"AB{character}cd", f"{character}’s", f"é{character}ü"):
        assert counter.count(text) == len(encoding.encode_ordinary(text)), repr(text)


def test_the_texts_soba_counts_most_count_as_tiktoken_counts_them(counter: PlainCounter, encoding) -> None:
    """The system prompt, the tool schemas, and every paragraph of this repository's
    documentation and Python sources in plain text (most: em dashes, ’, ×, §)."""
    import msgspec

    from soba_nb.agent.prompt import SYSTEM_PROMPT
    from soba_nb.agent.tool_schemas import COMPACT_TOOL_SCHEMAS, TOOL_SCHEMAS

    root = Path(__file__).resolve().parents[1]
    schemas = [msgspec.structs.asdict(schema) for schema in (*TOOL_SCHEMAS, *COMPACT_TOOL_SCHEMAS)]
    texts = [SYSTEM_PROMPT, *(json.dumps(schema, separators=(",", ":")) for schema in schemas)]
    for path in [*root.glob("*.md"), *root.glob("docs/*.md"), *root.glob("soba_nb/**/*.py")]:
        texts += path.read_text(encoding="utf-8").split("\n\n")
    counted = 0
    for text in texts:
        count = counter.count(text)
        if plain_counts.is_plain(text) and count is None:
            assert any(len(piece.encode()) > MAX_PIECE for piece in plain_counts.PATTERN.findall(text))
        if count is not None:
            assert count == len(encoding.encode_ordinary(text)), text[:200]
            counted += 1
    assert counted > 1_000


def test_the_classes_are_the_unicode_ones_within_the_alphabet() -> None:
    """`LETTER`, `UPPER`, … as `unicodedata` has them (White_Space: Unicode's list), and the
    alphabet without unassigned code points or the C1 controls."""
    def within(ranges: str) -> set[str]:
        return {c for c in PLAIN if re.fullmatch(f"[{ranges}]", c)}

    def category(*prefixes: str) -> set[str]:
        return {c for c in PLAIN if unicodedata.category(c).startswith(prefixes)}

    assert within(plain_counts.LETTER) == category("L")
    assert within(plain_counts.UPPER) == category("Lu", "Lt", "Lm", "Lo", "M")
    assert within(plain_counts.LOWER) == category("Ll", "Lm", "Lo", "M")
    assert within(plain_counts.NUMBER) == category("N")
    white_space = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {chr(c) for c in range(0x2000, 0x200B)}
    assert within(plain_counts.SPACE) == white_space & set(PLAIN)
    assert "Cn" not in {unicodedata.category(c) for c in PLAIN} and not any("\x80" <= c <= "\x9f" for c in PLAIN)
    assert len(PLAIN) == 128 + 96 + 111


def test_what_it_does_not_count_is_none(counter: PlainCounter, encoding) -> None:
    assert counter.count("数据") is None and counter.count("a 🙂 b") is None and counter.count("Привет") is None
    assert counter.count("x\x85y") is None and counter.count("\u2065") is None  # a C1 control, unassigned
    assert counter.count("l’été — café") == len(encoding.encode_ordinary("l’été — café")) == 4
    assert counter.count("x" * (MAX_PIECE + 1)) is None  # one piece, left to tiktoken
    assert counter.count(" ".join(["word"] * 1000)) == 1000  # long text, short pieces
    assert counter.count("") == 0


def test_a_token_is_found_with_its_rank_and_anything_else_is_none(counter: PlainCounter, encoding) -> None:
    for token in (b"a", b" the", b"\n\n", b"    ", b"ing", b"://"):
        assert counter.rank(token) == encoding.encode_single_token(token)
    assert counter.rank(b"zzqqxxjj") is None and counter.rank(b"") is None


def test_the_pattern_transcribed_is_tiktokens(encoding) -> None:
    """A tiktoken whose o200k_base pattern differs fails here, and at run time writes no table."""
    assert encoding._pat_str == plain_counts.SOURCE_PATTERN


def test_the_table_of_the_published_ranks_is_the_file_expected() -> None:
    from soba_nb.digest import digest

    table = build(published_ranks())
    assert digest(table) == plain_counts.EXPECTED_DIGEST
    assert len(table) < tokenizer_cache.MAX_CACHE_BYTES


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setattr(tokenizer_cache, "CACHE_FOLDER", folder)
    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    monkeypatch.setattr(plain_counts, "_COUNTERS", {})
    return folder


def test_loading_the_encoder_keeps_the_table_and_the_next_process_counts_from_it(cache: Path) -> None:
    assert plain_counter("o200k_base") is None  # nothing kept yet
    plain_counts._COUNTERS.clear()
    tokens.get_encoding("o200k_base")
    assert (cache / FILE_NAME).is_file() and oct((cache / FILE_NAME).stat().st_mode & 0o777) == "0o600"
    counter = plain_counter("o200k_base")
    assert counter is not None and counter.count("Load part 3 of sales.csv") == 7
    assert plain_counter("cl100k_base") is None  # one encoding only


def test_no_table_is_kept_for_another_pattern_or_encoding(cache: Path) -> None:
    ranks = published_ranks()
    keep_tokens("o200k_base", plain_counts.SOURCE_PATTERN.replace("{1,3}", "{1,4}"), ranks)
    keep_tokens("cl100k_base", plain_counts.SOURCE_PATTERN, ranks)
    assert not cache.exists() or not any(cache.iterdir())
    keep_tokens("o200k_base", plain_counts.SOURCE_PATTERN, ranks)
    assert [p.name for p in cache.iterdir()] == [FILE_NAME]


@pytest.mark.parametrize(
    "spoil",
    [
        lambda table: table[: len(table) // 2],  # torn
        lambda table: b"",
        lambda table: table[:-1] + bytes([table[-1] ^ 1]),  # one bit: a rank changed
        lambda table: plain_counts.MAGIC + b"\x01\x00\x00" + b"\x00\x00\x00",  # well formed, another table
    ],
    ids=["torn", "empty", "bit", "planted"],
)
def test_a_spoiled_table_is_not_read_and_is_replaced_by_the_next_load(cache: Path, spoil) -> None:
    keep_tokens("o200k_base", plain_counts.SOURCE_PATTERN, published_ranks())
    path = cache / FILE_NAME
    path.write_bytes(spoil(path.read_bytes()))
    assert plain_counter("o200k_base") is None
    assert not path.exists()  # removed, so the next process that builds the encoder writes it
    tokens.get_encoding("o200k_base")
    plain_counts._COUNTERS.clear()
    assert plain_counter("o200k_base") is not None


def test_a_link_in_its_place_is_neither_followed_nor_replaced(cache: Path, tmp_path: Path) -> None:
    keep_tokens("o200k_base", plain_counts.SOURCE_PATTERN, published_ranks())
    real = tmp_path / "elsewhere.plain"
    real.write_bytes((cache / FILE_NAME).read_bytes())
    (cache / FILE_NAME).unlink()
    (cache / FILE_NAME).symlink_to(real)
    assert plain_counter("o200k_base") is None
    tokens.get_encoding("o200k_base")
    assert (cache / FILE_NAME).is_symlink() and real.read_bytes() == build(published_ranks())


def refuse_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(name: str) -> None:
        raise AssertionError(f"encoder {name} built")

    monkeypatch.setattr(tokens, "get_encoding", refuse)


def test_a_counter_counts_plain_text_without_the_encoder_and_the_same(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keep_tokens("o200k_base", plain_counts.SOURCE_PATTERN, published_ranks())
    texts = ["You are soba.", '{"name":"python","description":"Run Python"}', "region,revenue\nnorth,3\n" * 20]
    expected = [TokenCounter.for_model("openai", "gpt-4o").count_message("user", text) for text in texts]
    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    refuse_encoder(monkeypatch)
    counter = TokenCounter.for_model("openai", "gpt-4o")
    counter.load(plain_text=True)  # the table is enough
    assert [counter.count_message("user", text) for text in texts] == expected
    fallback = TokenCounter.for_model("anthropic", "claude-sonnet-4-5")  # o200k_base, times 1.15
    assert fallback.count_text(texts[2]) == -(-int(expected[2] - 3 - 1) * 115 // 100)


def test_a_counter_loads_the_encoder_for_other_text_and_beyond_its_share(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keep_tokens("o200k_base", plain_counts.SOURCE_PATTERN, published_ranks())
    built: list[str] = []
    real = tokens.get_encoding

    def spy(name: str):
        built.append(name)
        return real(name)

    monkeypatch.setattr(tokens, "get_encoding", spy)
    counter = TokenCounter.for_model("openai", "gpt-4o")
    assert counter.count_text("plain words") == 2 and built == []
    assert counter.count_text("naïve café") == 4 and built == []  # plain text too (as tiktoken counts it)
    assert counter.count_text("数据分析") == len(real("o200k_base").encode_ordinary("数据分析"))
    assert built == ["o200k_base"]

    built.clear()
    loaded = TokenCounter.for_model("openai", "gpt-4o")  # the process has the encoder: it counts
    assert loaded.count_text("plain words") == 2 and built == ["o200k_base"]

    built.clear()
    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    other = TokenCounter.for_model("openai", "gpt-4o")
    share = "word " * (tokens.PLAIN_CHARS // 5)
    assert other.count_text(share[: tokens.PLAIN_CHARS - 10]) > 0 and built == []
    assert other.count_text("and more words than its share") == 6 and built == ["o200k_base"]

    built.clear()
    counter.load()  # without `plain_text`: the encoder
    TokenCounter.for_model("openai", "gpt-4o").load()
    assert built == ["o200k_base"]


def test_without_a_table_the_encoder_counts(cache: Path) -> None:
    counter = TokenCounter.for_model("openai", "gpt-4o")
    counter.load(plain_text=True)
    assert "o200k_base" in tokens._ENCODINGS  # nothing kept: `load` built the encoder


def test_a_counter_with_its_own_tokenizer_never_uses_the_table(cache: Path) -> None:
    keep_tokens("o200k_base", plain_counts.SOURCE_PATTERN, published_ranks())
    counter = TokenCounter(EncodingChoice("o200k_base", 1.0, True), tokenizer=len)
    assert counter.count_text("abc def") == len("abc def")


def test_every_printable_ascii_character_alone_is_one_token(counter: PlainCounter) -> None:
    assert [counter.count(character) for character in string.printable] == [1] * len(string.printable)


@pytest.mark.parametrize("plant", ["folder", "fifo", "huge"])
def test_a_folder_fifo_or_huge_file_in_its_place_is_not_read_and_counting_goes_on(cache: Path, plant: str) -> None:
    """Nothing planted where the table lives hangs, crashes or miscounts: the encoder counts."""
    import os

    cache.mkdir(parents=True)
    path = cache / FILE_NAME
    if plant == "folder":
        path.mkdir()
    elif plant == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(plain_counts.MAGIC + b"\0" * (tokenizer_cache.MAX_CACHE_BYTES + 1))
    assert plain_counter("o200k_base") is None
    counter = TokenCounter.for_model("openai", "gpt-4o")
    assert counter.count_text("l’été — café") == len(tokens.get_encoding("o200k_base").encode_ordinary("l’été — café"))
    assert plant == "huge" or path.exists()  # not followed, not replaced: only a spoiled regular file is
