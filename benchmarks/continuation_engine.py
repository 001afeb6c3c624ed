"""One compaction path of the continuation benchmark, through soba's real engine: a copy of a
session's transcript, `Compactor.compact()` (a `user` compaction) with `keepRecentTokens` set so
the kept tail starts at a chosen entry, the kernel state of the session's real namespace, and
the model input of the next request (`Compactor.request_for_sending()`).

It uses only what soba_nb had before issue 38 too, so the same code runs today's engine in
process and the revision before issue 38 in a child process (`python continuation_engine.py
--child JOBS.json`, with `PYTHONPATH` at a worktree of that revision): see continuation.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from soba_nb.agent.kernel_state import kernel_state
from soba_nb.agent.prompt import SYSTEM_PROMPT
from soba_nb.agent.provenance import trace
from soba_nb.agent.tools import TOOL_SCHEMAS
from soba_nb.compaction.compactor import Compactor, CompactorSettings
from soba_nb.compaction.limits import soft_limit
from soba_nb.compaction.model_input import ModelInput, capsule_text, entry_tokens
from soba_nb.compaction.triggers import Thresholds
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import CapsuleEntry
from soba_nb.transcript.store import Transcript

PROVIDER, MODEL = "openai", "gpt-4o"
HARD_LIMIT = 128_000
TIMEOUT_MS = 30_000


def counter() -> TokenCounter:
    return TokenCounter.for_model(PROVIDER, MODEL)


def thresholds(keep_recent_tokens: int) -> Thresholds:
    """gpt-4o's window, auto off (the benchmark compacts explicitly, like `%compact`)."""
    return Thresholds(
        hard_limit=HARD_LIMIT, soft_limit=soft_limit(HARD_LIMIT, 1000, 0.8), auto=False,
        compact_on_turn_complete=False, compact_on_milestone=False, min_tokens_for_auto_compact=1000,
        min_reclaimable_tokens=0, min_savings_ratio=0.0, keep_recent_tokens=keep_recent_tokens,
    )  # fmt: skip


def messages_of(built: ModelInput) -> list[dict[str, Any]]:
    """The request's messages as plain data: role, content, the arguments of tool calls."""
    return [
        {"role": m.role, "content": m.content, "calls": [call.arguments for call in m.tool_calls]}
        for m in built.messages
    ]


def compact_path(
    transcript: Path, workdir: Path, *, first_kept_id: str, namespace: dict[str, Any], summarizer: Any | None
) -> dict[str, Any]:
    """Compact a copy of `transcript` keeping the tail from `first_kept_id`; what the next
    request sends and the capsule it carries."""
    workdir.mkdir(parents=True, exist_ok=True)
    copy = workdir / "session.jsonl"
    shutil.copyfile(transcript, copy)
    tokens = counter()
    with Transcript.open(copy) as store:
        path = store.path_view()
        start = next(index for index, entry in enumerate(path) if entry.id == first_kept_id)
        keep = sum(entry_tokens(entry, tokens) for entry in path[start:])
        settings = CompactorSettings(thresholds(keep), timeout_ms=TIMEOUT_MS, max_output_tokens=4096, session_id="bench")
        engine = Compactor(
            store, tokens, settings, system=SYSTEM_PROMPT, tools=TOOL_SCHEMAS, summarizer=summarizer,
            kernel_state=lambda: kernel_state(namespace, trace(store.path_view())),
        )  # fmt: skip
        result = engine.compact()
        built = engine.request_for_sending()
        capsule = next((entry for entry in reversed(store.path_view()) if isinstance(entry, CapsuleEntry)), None)
    text = capsule_text(capsule) if capsule is not None else ""
    return {
        "outcome": result.outcome.value,
        "quality": capsule.quality if capsule is not None else None,
        "kept_from_expected": capsule is not None and capsule.first_kept_entry_id == first_kept_id,
        "capsule": text,
        "capsule_content": capsule.content if capsule is not None else "",
        "capsule_tokens": tokens.count_text(text) if text else 0,
        "system": built.system,
        "messages": messages_of(built),
        "input_tokens": built.tokens,
        "summary_prompts": list(getattr(summarizer, "calls", [])),
    }


def run_jobs(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The child's work: each job's session namespace rebuilt (its code run again), then each
    of its paths compacted."""
    from continuation_sessions import replay  # type: ignore[import-not-found]
    from continuation_summarizer import ObedientSummarizer  # type: ignore[import-not-found]

    out = []
    for job in jobs:
        namespace = replay(job["codes"], Path(job["folder"]))
        for variant in job["variants"]:
            for model in (False, True):
                summarizer = ObedientSummarizer() if model else None
                where = Path(job["workdir"]) / f"{variant['name']}-{'model' if model else 'deterministic'}"
                found = compact_path(
                    Path(job["transcript"]), where, first_kept_id=variant["first_kept_id"], namespace=namespace,
                    summarizer=summarizer,
                )  # fmt: skip
                out.append({"session": job["session"], "variant": variant["name"], "model": model, **found})
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", type=Path, required=True, help="a JSON file of jobs; results go to stdout as JSON")
    args = parser.parse_args(argv)
    jobs = json.loads(args.child.read_text(encoding="utf-8"))
    results = run_jobs(jobs)
    import soba_nb

    json.dump({"soba_nb": soba_nb.__file__, "results": results}, sys.stdout)


if __name__ == "__main__":
    main()
