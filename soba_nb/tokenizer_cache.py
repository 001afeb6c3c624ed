"""The BPE ranks of a tokenizer, kept in the user's cache folder (`$XDG_CACHE_HOME/soba-nb`,
else `~/.cache/soba-nb`) in the form quickest to read.

The first count of a session opened without its counts (a copied transcript, a new kernel on
an old session, `soba-nb budget` of an artifact) waits for its tokenizer, and most of the
wait before tiktoken's own constructor is the packaged file read back: gzip, a sha256 and
200,000 base64 tokens decoded one by one (about 0.13 s for o200k_base). The same tokens, in
rank order as one msgpack array of byte strings, read back in about 5 ms (`<name>.ranks`).
Other files derived from them are kept here too (`soba_nb.plain_counts`: `read_kept`, `keep`).

Each file is derived data and is trusted only when its digest is the one expected (the
encoding of tiktoken's published ranks, checked once): a torn, stale or planted file is not
read but replaced. It is written to a temporary file beside it and renamed; a home folder
that cannot be written (read-only, full, none) only means the slow read every time. Nothing
is sent anywhere and nothing else is kept.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

import msgspec

from soba_nb.layout import user_cache_folder

CACHE_FOLDER: Path | None = None
"""Where the ranks are kept; None: the user's cache folder (`soba_nb.layout.user_cache_folder`)."""

# sha256 of `msgspec.msgpack.encode(tokens in rank order)` for tiktoken's published files.
EXPECTED_SHA256 = {
    "o200k_base": "21be86ee43e53a592c4dc0621c2eca9af6bc4c29df3c9a2161e452e4ecccab5d",
    "cl100k_base": "ed0816e2b705c3b6474af6314071f4fdeebd9b5862af1ff3d3f9136711a8a00c",
}
MAX_CACHE_BYTES = 16 * 1024 * 1024
"""A file larger than this is not read (o200k_base's is 1.8 MB)."""

_DECODER = msgspec.msgpack.Decoder(list[bytes])


def _sha256(blob: bytes) -> str:
    import hashlib  # OpenSSL: 3 ms to import, for the ranks (read before tiktoken's 0.1 s load)

    return hashlib.sha256(blob).hexdigest()


def _debug(message: str, *args: object) -> None:
    import logging  # only when something is wrong: reading a kept file needs neither

    logging.getLogger(__name__).debug(message, *args)


def cache_path(name: str) -> Path:
    return kept_path(f"{name}.ranks")


def kept_path(file_name: str) -> Path:
    """Where the file `file_name` is kept: in `CACHE_FOLDER`, else the user's cache folder."""
    return (CACHE_FOLDER or user_cache_folder()) / file_name


def read_ranks(name: str) -> dict[bytes, int] | None:
    """The ranks kept for `name`, or None when there are none to trust (never raises)."""
    expected = EXPECTED_SHA256.get(name)
    blob = read_kept(cache_path(name).name, expected) if expected is not None else None
    if blob is None:
        return None
    tokens = _DECODER.decode(blob)
    return dict(zip(tokens, range(len(tokens)), strict=True))


def read_kept(file_name: str, expected: str, hash_of: Callable[[bytes], str] = _sha256) -> bytes | None:
    """The bytes of the file `file_name` in the cache folder when their digest (`hash_of`,
    sha256 unless said) is `expected`, else None; a regular file with other bytes (torn,
    stale, planted) is removed, so that the next process to derive it writes it again (never
    raises)."""
    path = kept_path(file_name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, RuntimeError):  # none yet, a link, no home folder
        return None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):  # a folder or a FIFO in its place
            return None
        blob = _read_to_end(fd, min(status.st_size, MAX_CACHE_BYTES) + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(blob) > MAX_CACHE_BYTES or hash_of(blob) != expected:
        _debug("tokenizer cache %s: not the expected file, rebuilt", file_name)
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return blob


def _read_to_end(fd: int, most: int) -> bytes:
    """What `fd` holds from where it is to its end, `most` bytes at most (reading exactly the
    size it is expected to have: a read asking for 16 MB makes a buffer of 16 MB first)."""
    parts = []
    while most > 0 and (part := os.read(fd, most)):
        parts.append(part)
        most -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def is_kept(file_name: str) -> bool:
    """Whether something is at `file_name` in the cache folder (a link is not followed, nor
    replaced: `keep` writes only where nothing is)."""
    try:
        kept_path(file_name).lstat()
    except (OSError, RuntimeError):
        return False
    return True


def keep_ranks(name: str, ranks: dict[bytes, int]) -> None:
    """Keep `ranks` for the next process, when they are tiktoken's published ones (never raises)."""
    expected = EXPECTED_SHA256.get(name)
    tokens = list(ranks)
    if expected is None or list(ranks.values()) != list(range(len(tokens))):
        return
    keep(cache_path(name).name, msgspec.msgpack.encode(tokens), expected)


def keep(file_name: str, blob: bytes, expected: str, hash_of: Callable[[bytes], str] = _sha256) -> None:
    """Write `blob` as `file_name` in the cache folder, through a temporary file and a rename,
    when its digest (`hash_of`, sha256 unless said) is `expected` (never raises)."""
    if hash_of(blob) != expected:
        return
    import tempfile  # only to write: reading a kept file needs none

    target = kept_path(file_name)
    temporary = None
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{file_name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as file:
            file.write(blob)
        os.replace(temporary, target)
        temporary = None
    except (OSError, RuntimeError) as error:
        _debug("tokenizer cache %s: not kept (%s)", file_name, type(error).__name__)
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
