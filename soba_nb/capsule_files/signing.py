"""Signed capsules (SPEC §13): a team key makes a `.capsule.md` authentic, not only whole.

`sha256` in a capsule's front matter is integrity: anyone who edits a file can recompute it.
With a team key in the environment (`SOBA_CAPSULE_KEY`, set for every member by the
spawner or the admin, never written anywhere), every capsule file soba writes carries
`hmac`: HMAC-SHA256 of the same bytes `sha256` covers, in hex. Only a holder of the key can
make it, so a load with the key refuses, in one line,

- a file without `hmac` (written without the key, or stripped of it),
- a file whose `hmac` is not that of its bytes under this key (edited after export, its
  `sha256` recomputed; or signed by another team's key),
- a version-1 file: its hash covers only the body, so nothing in its front matter can be
  vouched for.

`%capsule load PATH --untrusted` still reads any of them, as data: a `degraded` handoff,
nothing verified (`soba_nb.capsule_files.handoff`). Without a key nothing can be
authenticated, and loading says `unsigned`.

The key is a secret like any other: its name holds KEY, so `soba_nb.redact` removes its
value from every file soba writes; a key shorter than redaction can recognise is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping

from soba_nb.redact import MIN_ENV_VALUE_CHARS

CAPSULE_KEY_ENV = "SOBA_CAPSULE_KEY"
HMAC_KEY = "hmac"
"""The front-matter key of the signature."""
MIN_KEY_CHARS = MIN_ENV_VALUE_CHARS
"""Shorter values are not redacted (they would erase ordinary words), so a key this short
could end up in a file; it is refused instead. A team key is 32 random bytes in hex."""
ADVISED_KEY_CHARS = 32
UNSIGNED = "unsigned"
SIGNED = "signed"
UNTRUSTED_HINT = "--untrusted reads it as unverified data"

_HMAC = re.compile(r"[0-9a-f]{64}")


class CapsuleKeyError(ValueError):
    """`SOBA_CAPSULE_KEY` is set but cannot be a key (too short)."""


class SignatureError(ValueError):
    """A file's signature does not hold under the team key: the one-line reason."""


def capsule_key(environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The team key's bytes, or None when `SOBA_CAPSULE_KEY` is unset or empty."""
    value = environ.get(CAPSULE_KEY_ENV, "")
    if not value:
        return None
    if len(value) < MIN_KEY_CHARS:
        raise CapsuleKeyError(
            f"{CAPSULE_KEY_ENV} is {len(value)} characters; a team key is at least {MIN_KEY_CHARS} "
            f"(make one with: python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return value.encode("utf-8", "surrogateescape")


def sign(covered: bytes, key: bytes) -> str:
    """HMAC-SHA256 of the bytes `sha256` covers, in lowercase hex."""
    return hmac.new(key, covered, hashlib.sha256).hexdigest()


def check_signature(covered: bytes, found: object, *, version: int, signed_since: int, key: bytes) -> None:
    """Raise `SignatureError` unless `found` (the file's `hmac`, None when absent) is the
    signature of `covered` under `key`. `signed_since`: the first format version whose hash
    covers the whole front matter."""
    if version < signed_since:
        raise SignatureError(
            f"a version-{version} capsule file: its hash covers only the body, so it cannot be verified "
            f"with {CAPSULE_KEY_ENV}; {UNTRUSTED_HINT}"
        )
    if found is None:
        raise SignatureError(f"not signed (no hmac) and {CAPSULE_KEY_ENV} is set; {UNTRUSTED_HINT}")
    if not isinstance(found, str) or not _HMAC.fullmatch(found):
        raise SignatureError(f"front matter key 'hmac': must be 64 lowercase hex digits; {UNTRUSTED_HINT}")
    if not hmac.compare_digest(sign(covered, key), found):
        raise SignatureError(
            f"hmac mismatch: not signed with this {CAPSULE_KEY_ENV}, or edited after export; {UNTRUSTED_HINT}"
        )
