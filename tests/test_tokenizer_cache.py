"""The tokenizer's ranks kept in the user's cache folder (soba_nb/tokenizer_cache.py): read back only
when they are tiktoken's published ranks, replaced when torn, stale or planted, never
followed through a link, and a folder that cannot be written costs nothing but time."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from soba_nb import tokenizer_cache, tokens
from soba_nb.tokenizer_cache import cache_path, keep_ranks, read_ranks

TEXTS = ["hello world", "df.groupby('region').revenue.sum()", "Ünïcödé — 数据 🙂", "x" * 5000, "  \n\t "]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "home" / ".soba" / "cache"
    monkeypatch.setattr(tokenizer_cache, "CACHE_FOLDER", folder)
    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    return folder


def packaged(name: str) -> dict[bytes, int]:
    return tokens._mergeable_ranks(name, tokens._packaged_bpe(name))


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_kept_ranks_read_back_equal_to_the_packaged_file(cache: Path, name: str) -> None:
    assert read_ranks(name) is None  # nothing kept yet
    ranks = packaged(name)
    keep_ranks(name, ranks)
    assert read_ranks(name) == ranks
    mode = cache_path(name).stat().st_mode
    assert stat.S_IMODE(mode) == 0o600 and stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert [p.name for p in cache.iterdir()] == [f"{name}.ranks"]  # no temporary file left


def test_the_first_load_keeps_the_ranks_and_the_next_counts_the_same(cache: Path) -> None:
    first = tokens.get_encoding("o200k_base")
    counts = [len(first.encode_ordinary(text)) for text in TEXTS]
    assert cache_path("o200k_base").is_file()
    tokens._ENCODINGS.clear()
    again = tokens.get_encoding("o200k_base")
    assert again is not first
    assert [len(again.encode_ordinary(text)) for text in TEXTS] == counts
    assert again.encode_ordinary(TEXTS[2]) == first.encode_ordinary(TEXTS[2])


@pytest.mark.parametrize(
    "spoil",
    [
        lambda blob: blob[: len(blob) // 2],  # torn
        lambda blob: b"",  # empty
        lambda blob: blob[:-1] + bytes([blob[-1] ^ 1]),  # one bit
        lambda blob: b"\x91\xc4\x01a",  # valid msgpack, other ranks (a planted tokenizer)
        lambda blob: b"\xff" * 100,  # not msgpack
    ],
    ids=["torn", "empty", "bit", "planted", "garbage"],
)
def test_a_spoiled_file_is_not_read_and_is_replaced(cache: Path, spoil: object) -> None:
    name = "cl100k_base"
    ranks = packaged(name)
    keep_ranks(name, ranks)
    path = cache_path(name)
    path.write_bytes(spoil(path.read_bytes()))  # type: ignore[operator]
    assert read_ranks(name) is None
    encoding = tokens.get_encoding(name)
    assert len(encoding.encode_ordinary("hello world")) == 2
    assert read_ranks(name) == ranks  # the load put the right file back


def test_a_link_in_its_place_is_not_followed(cache: Path, tmp_path: Path) -> None:
    name = "cl100k_base"
    keep_ranks(name, packaged(name))
    real = tmp_path / "elsewhere.ranks"
    real.write_bytes(cache_path(name).read_bytes())
    cache_path(name).unlink()
    cache_path(name).symlink_to(real)
    assert read_ranks(name) is None
    keep_ranks(name, packaged(name))  # replaced by a file; the link's target is left alone
    assert not cache_path(name).is_symlink() and read_ranks(name) is not None
    assert real.read_bytes() == cache_path(name).read_bytes()


def test_a_folder_in_its_place_or_a_fifo_is_not_waited_on(cache: Path) -> None:
    cache.mkdir(parents=True)
    os.mkfifo(cache_path("o200k_base"))
    cache_path("cl100k_base").mkdir()
    assert read_ranks("o200k_base") is None and read_ranks("cl100k_base") is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_folder_that_cannot_be_written_only_costs_the_slow_read(cache: Path) -> None:
    cache.mkdir(parents=True)
    cache.chmod(0o500)
    try:
        assert len(tokens.get_encoding("cl100k_base").encode_ordinary("hello world")) == 2
        assert list(cache.iterdir()) == []
    finally:
        cache.chmod(0o700)


def test_no_home_folder_only_costs_the_slow_read(cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setattr(tokenizer_cache, "CACHE_FOLDER", blocker / "cache")
    assert len(tokens.get_encoding("cl100k_base").encode_ordinary("hello world")) == 2
    assert read_ranks("cl100k_base") is None


def test_ranks_that_are_not_the_published_ones_are_not_kept(cache: Path) -> None:
    keep_ranks("o200k_base", {b"a": 0, b"b": 1})
    keep_ranks("some_other_encoding", packaged("cl100k_base"))
    assert not cache.exists() or list(cache.iterdir()) == []


def test_the_ranks_go_to_the_users_cache_folder_never_beside_their_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`$XDG_CACHE_HOME/soba-nb`, else `~/.cache/soba-nb` (a relative XDG_CACHE_HOME is ignored,
    as the XDG rules say): a JupyterHub user's home is their notebook folder."""
    monkeypatch.setattr(tokenizer_cache, "CACHE_FOLDER", None)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path("o200k_base") == tmp_path / "xdg" / "soba-nb" / "o200k_base.ranks"
    for unset in ("", "relative/cache"):
        monkeypatch.setenv("XDG_CACHE_HOME", unset)
        assert cache_path("o200k_base") == tmp_path / "home" / ".cache" / "soba-nb" / "o200k_base.ranks"
