r"""Exact o200k_base counts of plain text, without building tiktoken's encoder.

tiktoken's o200k_base encoder takes 0.1–0.15 s and about 60 MiB to build (its Rust core
hashes, copies and sorts 200,000 tokens, holding the interpreter). A transcript opened with no
budget state counts only what came after its last usage figure: a few kilobytes, which the
encoder counts in a millisecond once it exists. This module counts such text as tiktoken does,
without the encoder, when it is plain text: ASCII, the Latin-1 letters and signs (é, ü, ñ, °,
×, the no-break space) and the general punctuation (’ “ ” — – … •), `ALPHABET_RANGES`:

- tiktoken cuts a text into pieces with the encoding's pattern; a piece is one token when it
  is one, else its bytes are merged pairwise, the adjacent pair that is the token of lowest
  rank first (the leftmost of equals), until no adjacent pair is a token. Only a piece's own
  substrings are ever looked up, so plain text needs only the tokens made of the bytes its
  UTF-8 has: 138,315 of the encoding's 200,000, kept in the user's cache folder
  (`o200k_base.plain`, `soba_nb.tokenizer_cache`) as a hash table looked up where it lies
  (`build`): reading it is reading 2.3 MB and their BLAKE2b digest, about 3 ms, where decoding
  the tokens into Python objects alone takes 6.
- `PATTERN` is the encoding's pattern on plain text: each Unicode class replaced by its
  members among these characters (`\p{L}`, `\p{Lu}`…, as `unicodedata` has them: the
  categories of these characters have not changed since Unicode 1.1, whatever version
  tiktoken's engine has), and `\s` by Unicode's White_Space among them (Python's own `\s` also matches \x1c–\x1f, which
  tiktoken's does not). Python's `re` and tiktoken's engine both backtrack and take the
  leftmost alternative that matches.
- The tokens are written only by a process that built tiktoken's encoder and found its
  pattern to be `SOURCE_PATTERN`, the one transcribed here (`soba_nb.tokens.get_encoding`): a
  tiktoken with another pattern leaves this path unused, never wrong.

Anything else is None, and the caller counts with tiktoken: a text with another character
(CJK, emoji, Cyrillic, the C1 controls), a piece longer than `MAX_PIECE` bytes (merging is
quadratic here), no tokens kept or none to trust. tests/test_plain_counts.py compares the counts
with tiktoken's over every character of the alphabet.
"""

from __future__ import annotations

import re
import threading
from zlib import crc32

import soba_nb.tokenizer_cache as tokenizer_cache
from soba_nb.digest import digest

ENCODING = "o200k_base"
"""The one encoding counted here."""

FILE_NAME = f"{ENCODING}.plain"
EXPECTED_DIGEST = "70cf840a837630177bcacabad7594094769d5c345ffc77f4bb54a78deb83d9bc"
"""BLAKE2b-256 (`soba_nb.digest`) of the file `build` makes of tiktoken's published o200k_base ranks."""

SOURCE_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
"""tiktoken's pattern for o200k_base, which `PATTERN` transcribes."""

ALPHABET_RANGES = "\x00-\x7f\xa0-\xff\u2000-\u2064\u2066-\u206f"
"""The characters of plain text, as a class's ranges: ASCII, Latin-1 Supplement without its C1
controls, General Punctuation without U+2065 (unassigned: its class may change)."""

# `SOURCE_PATTERN`'s classes within the alphabet (tests/test_plain_counts.py derives them from
# `unicodedata` and compares): \p{L}; \p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}; \p{Ll}\p{Lm}\p{Lo}\p{M};
# \p{N}; \s (Unicode's White_Space).
LETTER = "A-Za-z\xaa\xb5\xba\xc0-\xd6\xd8-\xf6\xf8-\xff"
UPPER = "A-Z\xaa\xba\xc0-\xd6\xd8-\xde"
LOWER = "a-z\xaa\xb5\xba\xdf-\xf6\xf8-\xff"
NUMBER = "0-9\xb2\xb3\xb9\xbc-\xbe"
SPACE = "\t\n\x0b\x0c\r \xa0\u2000-\u200a\u2028\u2029\u202f\u205f"
_CONTRACTION = "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
PATTERN = re.compile(
    "|".join(
        [
            rf"[^\r\n{LETTER}{NUMBER}]?[{UPPER}]*[{LOWER}]+{_CONTRACTION}",
            rf"[^\r\n{LETTER}{NUMBER}]?[{UPPER}]+[{LOWER}]*{_CONTRACTION}",
            rf"[{NUMBER}]{{1,3}}",
            rf" ?[^{SPACE}{LETTER}{NUMBER}]+[\r\n/]*",
            rf"[{SPACE}]*[\r\n]+",
            rf"[{SPACE}]+(?![^{SPACE}])",
            rf"[{SPACE}]+",
        ]
    )
)
_OUTSIDE = re.compile(f"[^{ALPHABET_RANGES}]")
"""A character that is not plain text."""

MAX_PIECE = 128
"""A longer piece, in bytes (a run of one character class: dashes, spaces, one long word), is left to tiktoken."""
MAX_KNOWN = 100_000
"""Pieces whose counts are remembered, at most (then forgotten all at once)."""

MAGIC = b"soba-nb plain tokens 1\n"
WIDTH = 3
"""Bytes of a slot, of a rank and of the slot count (o200k_base's are all under 2**24)."""
_NONE = 1 << (8 * WIDTH)
"""Above every rank: the rank of bytes that are no token."""


def build(ranks: dict[bytes, int]) -> bytes:
    """The file of the tokens of `ranks` made of the bytes plain text has in UTF-8:
    an open-addressing hash table, used where it lies (read and its digest checked; nothing
    decoded).

    `MAGIC`, the slot count, the slots, then the entries, one per token, sorted: a byte of
    length, the token, its rank. A token is looked for from slot `crc32(token) % slot count`
    on, one slot at a time (wrapping); a slot holds the offset of an entry after the slots,
    plus one (0: empty, the token is not there). There are twice as many slots as tokens.
    Numbers are `WIDTH` bytes, little-endian."""
    plain_bytes = {byte for code in range(0x2070) if is_plain(chr(code)) for byte in chr(code).encode()}
    tokens = sorted(token for token in ranks if plain_bytes.issuperset(token))
    entries, offsets = bytearray(), []
    for token in tokens:
        offsets.append(len(entries))
        entries += bytes([len(token)]) + token + ranks[token].to_bytes(WIDTH, "little")
    size = 2 * len(tokens)
    slots = [0] * size
    for token, offset in zip(tokens, offsets, strict=True):
        at = crc32(token) % size
        while slots[at]:
            at = (at + 1) % size
        slots[at] = offset + 1
    numbers = b"".join(number.to_bytes(WIDTH, "little") for number in [size, *slots])
    return MAGIC + numbers + bytes(entries)


def is_plain(text: str) -> bool:
    """Whether every character of `text` is plain text (`ALPHABET_RANGES`)."""
    return text.isascii() or _OUTSIDE.search(text) is None


class PlainCounter:
    """Counts plain text with the table `build` made of an encoding's tokens."""

    def __init__(self, table: bytes):
        if not table.startswith(MAGIC):
            raise ValueError("not a table of plain tokens")
        start = len(MAGIC) + WIDTH
        self._size = int.from_bytes(table[len(MAGIC) : start], "little")
        whole = memoryview(table)  # the parts where they lie: copying them would take longer than using them
        self._slots = whole[start : start + WIDTH * self._size]
        self._entries = whole[start + WIDTH * self._size :]
        self._known: dict[str, int] = {}
        self._ranks: dict[bytes, int] = {}
        """Ranks looked up so far (the pairs of merging repeat: `th`, `in`, `er`)."""

    def count(self, text: str) -> int | None:
        """The number of tokens tiktoken makes of `text`, or None when it is not plain text
        (`ALPHABET_RANGES`) or has a piece longer than `MAX_PIECE` bytes."""
        if not is_plain(text):
            return None
        known = self._known
        if len(known) > MAX_KNOWN:
            known.clear()
            self._ranks.clear()
        total = 0
        for piece in PATTERN.findall(text):
            count = known.get(piece)
            if count is None:
                encoded = piece.encode()
                if len(encoded) > MAX_PIECE:
                    return None
                count = known[piece] = self._merged(encoded)
            total += count
        return total

    def rank(self, part: bytes) -> int | None:
        """The rank of the token `part`, or None when it is none."""
        rank = self._rank(part)
        return None if rank == _NONE else rank

    def _rank(self, part: bytes) -> int:
        rank = self._ranks.get(part)
        if rank is None:
            rank = self._ranks[part] = self._look_up(part)
        return rank

    def _look_up(self, part: bytes) -> int:
        slots, entries, size = self._slots, self._entries, self._size
        at = crc32(part) % size
        while slot := int.from_bytes(slots[WIDTH * at : WIDTH * at + WIDTH], "little"):
            length = entries[slot - 1]
            if entries[slot : slot + length] == part:
                return int.from_bytes(entries[slot + length : slot + length + WIDTH], "little")
            at = (at + 1) % size
        return _NONE

    def _merged(self, piece: bytes) -> int:
        """How many tokens byte-pair merging leaves of `piece`."""
        if self._rank(piece) != _NONE:
            return 1
        rank = self._rank
        bounds = list(range(len(piece) + 1))  # part k is piece[bounds[k]:bounds[k + 1]]
        pairs = [rank(piece[at : at + 2]) for at in range(len(piece) - 1)]  # parts k and k + 1 as one
        while pairs:
            lowest = min(pairs)
            if lowest == _NONE:
                break
            k = pairs.index(lowest)
            del bounds[k + 1]
            del pairs[k]
            if k < len(pairs):
                pairs[k] = rank(piece[bounds[k] : bounds[k + 2]])
            if k > 0:
                pairs[k - 1] = rank(piece[bounds[k - 1] : bounds[k + 1]])
        return len(bounds) - 1


_LOCK = threading.Lock()
_COUNTERS: dict[str, PlainCounter | None] = {}


def plain_counter(encoding: str) -> PlainCounter | None:
    """The counter of `encoding` from its tokens kept in the cache folder (read once per
    process), or None: another encoding, or no tokens to trust."""
    if encoding != ENCODING:
        return None
    with _LOCK:
        if encoding not in _COUNTERS:
            table = tokenizer_cache.read_kept(FILE_NAME, EXPECTED_DIGEST, digest)
            _COUNTERS[encoding] = PlainCounter(table) if table is not None else None
        return _COUNTERS[encoding]


def keep_tokens(encoding: str, pattern: str, ranks: dict[bytes, int]) -> None:
    """After `encoding` was built from `ranks` with `pattern`: keep its plain tokens for the
    next process, unless something is kept already, or the pattern is not the one transcribed
    (never raises)."""
    if encoding == ENCODING and pattern == SOURCE_PATTERN and not tokenizer_cache.is_kept(FILE_NAME):
        tokenizer_cache.keep(FILE_NAME, build(ranks), EXPECTED_DIGEST, digest)
