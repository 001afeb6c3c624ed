"""Fact retention: what survives compaction, per kind of fact, for each method.

    python benchmarks/retention.py                   # 5 sessions, the embedded model on 1 (~1.5 min)
    python benchmarks/retention.py --no-model        # only the methods that need no model
    python benchmarks/retention.py --patient-model   # + the model given 15 min, + free-form
                                                     #   baseline (~15 min per model session)

Long synthetic data-analysis sessions (`retention_plan`, deterministic from the seed) are
written as real transcripts and compacted with the product's own code (`retention_methods`,
`retention_model`); the planted facts are then looked for in what the model would receive
next (`retention_facts`). Prints a Markdown table and, under it, what the target kinds lost
and how each compaction ended. Nothing is downloaded; without the embedded model the rows
that need it are left out, with the reason.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the helpers as `python -m` would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.retention_methods import (
    CLOUD,
    LOCAL,
    Profile,
    compact_along,
    compact_once,
    drop_oldest,
    history_tokens,
    write,
)
from benchmarks.retention_plan import generate_session
from benchmarks.retention_report import Row, notes, table
from benchmarks.retention_sessions import SyntheticSession
from soba_nb.providers.base import Provider

SEED = 20261213
SESSIONS = 5
MODEL_SESSIONS = 1
PATIENT_TIMEOUT_MS = 900_000
"""Long enough for the embedded model to finish a capsule on 2 cores (it takes 5–8 minutes)."""


class Rows:
    """The table's rows, made on first use, in the order they were first asked for."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], Row] = {}

    def __call__(self, method: str, profile: Profile) -> Row:
        key = (method, profile.name)
        if key not in self.rows:
            self.rows[key] = Row(method, profile.name)
        return self.rows[key]


def run_without_model(rows: Rows, session: SyntheticSession, folder: Path, profile: Profile) -> Path:
    """The deterministic capsule (once, and along the way) and drop-oldest; returns the
    written session for the model methods."""
    config = profile.config()
    namespace = session.namespace()
    path = write(session, folder / f"{session.seed}-{profile.layer['model']['provider']}.jsonl", config)
    once = compact_once(path, "deterministic", config, namespace)
    rows("deterministic capsule, one %compact", profile).add(session.facts, once.text, once)
    along_path = path.with_name(f"{path.stem}.along{path.suffix}")
    along = compact_along(session, along_path, config, namespace, history_tokens(path, config))
    rows("deterministic capsule, auto-compacting along the way", profile).add(session.facts, along.text, along)
    dropped = drop_oldest(path, config, once.tokens_after)
    rows("drop oldest (same tokens as the capsule + tail)", profile).add(session.facts, dropped.text, dropped)
    return path


def run_with_model(rows: Rows, session: SyntheticSession, path: Path, provider: Provider, *, patient: bool) -> None:
    """The model capsule at the local profile's deadline (what a user gets); with `patient`,
    also at `PATIENT_TIMEOUT_MS` (scored as committed and as the model wrote it) and the
    free-form baseline."""
    from benchmarks.retention_model import freeform_summary, model_capsule

    namespace = session.namespace()
    for timeout in [LOCAL.config().compaction.timeout_ms, *([PATIENT_TIMEOUT_MS] if patient else [])]:
        run, written = model_capsule(path, LOCAL.config(timeoutMs=timeout), namespace, provider)
        rows(f"model capsule as committed (timeoutMs {timeout:,})", LOCAL).add(session.facts, run.text, run)
        if written is not None:
            rows(f"model capsule as the model wrote it (timeoutMs {timeout:,})", LOCAL).add(
                session.facts, written + "\n\n" + run.tail, run
            )
    if patient:
        summary = freeform_summary(path, LOCAL.config(), provider)
        rows("free-form summary + same kept tail", LOCAL).add(session.facts, summary.text, summary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fact retention after compaction, per kind of fact.")
    parser.add_argument("--sessions", type=int, default=SESSIONS, help=f"sessions (default {SESSIONS})")
    parser.add_argument("--seed", type=int, default=SEED, help="seed of the first session (the others follow)")
    parser.add_argument("--no-model", action="store_true", help="skip the methods that need the embedded model")
    parser.add_argument("--model-sessions", type=int, default=MODEL_SESSIONS,
                        help=f"sessions the embedded model summarizes (default {MODEL_SESSIONS}; minutes each)")
    parser.add_argument("--patient-model", action="store_true",
                        help=f"also give the model {PATIENT_TIMEOUT_MS // 60_000} min per capsule, and run the "
                        "free-form baseline (minutes per session)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the transcripts in this folder")
    args = parser.parse_args(argv)
    problem = None if args.no_model else _model_problem()
    started = time.monotonic()
    rows = Rows()
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.keep or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        provider = None if args.no_model or problem else _start_model()
        for index in range(args.sessions):
            session = generate_session(args.seed + index)
            path = run_without_model(rows, session, folder, LOCAL)
            run_without_model(rows, session, folder, CLOUD)
            if provider is not None and index < args.model_sessions:
                run_with_model(rows, session, path, provider, patient=args.patient_model)
            print(f"session {index + 1}/{args.sessions} (seed {session.seed}) done", file=sys.stderr)
    _print(rows, args, problem, time.monotonic() - started)
    return 0


def _model_problem() -> str | None:
    from benchmarks.retention_model import embedded_model_problem

    return embedded_model_problem()


def _start_model() -> Provider:
    from benchmarks.retention_model import start_embedded_model

    return start_embedded_model()


def _print(rows: Rows, args: argparse.Namespace, problem: str | None, seconds: float) -> None:
    ordered = sorted(rows.rows.values(), key=lambda row: row.profile != LOCAL.name)
    when = datetime.date.today().isoformat()
    print(f"Fact retention after compaction — {when}, {platform.python_implementation()} "
          f"{platform.python_version()}, {os.cpu_count()} cores, seeds {args.seed}–{args.seed + args.sessions - 1}, "
          f"{seconds / 60:.1f} min\n")
    print(table(ordered))
    print()
    if args.no_model:
        print("- embedded-model methods skipped (--no-model)")
    elif problem:
        print(f"- embedded-model methods skipped: {problem}")
    else:
        patient = "" if args.patient_model else "; the patient model and the free-form baseline need --patient-model"
        print(f"- embedded-model methods ran on {min(args.model_sessions, args.sessions)} of {args.sessions} "
              f"sessions (the first){patient}")
    for row in ordered:
        for line in notes(row):
            print(f"- {row.method} [{row.profile}]: {line}")


if __name__ == "__main__":
    raise SystemExit(main())
