"""Flight records (SPEC §7): one JSON line per compaction operation, metrics only.

Never summary or message text: the fields are a fixed allow-list of figures, ids and fixed
codes (`reason` is a `barrier.Reason` code, never a sentence that could quote a summary or a
provider's error body). Every line still passes through `redact_data` on its way to disk.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

from soba_nb.redact import redact_data
from soba_nb.transcript.entries import utc_now


@dataclass(frozen=True)
class FlightRecord:
    operation_id: str
    session_id: str
    trigger: str
    hard_limit: int
    soft_limit: int
    tokens_before: int
    tokens_after: int | None
    reclaimed: int | None
    outcome: str
    reason: str
    duration_ms: int
    checkpoint_id: str | None
    quality: str | None
    measurement_source: str
    continuation: str | None = None
    """`native`, `portable` or `fallback` when the provider offered native compaction (never
    the native item itself)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "timestamp": utc_now(),
            "operationId": self.operation_id,
            "sessionId": self.session_id,
            "trigger": self.trigger,
            "hardLimit": self.hard_limit,
            "softLimit": self.soft_limit,
            "tokensBefore": self.tokens_before,
            "tokensAfter": self.tokens_after,
            "reclaimed": self.reclaimed,
            "outcome": self.outcome,
            "reason": self.reason,
            "durationMs": self.duration_ms,
            "checkpointId": self.checkpoint_id,
            "quality": self.quality,
            "measurementSource": self.measurement_source,
            "continuation": self.continuation,
        }

    def to_json(self) -> str:
        return json.dumps(redact_data(self.to_dict()), separators=(",", ":"))


_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class FlightRecordWarning(UserWarning):
    """A flight record could not be written (metrics only: the operation itself stands)."""


class FlightRecorder:
    """Appends flight records to `<notebook-stem>.soba/flight.jsonl`.

    Metrics, not receipts: a record that cannot be written (a full disk, a link or a FIFO
    planted in its place, which is never followed or waited on) is a warning, never a failed
    compaction. A record cut short is terminated before the next one, as the transcript's are.
    """

    def __init__(self, path: Path | None):
        self.path = path

    def record(self, record: FlightRecord) -> None:
        if self.path is None:
            return
        data = (record.to_json() + "\n").encode("utf-8")
        try:
            self._append(self.path, data)
        except OSError as error:
            warnings.warn(f"{self.path}: flight record not written ({error.strerror or error})", FlightRecordWarning, stacklevel=2)

    @staticmethod
    def _append(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, _FLAGS, 0o600)  # the user's own, like the transcripts beside it
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            if info.st_size and os.pread(fd, 1, info.st_size - 1) != b"\n":
                data = b"\n" + data  # the last record was cut short
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
        finally:
            os.close(fd)
