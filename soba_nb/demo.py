"""`soba-nb demo`: the quick-start session, offline, on the embedded model.

It runs real turns through the same agent loop a notebook uses, shows the budget, forces
one compaction (trigger `user`) and exports the capsule, then says where everything is.
The embedded model (SmolLM2-135M) is tiny: its answers are weak and its capsule summaries
usually fail validation, so the deterministic fallback is what you will mostly see. That
is the fallback path working as designed; point soba-nb at a real model for real work.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from soba_nb.agent.events import AgentEvent, Notice, TextDelta, ToolFinished
from soba_nb.agent.loop import run_turn
from soba_nb.agent.session import AgentSession, sessions_dir_for
from soba_nb.capsules.export import export_capsule
from soba_nb.compaction.barrier import CompactionEvent, Outcome
from soba_nb.config import load_config

DEMO_PROMPTS = (
    "In two sentences: what is a pandas DataFrame?",
    "Name three common ways to find outliers in a numeric column.",
    "Which of those would you use on skewed prices, and why? Answer briefly.",
    "How do I read a CSV file into a DataFrame?",
    "Summarize what we discussed in one sentence.",
)
# Small enough that two short turns leave something before the kept window to compact.
DEMO_OVERRIDES: dict[str, Any] = {
    "model": {"provider": "local", "maxOutputTokens": 200},
    "compaction": {"keepRecentTokens": 150, "timeoutMs": 6000},
}
NOTEBOOK_NAME = "quickstart.ipynb"


def _printer(write: Callable[[str], None]) -> Callable[[AgentEvent], None]:
    def on_event(event: AgentEvent) -> None:
        if isinstance(event, TextDelta):
            write(event.text)
        elif isinstance(event, ToolFinished):
            status = "error" if event.is_error else "ok"
            write(f"\n  [{event.name} · {event.summary} · {status} · {event.duration_ms} ms]\n")
        elif isinstance(event, Notice) and event.level != "info":
            write(f"\n  ! {event.text}\n")
        elif isinstance(event, CompactionEvent) and event.kind == "compaction_end" and event.result:
            write(f"\n  {event.result.line()}\n")

    return on_event


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def run_demo(folder: Path | None = None, *, write: Callable[[str], None] | None = None) -> int:
    """Run the demo in `folder` (a new temporary folder by default). Returns an exit code."""
    out = write or _stdout
    folder = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="soba-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    notebook = folder / NOTEBOOK_NAME
    config = load_config(folder, DEMO_OVERRIDES)
    session = AgentSession(
        config,
        sessions_dir=sessions_dir_for(notebook),
        project_root=folder,
        namespace={},
        notebook=str(notebook),
        new=True,
    )
    try:
        out(f"soba-nb demo · model {config.model.provider}/{config.model.name} (embedded, offline)\n")
        out(f"folder {folder}\n")
        for prompt in DEMO_PROMPTS:
            out(f"\n%soba {prompt}\n")
            result = run_turn(session, prompt, on_event=_printer(out))
            out("\n")
            if result.status != "completed":
                out(f"turn {result.status}: {result.message}\n")
                return 1
        measurement = session.compactor.measure()
        out(
            f"\nbudget · effective {measurement.effective:,} tokens ({measurement.source}) · "
            f"hardLimit {config.hard_limit:,} · softLimit {config.soft_limit:,} · "
            f"auto {'on' if config.compaction.auto else 'off'}\n"
        )
        out("\n%compact\n")
        compaction = session.compactor.compact()
        out(f"{compaction.line()}\n")
        out(f"\ntranscript {session.file}\n")
        if compaction.outcome is Outcome.COMPLETED and compaction.checkpoint_id is not None:
            exported = export_capsule(
                session.transcript,
                compaction.checkpoint_id,
                folder / "quickstart.capsule.md",
                project_root=folder,
                title="soba-nb demo",
            )
            out(f"capsule    {exported}\n")
        else:
            out("capsule    none exported: the compaction did not complete (see the line above)\n")
        out(f"flight     {session.sessions_dir / 'flight.jsonl'}\n")
        return 0
    finally:
        session.close()
