"""Flight records (SPEC §7): one JSON line per compaction operation, metrics only.

Never summary or message text: the fields are a fixed allow-list of figures, ids and fixed
codes (`reason` is a `barrier.Reason` code, never a sentence that could quote a summary or a
provider's error body). Every line still passes through `redact_data` on its way to disk.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from soba_nb.redact import redact_data
from soba_nb.transcript.entries import utc_now

FLIGHT_FILE = "flight.jsonl"


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


class FlightRecorder:
    """Appends flight records to `<notebook-stem>.soba/flight.jsonl`."""

    def __init__(self, path: Path | None):
        self.path = path

    def record(self, record: FlightRecord) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = (record.to_json() + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
