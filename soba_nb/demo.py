"""`soba-nb demo`: the quick-start session, offline, on the embedded model.

It writes two small CSV files, runs real turns through the same agent loop a notebook uses
— the files' contents travel in the prompts, as `{name}` substitution does in a notebook —
shows the budget, compacts (trigger `user`: the turns about the first file become a
capsule, the recent ones stay whole), exports the capsule, and says where everything is
and how to export it again from the command line. The session records its settings, so
`soba-nb budget` on its transcript shows the same figures. The embedded model
(SmolLM2-135M) is tiny: its answers are weak and its capsule summaries usually fail
validation, so the deterministic capsule (`fallback`) is what you will mostly see. That is
the fallback path working as designed; point soba-nb at a real model for real work.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from soba_nb.agent.assembly import choose_layout, open_session
from soba_nb.agent.events import AgentEvent, Notice, TextDelta, ToolFinished
from soba_nb.agent.loop import run_turn
from soba_nb.capsule_files.export import export_capsule
from soba_nb.compaction.outcomes import CompactionEvent, Outcome
from soba_nb.config import load_config
from soba_nb.layout import sessions_folder_for

DEMO_PROMPTS = (
    "Here is sales.csv:\n```\n{sales}```\nWhich region appears most often? Answer in one sentence.",
    "Which product sold the most units in that file? Answer in one sentence.",
    "Here is returns.csv:\n```\n{returns}```\nWhich product was returned most often? One sentence.",
    "What is the most common return reason? One sentence.",
    "Summarize what we found in one sentence.",
)
DEMO_OVERRIDES: dict[str, Any] = {"model": {"provider": "local", "maxOutputTokens": 160}}
"""Short answers keep the demo quick; the session records its settings, so `soba-nb budget`
on its transcript shows the very figures the demo prints."""
NOTEBOOK_NAME = "quickstart.ipynb"
REGIONS = ("North", "South", "East", "West")
PRODUCTS = ("Widget", "Gadget", "Gizmo", "Doohickey")
SALES_ROWS = 60
RETURNS_ROWS = 90
DATA_SEED = 2024
LOADING_LINE = (
    "loading the embedded model in its own process (seconds on a quiet machine, "
    "a few minutes on a busy one) …\n"
)
FALLBACK_NOTE = (
    "           (fallback: the model's summary was not used — the tiny model's summaries rarely pass "
    "soba's checks — so the capsule was built from the transcript itself; a real model writes it)\n"
)


SOURCES = {
    "provider_usage": "provider_usage: the server's own count of the last request, plus what came after it",
    "estimated": "estimated: soba's own count (no server count yet)",
}
"""What the figure's source means, said once under it."""


def write_data(folder: Path) -> dict[str, str]:
    """`sales.csv` and `returns.csv` in `folder` (the same every run); their texts by name."""
    rng = random.Random(DATA_SEED)
    sales = ["date,region,product,units,price"] + [
        f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d},{rng.choice(REGIONS)},"
        f"{rng.choice(PRODUCTS)},{rng.randrange(1, 40)},{rng.uniform(3, 60):.2f}"
        for _ in range(SALES_ROWS)
    ]
    returns = ["date,region,product,reason"] + [
        f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d},{rng.choice(REGIONS)},{rng.choice(PRODUCTS)},"
        f"{rng.choice(('damaged', 'late', 'wrong size', 'not needed'))}"
        for _ in range(RETURNS_ROWS)
    ]
    texts = {"sales": "\n".join(sales) + "\n", "returns": "\n".join(returns) + "\n"}
    for name, text in texts.items():
        (folder / f"{name}.csv").write_text(text, encoding="utf-8")
    return texts


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


def _load_model(session: Any, out: Callable[[str], None]) -> None:
    """Start the embedded model before the first turn, saying so (issue 44 item 5: the demo
    was silent for minutes while it loaded). A model that does not start raises the
    provider's error, which `soba-nb demo` shows in one line."""
    engine = getattr(session.provider, "engine", None)
    if engine is None:  # not the embedded model (a configuration that names another)
        return
    out(LOADING_LINE)
    started = time.monotonic()
    engine.url(on_progress=lambda status: out(f"  {status}\n"))
    out(f"model ready in {time.monotonic() - started:.0f} s\n")


def run_demo(folder: Path | None = None, *, write: Callable[[str], None] | None = None) -> int:
    """Run the demo in `folder` (a new temporary folder by default). Returns an exit code."""
    out = write or _stdout
    folder = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="soba-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    notebook = folder / NOTEBOOK_NAME
    data = write_data(folder)
    config = load_config(folder, DEMO_OVERRIDES)
    session = open_session(
        config,
        choose_layout(sessions_folder_for(notebook), new=True),
        project_root=folder,
        namespace={},
        notebook=str(notebook),
    )
    try:
        out(f"soba-nb demo · model {config.model.provider}/{config.model.name} (embedded, offline)\n")
        out(f"folder {folder}\n")
        out("files  sales.csv, returns.csv (their contents go into the prompts below)\n")
        _load_model(session, out)
        # The demo compacts once, on purpose, at the end (soft triggers would do it earlier).
        session.set_auto(False)
        out("%auto_compact off   (the demo compacts once, by hand, at the end)\n")
        for template in DEMO_PROMPTS:
            out(f"\n%soba {template.split(chr(10))[0]}{' …' if chr(10) in template else ''}\n")
            result = run_turn(session, template.format(**data), on_event=_printer(out))
            out("\n")
            if result.status != "completed":
                out(f"turn {result.status}: {result.message}\n")
                return 1
        measurement = session.compactor.measure()
        thresholds = session.compactor.thresholds
        out(
            f"\nbudget · effective {measurement.effective:,} tokens ({measurement.source}) · "
            f"hardLimit {thresholds.hard_limit:,} · softLimit {thresholds.soft_limit:,} · "
            f"auto {'on' if thresholds.auto else 'off'}\n"
            f"         ({SOURCES.get(measurement.source, measurement.source)})\n"
            f"         (the demo reserves {session.limits.max_output_tokens:,} tokens for each answer to keep them "
            "short, so its hardLimit is larger than your notebooks'; soba-nb doctor shows theirs)\n"
        )
        out("\n%compact\n")
        compaction = session.compactor.compact()
        out(f"{compaction.line()}\n")
        if compaction.continuation == "fallback":
            out(FALLBACK_NOTE)
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
            out(
                f"           again from the command line: soba-nb capsule export {session.file} "
                f"{compaction.checkpoint_id} {folder / 'again.capsule.md'}\n"
            )
        else:
            out("capsule    none exported: the compaction did not complete (see the line above)\n")
        out(f"flight     {session.layout.flight}   (each compaction's figures, never message text)\n")
        return 0
    finally:
        session.close()
