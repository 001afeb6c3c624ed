"""The embedded model's tokenizer from its GGUF: byte-level BPE (llama.cpp's "gpt2" vocabulary
type) run by Hugging Face `tokenizers`, giving llama.cpp's ids (`src/llama-vocab.cpp`):
- Special tokens written in the text: control and unknown ones (token types 3, 2) become their
  ids only with `special=True` (a chat prompt), user-defined ones (4) always. The text is cut
  at them, longest first, and each piece is BPE-encoded alone.
- The pre-tokenizer follows `tokenizer.ggml.pre`: llama.cpp's regexes, each splitting the
  pieces further ("smollm": every digit alone, then GPT-2's regex), then GPT-2's byte mapping.
- Decoding joins each token's bytes (special tokens as their text) and reads them as UTF-8,
  without llama.cpp's `clean_spaces` pass, which would break `decode(encode(x)) == x`.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence

from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from soba_nb.engine.gguf_file import GGUFError, GGUFFile

MODEL_KEY = "tokenizer.ggml.model"
PRE_KEY = "tokenizer.ggml.pre"
TOKENS_KEY = "tokenizer.ggml.tokens"
TOKEN_TYPE_KEY = "tokenizer.ggml.token_type"
MERGES_KEY = "tokenizer.ggml.merges"
BOS_KEY = "tokenizer.ggml.bos_token_id"
EOS_KEY = "tokenizer.ggml.eos_token_id"
ADD_BOS_KEY = "tokenizer.ggml.add_bos_token"
BYTE_LEVEL_MODEL = "gpt2"

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # GGUF token types
SPECIAL_TYPES = (UNKNOWN, CONTROL, USER_DEFINED)
# End-of-generation tokens llama.cpp makes control tokens whatever their stored type.
CONTROL_BY_TEXT = frozenset(
    {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>"}
)

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
r"""llama.cpp's GPT-2 regex (its own matcher also takes the trailing `\s+`); `ByteLevel`'s too."""
DEFAULT_PRE = "default"  # llama.cpp's pre-tokenizer when `tokenizer.ggml.pre` is missing
DEFAULT_REGEXES = (r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", "[0-9][0-9][0-9]")
KNOWN_PRE = ("smollm", "gpt-2", DEFAULT_PRE)

CHUNK_CHARS = 32_768  # long texts are encoded in chunks of about this size, in parallel
_SAFE_CUT = re.compile(r"(?<=[!-~]\n)(?=[!-~])")
"""A line break between two visible ASCII characters: every supported pre-tokenizer splits
on both sides of it and looks no further, so encoding either side alone changes nothing."""


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """llama.cpp's regex list for `pre`, each regex splitting the pieces further, then the
    GPT-2 byte mapping. `ByteLevel(use_regex=True)` is the GPT-2 regex plus the mapping."""
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":  # every digit alone (llama.cpp's `\p{N}`), then GPT-2
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    if pre == "gpt-2":
        return gpt2
    splits = [pre_tokenizers.Split(Regex(regex), "isolated") for regex in DEFAULT_REGEXES]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return pre_tokenizers.Sequence([*splits, byte_level])


def _byte_decoder() -> dict[int, int]:
    """GPT-2's byte-level alphabet backwards: code point of a piece's char → the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    decoder = {byte: byte for byte in printable}
    shifted = (byte for byte in range(256) if byte not in decoder)
    decoder.update({256 + index: byte for index, byte in enumerate(shifted)})
    return decoder


_BYTE_TABLE = {code_point: chr(byte) for code_point, byte in _byte_decoder().items()}
_BYTE_ALPHABET = [chr(code_point) for code_point in _BYTE_TABLE]


def _piece_bytes(piece: str, token_type: int) -> bytes:
    """What llama.cpp's `token_to_piece(special=True)` gives for one token."""
    if token_type in SPECIAL_TYPES:
        return piece.encode("utf-8")
    if token_type != NORMAL:
        return b""
    mapped = piece.translate(_BYTE_TABLE)
    try:
        return mapped.encode("latin-1")
    except UnicodeEncodeError:  # a char outside the byte alphabet: keep it as UTF-8
        return b"".join(c.encode("latin-1" if ord(c) < 256 else "utf-8") for c in mapped)


class GGUFTokenizer:
    """Encode and decode text exactly as llama.cpp does for a byte-level BPE GGUF."""

    def __init__(
        self,
        pieces: list[str],
        token_types: list[int],
        merges: list[str],
        pre: str,
        *,
        eos_id: int,
        bos_id: int | None = None,
        add_bos: bool = False,
    ):
        self.vocab_size = len(pieces)
        self.parallel = True
        """Encode long texts on several threads. Off in the notebook kernel: a process that
        forks after tokenizers used its threads (the shell tool does) warns on stderr."""
        self.eos_id = eos_id
        self.bos_id = bos_id
        """The BOS token; llama.cpp puts it before a prompt only when `add_bos`."""
        self.add_bos = add_bos
        self._pieces = [piece or f"[EMPTY_{index}]" for index, piece in enumerate(pieces)]
        types = [
            CONTROL if piece in CONTROL_BY_TEXT else token_type
            for piece, token_type in zip(self._pieces, token_types, strict=True)
        ]
        self._bytes = list(map(_piece_bytes, self._pieces, types))
        specials = [(i, self._pieces[i]) for i, t in enumerate(types) if t in SPECIAL_TYPES]
        specials.sort(key=lambda special: -len(special[1].encode("utf-8")))  # stable: ties by id
        self._specials = specials
        """Tokens cut out of the text with `special=True`, longest first (as llama.cpp)."""
        self._user_defined = [(i, piece) for i, piece in specials if types[i] == USER_DEFINED]
        """The ones cut out with `special=False` too."""
        self._bpe = _build_bpe(self._pieces, merges, pre)

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> GGUFTokenizer:
        model, pre = gguf.get(MODEL_KEY), gguf.get(PRE_KEY) or DEFAULT_PRE
        expected = (
            f"{gguf.path}: this engine reads byte-level BPE ({BYTE_LEVEL_MODEL}) vocabularies;"
        )
        if model != BYTE_LEVEL_MODEL:
            raise GGUFError(f"{expected} {MODEL_KEY} is {model!r}")
        if pre not in KNOWN_PRE:
            known = ", ".join(KNOWN_PRE)
            raise GGUFError(f"{expected} {PRE_KEY} is {pre!r} (known: {known})")
        pieces = _string_list(gguf, TOKENS_KEY, required=True)
        token_types = gguf.get(TOKEN_TYPE_KEY) or [NORMAL] * len(pieces)
        if len(token_types) != len(pieces) or not all(isinstance(t, int) for t in token_types):
            raise GGUFError(f"{gguf.path}: {TOKEN_TYPE_KEY} does not match {TOKENS_KEY}")
        eos_id = _token_id(gguf, EOS_KEY, len(pieces))
        if eos_id is None:
            raise GGUFError(f"{gguf.path}: no {EOS_KEY}: the model could never stop")
        merges = _string_list(gguf, MERGES_KEY, required=False)
        bos_id = _token_id(gguf, BOS_KEY, len(pieces))
        add_bos = bool(gguf.get(ADD_BOS_KEY, False))
        return cls(pieces, token_types, merges, pre, eos_id=eos_id, bos_id=bos_id, add_bos=add_bos)

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of `text` (no BOS). `special`: control tokens written in the text are
        those tokens (a chat prompt); without it they are ordinary text (user text)."""
        ids: list[int] = []
        for fragment in self._split_special(
            text, self._specials if special else self._user_defined
        ):
            if isinstance(fragment, int):
                ids.append(fragment)
            else:
                ids.extend(self._encode_ordinary(fragment))
        return ids

    def count(self, text: str) -> int:
        """Tokens in `text` read as ordinary text (what a user's words cost)."""
        return len(self.encode(text, special=False)) if text else 0

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(map(self.token_bytes, ids)).decode("utf-8", errors="replace")

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self)

    def token_text(self, token_id: int) -> str:
        """The token as stored in the vocabulary (`Ġthe`, `<|im_end|>`), as llama.cpp's
        `token_get_text` gives it."""
        self.token_bytes(token_id)
        return self._pieces[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes the token stands for (possibly part of a UTF-8 character)."""
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(
                f"token id {token_id} is not in the vocabulary (0 to {self.vocab_size - 1})"
            )
        return self._bytes[token_id]

    def _encode_ordinary(self, text: str) -> list[int]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates are no UTF-8: they count as U+FFFD
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        chunks = _chunks(text)
        if len(chunks) == 1 or not self.parallel:
            ids = self._bpe.encode(text, add_special_tokens=False).ids
        else:  # in parallel (Rust threads); a process forked after that warns once on stderr
            encodings = self._bpe.encode_batch_fast(chunks, add_special_tokens=False)
            ids = [token_id for encoding in encodings for token_id in encoding.ids]
        if ids and max(ids) >= self.vocab_size:  # bytes the vocabulary lacks give no token
            ids = [token_id for token_id in ids if token_id < self.vocab_size]
        return ids

    @staticmethod
    def _split_special(text: str, specials: list[tuple[int, str]]) -> list[str | int]:
        """llama.cpp's `tokenizer_st_partition`: each special token in turn, longest first,
        cuts every remaining piece of text at its occurrences."""
        fragments: list[str | int] = [text] if text else []
        for token_id, piece in specials:
            if not any(isinstance(f, str) and piece in f for f in fragments):
                continue
            cut: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or piece not in fragment:
                    cut.append(fragment)
                    continue
                for index, part in enumerate(fragment.split(piece)):
                    cut.extend(([token_id] if index else []) + ([part] if part else []))
            fragments = cut
        return fragments


class StreamDecoder:
    """Decodes a growing token sequence: `feed` returns only the text completed so far
    (a token may end inside a multi-byte character); `flush` ends the stream. The joined
    results equal `decode()` of all the tokens."""

    def __init__(self, tokenizer: GGUFTokenizer):
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text


def _build_bpe(pieces: list[str], merges: list[str], pre: str) -> Tokenizer:
    vocab = {piece: index for index, piece in enumerate(pieces)}  # the last duplicate wins
    pairs: list[tuple[str, str]] = []
    for merge in merges:
        cut = merge.find(" ", 1)  # as llama.cpp: a merge of " " itself stays whole
        left, right = merge[:cut], merge[cut + 1 :]
        if cut > 0 and left in vocab and right in vocab and left + right in vocab:
            pairs.append((left, right))
    # A byte missing from the vocabulary still parts its neighbours in llama.cpp (its symbol
    # stays in the word, then yields no token); a placeholder id past the end does that here.
    absent = [char for char in _BYTE_ALPHABET if char not in vocab]
    vocab.update({char: len(pieces) + index for index, char in enumerate(absent)})
    bpe = Tokenizer(models.BPE(vocab, pairs))
    bpe.pre_tokenizer = _pre_tokenizer(pre)
    return bpe


def _chunks(text: str) -> list[str]:
    chunks, start = [], 0
    while len(text) - start > 2 * CHUNK_CHARS:
        cut = _SAFE_CUT.search(text, start + CHUNK_CHARS)
        if cut is None:
            break
        chunks.append(text[start : cut.start()])
        start = cut.start()
    chunks.append(text[start:])
    return chunks


def _string_list(gguf: GGUFFile, key: str, *, required: bool) -> list[str]:
    values = gguf.get(key)
    if values is None and not required:
        return []
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise GGUFError(f"{gguf.path}: {key} is missing or not a list of strings")
    return values


def _token_id(gguf: GGUFFile, key: str, vocab_size: int) -> int | None:
    value = gguf.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or not 0 <= value < vocab_size:
        raise GGUFError(f"{gguf.path}: {key} is {value!r}, not a token id below {vocab_size}")
    return value
