"""Synthetic but realistic soba-nb sessions for the benchmarks.

A session is a sequence of agent turns: a user request, an assistant message that calls
tools (`python`, `read_file`, `shell`), their results (several KB each, like a dataframe
repr, a source file or a test log), a final assistant answer and a provider `usage` entry.
Every few turns the agent records a checkpoint; now and then a capsule compacts the path.

Files are written in the exact line format of `Transcript.append` (type first, compact
camelCase JSON, one line per entry); `write_session(..., exact=True)` goes through the real
store instead, which is slower (one `os.write` per line) and gives the same bytes shape.

    python benchmarks/generate.py 10000 /tmp/session.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path

from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    Entry,
    MessageEntry,
    SessionEntry,
    ToolCallEntry,
    ToolResultEntry,
    UsageEntry,
    new_checkpoint_id,
    new_entry_id,
)
from soba_nb.transcript.store import Transcript

SIZES = (1_000, 10_000, 100_000)
SEED = 20261202
MODEL = "openai/gpt-4o-mini"
TURNS_PER_CHECKPOINT = 6
TURNS_PER_CAPSULE = 40

WORDS = (
    "dataframe", "column", "revenue", "region", "churn", "cohort", "pivot", "merge",
    "groupby", "index", "null", "outlier", "plot", "histogram", "median", "quantile",
    "feature", "model", "train", "test", "split", "accuracy", "pipeline", "csv", "parquet",
    "schema", "dtype", "timestamp", "resample", "rolling", "window", "join", "filter",
)  # fmt: skip
REQUESTS = (
    "Load {file} and show me the {a} by {b}.",
    "Why does the {a} look wrong for {b}? Check the {file} loader.",
    "Add a test for the {a} cleaning step and run it.",
    "Plot the {a} against {b} and save it to {file}.",
    "Refactor the {a} function in {file} so it handles missing {b}.",
)
FILES = ("data/sales.csv", "src/clean.py", "src/features.py", "tests/test_clean.py", "report.md")


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def _dataframe_repr(rng: random.Random, rows: int) -> str:
    header = "      region   revenue    churn   cohort   score"
    lines = [header]
    for row in range(rows):
        lines.append(
            f"{row:>5}  {rng.choice(['north', 'south', 'east', 'west']):>6}  "
            f"{rng.uniform(0, 1e6):>9.2f}  {rng.random():.4f}  2024-{rng.randint(1, 12):02d}  "
            f"{rng.gauss(0, 1):+.3f}"
        )
    lines.append(f"\n[{rows * 40} rows x 5 columns]")
    return "\n".join(lines)


def _source_file(rng: random.Random, functions: int) -> str:
    parts = ["import pandas as pd\nimport numpy as np\n"]
    for index in range(functions):
        name = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}_{index}"
        parts.append(
            f"\ndef {name}(df: pd.DataFrame) -> pd.DataFrame:\n"
            f'    """{_words(rng, 12).capitalize()}."""\n'
            f"    df = df.dropna(subset=[{rng.choice(WORDS)!r}])\n"
            f"    df[{rng.choice(WORDS)!r}] = df[{rng.choice(WORDS)!r}].rolling({rng.randint(2, 30)}).mean()\n"
            f"    return df.groupby({rng.choice(WORDS)!r}).agg('{rng.choice(['sum', 'mean', 'max'])}')\n"
        )
    return "".join(parts)


def _test_log(rng: random.Random, tests: int) -> str:
    lines = ["============================= test session starts =============================="]
    for index in range(tests):
        outcome = "PASSED" if rng.random() > 0.1 else "FAILED"
        lines.append(f"tests/test_clean.py::test_{rng.choice(WORDS)}_{index} {outcome}")
    lines.append(
        f"========================= {tests} tests in {rng.uniform(0.5, 9):.2f}s ========================="
    )
    return "\n".join(lines)


def _tool_group(rng: random.Random) -> tuple[ToolCallEntry, ToolResultEntry]:
    call_id = f"call_{rng.getrandbits(48):012x}"
    kind = rng.choice(("python", "read_file", "shell"))
    if kind == "python":
        arguments = {"code": f"df = pd.read_csv({rng.choice(FILES)!r})\ndf.describe()"}
        content = _dataframe_repr(rng, rng.randint(40, 120))
    elif kind == "read_file":
        arguments = {"path": rng.choice(FILES)}
        content = _source_file(rng, rng.randint(8, 25))
    else:
        arguments = {"command": "python -m pytest -q", "timeout_s": 120}
        content = _test_log(rng, rng.randint(40, 120))
    call = ToolCallEntry(call_id=call_id, name=kind, arguments=json.dumps(arguments))
    result = ToolResultEntry(
        call_id=call_id, name=kind, content=content, duration_ms=rng.randint(5, 4000)
    )
    return call, result


def _turn(rng: random.Random, turn: int) -> Iterator[Entry]:
    request = rng.choice(REQUESTS).format(
        a=rng.choice(WORDS), b=rng.choice(WORDS), file=rng.choice(FILES)
    )
    yield MessageEntry(role="user", content=request)
    for _ in range(rng.randint(1, 3)):
        yield MessageEntry(
            role="assistant", content=f"Let me check. {_words(rng, rng.randint(5, 30))}."
        )
        for _ in range(rng.randint(1, 2)):
            yield from _tool_group(rng)
    yield MessageEntry(
        role="assistant", content=_words(rng, rng.randint(40, 200)).capitalize() + "."
    )
    yield UsageEntry(
        input_tokens=1000 + turn * 150 % 90000,
        output_tokens=rng.randint(50, 800),
        provider="openai",
        model=MODEL,
    )
    if turn % TURNS_PER_CHECKPOINT == TURNS_PER_CHECKPOINT - 1:
        yield CheckpointEntry(
            kind=rng.choice(("turn", "milestone")), note=f"turn {turn}: {_words(rng, 6)}"
        )


def session_entries(count: int, seed: int = SEED) -> Iterator[Entry]:
    """`count` entries of one session (header first), deterministic for a seed."""
    rng = random.Random(seed)
    header = SessionEntry(notebook="analysis.ipynb", model=MODEL)
    yield header
    # 8-hex ids collide about once per 100k entries; the store re-draws them, so do we.
    seen = {header.id}
    produced = 1
    turn = 0
    recent_ids: list[str] = []
    previous_capsule: str | None = None
    while True:
        for entry in _turn(rng, turn):
            if produced == count:
                return
            while entry.id in seen:
                entry = entry.model_copy(update={"id": new_entry_id()})
            seen.add(entry.id)
            recent_ids.append(entry.id)
            yield entry
            produced += 1
        turn += 1
        if turn % TURNS_PER_CAPSULE == 0 and produced < count and len(recent_ids) > 20:
            capsule = CapsuleEntry(
                operation_id=f"op_{rng.getrandbits(32):08x}",
                checkpoint_id=new_checkpoint_id(),
                trigger=rng.choice(("auto_threshold", "turn_complete", "milestone")),
                quality=rng.choice(("full", "full", "degraded")),
                tokens_before=rng.randint(90000, 110000),
                tokens_after=rng.randint(20000, 30000),
                first_kept_entry_id=recent_ids[-20],
                rolls_up=previous_capsule,
                model=MODEL,
                provider="openai",
                content="\n\n".join(
                    f"## {heading}\n{_words(rng, 40)}"
                    for heading in (
                        "Goal and constraints",
                        "Work done",
                        "Decisions",
                        "Files read",
                        "Kernel state",
                    )
                ),
            )
            seen.add(capsule.id)
            previous_capsule = capsule.id
            recent_ids = []
            yield capsule
            produced += 1


def _line(entry: Entry, parent_id: str | None) -> str:
    """The exact line `Transcript.append` writes for an entry hung from `parent_id`."""
    dumped = entry.model_dump(by_alias=True, mode="json")
    dumped["parentId"] = parent_id
    data = {"type": dumped.pop("type"), **dumped}
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"


def write_session(path: Path, count: int, *, seed: int = SEED, exact: bool = False) -> Path:
    """Write a session of `count` entries to `path` (replacing it) and return the path."""
    path = Path(path)
    path.unlink(missing_ok=True)
    if exact:
        with Transcript.open(path) as store:
            for entry in session_entries(count, seed):
                store.append(entry)
        return path
    parent: str | None = None
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for entry in session_entries(count, seed):
            handle.write(_line(entry, parent))
            parent = entry.id
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int, help="entries in the session")
    parser.add_argument("out", type=Path, help="the .jsonl file to write")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--exact", action="store_true", help="append through the real store")
    args = parser.parse_args(argv)
    path = write_session(args.out, args.count, seed=args.seed, exact=args.exact)
    print(f"{path}: {args.count} entries, {path.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
