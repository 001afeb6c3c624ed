"""Issue 14: a resumed session never re-tokenises its path (the counts sidecar), and long
texts are counted in linear time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb import plain_counts, tokens
from soba_nb.tokens import TokenCounter, get_encoding
from soba_nb.transcript.token_index import TokenIndex, index_path


def magics(ip):
    return ip.magics_manager.registry["SobaMagics"]


def test_a_resumed_session_measures_without_its_tokenizer(ip, nb_dir, scripted, monkeypatch):
    from conftest import new_shell, shut_down

    for index in range(3):
        scripted.script(text(f"Answer {index}. " + "The numbers agree. " * 50))
        with capture_output():
            ip.run_line_magic("soba", f"question {index}")
    agent = magics(ip).agent
    before = agent.compactor.measure()
    sidecar = index_path(agent.file)
    assert sidecar.exists() and sidecar.read_bytes().count(b"\n") > 6

    shut_down(ip)

    def no_tokenizer(name: str):
        raise AssertionError(f"the {name} tokenizer was loaded to count a path already counted")

    monkeypatch.setattr(tokens, "get_encoding", no_tokenizer)
    monkeypatch.setattr(plain_counts, "plain_counter", no_tokenizer)
    shell = new_shell(nb_dir)
    with capture_output():
        shell.run_line_magic("budget", "")
    after = magics(shell).agent.compactor.measure()
    assert (after.estimated, after.effective) == (before.estimated, before.effective)


def test_the_index_is_a_cache_it_survives_torn_lines_and_foreign_counters(tmp_path: Path):
    transcript = tmp_path / "s.jsonl"
    index = TokenIndex.open(transcript, "o200k_base x1")
    index.add("aaaa1111", 12)
    index.add("bbbb2222", 30)
    index.close()
    with open(index_path(transcript), "ab") as handle:
        handle.write(b"cccc3333 4")  # a crash mid-write: no newline, and maybe a cut number
    reopened = TokenIndex.open(transcript, "o200k_base x1")
    counts = reopened.read_counts()
    assert counts["aaaa1111"] == 12 and counts["bbbb2222"] == 30
    reopened.add("dddd4444", 7)  # starts on a fresh line
    reopened.close()
    again = TokenIndex.open(transcript, "o200k_base x1", writable=False)
    assert again.read_counts()["dddd4444"] == 7

    other = TokenIndex.open(transcript, "cl100k_base x1")  # another tokenizer: replaced, not trusted
    assert other.read_counts() == {}
    other.close()
    assert TokenIndex.open(transcript, "o200k_base x1", writable=False).read_counts() == {}


def test_opening_reads_only_the_header_the_counts_when_first_missing(tmp_path: Path):
    transcript = tmp_path / "s.jsonl"
    index = TokenIndex.open(transcript, "o200k_base x1")
    index.add("aaaa1111", 12)
    index.close()
    reads: list[int] = []
    reopened = TokenIndex.open(transcript, "o200k_base x1", writable=False)

    def read_counts() -> dict[str, int]:
        reads.append(1)
        return reopened.read_counts()

    counter = TokenCounter.for_model("openai", "gpt-4o")
    counter.backfill = read_counts
    counter.prime({"known": 5})
    assert counter.known("known") == 5 and reads == []  # what is at hand needs no read
    assert counter.known_all(["known", "aaaa1111"]) == [5, 12] and reads == [1]
    assert counter.known("nowhere") is None and reads == [1]  # read once, whatever is missing later
    assert counter.cached("nowhere", lambda: 3) == 3


def test_the_index_is_never_followed_through_a_link(tmp_path: Path):
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("keep me\n")
    transcript = tmp_path / "s.jsonl"
    os.symlink(outside, index_path(transcript))
    index = TokenIndex.open(transcript, "o200k_base x1")
    index.add("aaaa1111", 3)
    index.close()
    assert outside.read_text() == "keep me\n"


def test_long_texts_count_in_pieces_and_exactly_for_ordinary_text():
    counter = TokenCounter.for_model("openai", "gpt-4o")
    encoding = get_encoding("o200k_base")
    prose = "The revenue by region held steady through the quarter. " * 4000
    table = "\n".join(f"{row},{row * 3.1:.2f},North" for row in range(20000))
    assert counter.count_text(prose) == len(encoding.encode_ordinary(prose))
    assert counter.count_text(table) == len(encoding.encode_ordinary(table))
    # One 5 MB run without a space: counted in pieces (seconds, not minutes: benchmarks/).
    assert counter.count_text("x" * 5_000_000) == 625_000


@pytest.mark.parametrize("size", [0, 1, 16_384, 16_385, 40_000])
def test_pieces_cover_the_text(size: int):
    text_ = ("ab cd\nef" * 10_000)[:size]
    assert "".join(tokens._pieces(text_)) == text_


def test_counts_read_in_blocks_keyed_by_the_callers_strings(tmp_path: Path):
    from soba_nb.transcript import token_index

    transcript = tmp_path / "s.jsonl"
    index = TokenIndex.open(transcript, "o200k_base x1")
    ids = [f"{n:08x}" for n in range(3 * token_index.READ_BLOCK_CHARS // 12)]  # several blocks
    for n, entry_id in enumerate(ids):
        index.add(entry_id, n)
    index.close()
    with open(index_path(transcript), "ab") as handle:
        handle.write(b"torn")  # a torn last line in the last block only
    own = {entry_id: "".join(entry_id) for entry_id in ids}  # equal strings, other objects
    reopened = TokenIndex.open(
        transcript, "o200k_base x1", writable=False, keys_of=lambda keys: [own.get(key, key) for key in keys]
    )
    counts = reopened.read_counts()
    assert counts == {entry_id: n for n, entry_id in enumerate(ids)}
    assert all(key is own[key] for key in counts)
    assert reopened.counts == {}  # the index keeps only what it adds
