"""Content digests for what soba keeps and keys by content (a kept tokenizer table, the key of
what an empty conversation costs), without importing hashlib.

hashlib loads OpenSSL when imported: about 3 ms, paid by every `soba-nb budget` that only
needed a digest of a few kilobytes. CPython's own BLAKE2 module (`_blake2`, which hashlib
itself re-exports) loads in a tenth of that and hashes 2 MB in about 2.4 ms; on a Python
without it, hashlib's BLAKE2b is the same function.
"""

from __future__ import annotations

try:
    from _blake2 import blake2b
except ImportError:  # not CPython: hashlib's
    from hashlib import blake2b


def digest(data: bytes, size: int = 32) -> str:
    """The BLAKE2b digest of `data`, `size` bytes, in hex."""
    return blake2b(data, digest_size=size).hexdigest()
