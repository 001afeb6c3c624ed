"""Synthetic soba-nb sessions for the benchmarks, written the way soba-nb leaves them.

Two kinds of session, both for the model `openai/gpt-4o`:

- `analysis`: the issue-14 workload, rounds of user request → assistant message → `python`
  tool call → 40-line CSV result → provider usage, about 670 bytes per entry and no capsule
  (optionally one capsule at the very end, made by soba-nb's own `%compact`);
- `periodic`: the older mix (dataframe reprs, source files, test logs, checkpoints) with a
  capsule every 40 turns.

How a session is made, so the benchmark measures the code as it is, whatever its internals:
`AgentSession` starts the file (header and config entries, as a real session does), the bulk
is appended as lines in exactly the shape `Transcript.append` writes (each line is filled from
a template the real store wrote, so a field added to an entry shows up here too), and then
the session is resumed once through `AgentSession` (measure + model input), so whatever a
session keeps beside its transcript (the token index) is there as it would be.

    python benchmarks/generate.py 10000 /tmp/bench-session
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from soba_nb.agent import assembly
from soba_nb.agent.session import AgentSession
from soba_nb.compaction import extract_snapshots
from soba_nb.config import SobaConfig, build_config
from soba_nb.layout import SessionLayout
from soba_nb.transcript.entries import entry_from_dict
from soba_nb.transcript.store import Transcript

SIZES = (1_000, 10_000, 100_000)
LARGE_SIZE = 300_000
SEED = 20261202
PROVIDER = "openai"
MODEL = "gpt-4o"
SESSION_FILE = "session.jsonl"
TURNS_PER_CHECKPOINT = 6
TURNS_PER_CAPSULE = 40
CSV_LINES = 40
"""Lines of every tool result in an `analysis` session (header included)."""
SECONDS_PER_ENTRY = 2

Data = dict[str, Any]


def bench_config() -> SobaConfig:
    """The configuration every benchmark session runs with: gpt-4o, defaults otherwise."""
    return build_config([("benchmark", {"model": {"provider": PROVIDER, "name": MODEL}})])


def open_session(path: Path) -> AgentSession:
    """Open (or resume) the session in `path` exactly as `%soba` does."""
    return assembly.open_session(bench_config(), SessionLayout(path), project_root=path.parent)


# -- content ------------------------------------------------------------------------------------

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
REGIONS = ("north", "south", "east", "west", "central")
CSV_HEADER = "date,region,cohort,segment,revenue,churn,orders,score"


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def _request(rng: random.Random) -> str:
    return rng.choice(REQUESTS).format(a=rng.choice(WORDS), b=rng.choice(WORDS), file=rng.choice(FILES))


def _csv(rng: random.Random) -> str:
    rows = [CSV_HEADER]
    for _ in range(CSV_LINES - 1):
        rows.append(
            f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},{rng.choice(REGIONS)},"
            f"c{rng.randint(1, 60):02d},{rng.choice(WORDS)},{rng.uniform(0, 1e6):.1f},"
            f"{rng.random():.3f},{rng.randint(1, 5000)},{rng.gauss(0, 1):+.3f}"
        )
    return "\n".join(rows)


def _dataframe_repr(rng: random.Random, rows: int) -> str:
    lines = ["      region   revenue    churn   cohort   score"]
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
    lines.append(f"========================= {tests} tests in {rng.uniform(0.5, 9):.2f}s =========================")
    return "\n".join(lines)


def _call_id(rng: random.Random) -> str:
    return f"call_{rng.getrandbits(48):012x}"


def _usage(rng: random.Random, input_tokens: int) -> Data:
    return {
        "type": "usage", "inputTokens": input_tokens, "outputTokens": rng.randint(50, 800),
        "provider": PROVIDER, "model": MODEL,
    }  # fmt: skip


def analysis_rounds(seed: int = SEED) -> Iterator[Data]:
    """Entries (as on-disk dicts, without id/parentId/timestamp) of the issue-14 workload."""
    rng = random.Random(seed)
    context_tokens = 2_000
    turn = 0
    while True:
        call_id = _call_id(rng)
        csv_file = f"data/sales_{turn % 97}.csv"
        code = f"df = pd.read_csv({csv_file!r})\nprint(df.sample({CSV_LINES - 1}).to_csv(index=False))"
        result = _csv(rng)
        entries: list[Data] = [
            {"type": "message", "role": "user", "content": _request(rng)},
            {"type": "message", "role": "assistant", "content": f"Let me check. {_words(rng, rng.randint(5, 30))}."},
            {"type": "tool_call", "callId": call_id, "name": "python", "arguments": json.dumps({"code": code})},
            {"type": "tool_result", "callId": call_id, "name": "python", "content": result, "durationMs": rng.randint(5, 900)},
        ]
        # The provider's figure grows with the conversation like a real one (CSV digits make
        # about 2.5 characters a token).
        context_tokens += sum(len(json.dumps(entry)) for entry in entries) * 2 // 5
        yield from entries
        yield _usage(rng, context_tokens)
        turn += 1


def _tool_group(rng: random.Random) -> list[Data]:
    call_id = _call_id(rng)
    kind = rng.choice(("python", "read_file", "shell"))
    if kind == "python":
        arguments: Data = {"code": f"df = pd.read_csv({rng.choice(FILES)!r})\ndf.describe()"}
        content = _dataframe_repr(rng, rng.randint(40, 120))
    elif kind == "read_file":
        arguments = {"path": rng.choice(FILES)}
        content = _source_file(rng, rng.randint(8, 25))
    else:
        arguments = {"command": "python -m pytest -q", "timeout_s": 120}
        content = _test_log(rng, rng.randint(40, 120))
    return [
        {"type": "tool_call", "callId": call_id, "name": kind, "arguments": json.dumps(arguments)},
        {"type": "tool_result", "callId": call_id, "name": kind, "content": content, "durationMs": rng.randint(5, 4000)},
    ]


def _capsule_content(rng: random.Random) -> str:
    headings = ("Goal and constraints", "Work done", "Decisions", "Files read", "Kernel state")
    return "\n\n".join(f"## {heading}\n{_words(rng, 40)}" for heading in headings)


def periodic_turns(seed: int = SEED) -> Iterator[Data]:
    """Entries of the older mixed workload: checkpoints, and a capsule every 40 turns that
    keeps the last 20 entries (`firstKeptEntryId` is the id the writer gave the entry
    `keep` entries back: `{"keepLast": 20}` is resolved by `LineWriter`)."""
    rng = random.Random(seed)
    turn = 0
    while True:
        yield {"type": "message", "role": "user", "content": _request(rng)}
        for _ in range(rng.randint(1, 3)):
            yield {"type": "message", "role": "assistant", "content": f"Let me check. {_words(rng, rng.randint(5, 30))}."}
            for _ in range(rng.randint(1, 2)):
                yield from _tool_group(rng)
        yield {"type": "message", "role": "assistant", "content": _words(rng, rng.randint(40, 200)).capitalize() + "."}
        yield _usage(rng, 1000 + turn * 150 % 90000)
        if turn % TURNS_PER_CHECKPOINT == TURNS_PER_CHECKPOINT - 1:
            yield {
                "type": "checkpoint", "checkpointId": f"ck_{rng.getrandbits(32):08x}",
                "kind": rng.choice(("turn", "milestone")), "note": f"turn {turn}: {_words(rng, 6)}",
            }  # fmt: skip
        turn += 1
        if turn % TURNS_PER_CAPSULE == 0:
            yield {
                "type": "capsule", "operationId": f"op_{rng.getrandbits(32):08x}",
                "checkpointId": f"ck_{rng.getrandbits(32):08x}",
                "trigger": rng.choice(("auto_threshold", "turn_complete", "milestone")),
                "quality": rng.choice(("full", "full", "degraded")),
                "tokensBefore": rng.randint(90000, 110000), "tokensAfter": rng.randint(20000, 30000),
                "firstKeptEntryId": {"keepLast": 20}, "rollsUp": {"previousCapsule": True},
                "model": MODEL, "provider": PROVIDER, "content": _capsule_content(rng),
            }  # fmt: skip


# -- writing --------------------------------------------------------------------------------------

TEMPLATE_SAMPLES: tuple[Data, ...] = (
    {"type": "message", "role": "user", "content": "x"},
    {"type": "tool_call", "callId": "c", "name": "python", "arguments": "{}"},
    {"type": "tool_result", "callId": "c", "name": "python", "content": "x"},
    {"type": "usage", "inputTokens": 1},
    {"type": "checkpoint", "kind": "turn"},
    {
        "type": "capsule", "operationId": "op", "checkpointId": "ck", "trigger": "user", "quality": "full",
        "tokensBefore": 1, "tokensAfter": 1, "firstKeptEntryId": None, "content": "x",
    },
)  # fmt: skip


def store_templates() -> dict[str, Data]:
    """One line per entry type exactly as `Transcript.append` writes it (all fields, in its
    order), so lines written here keep the store's shape as entries gain fields."""
    with tempfile.TemporaryDirectory(prefix="soba-bench-template-") as folder:
        path = Path(folder) / "template.jsonl"
        with Transcript.open(path) as store:
            for sample in TEMPLATE_SAMPLES:
                store.append(entry_from_dict(sample))
        lines = path.read_bytes().splitlines()
    return {data["type"]: data for data in map(json.loads, lines)}


class LineWriter:
    """Appends entries to a transcript file as the store would, chaining `parentId`."""

    def __init__(self, path: Path, seed: int):
        self.path = path
        self.templates = store_templates()
        self.rng = random.Random(seed ^ 0x5EED)
        lines = path.read_bytes().splitlines()
        self.ids = [json.loads(line)["id"] for line in lines]
        self.seen = set(self.ids)
        self.clock = datetime.now(timezone.utc)
        self.capsule: str | None = None

    def _new_id(self) -> str:
        while True:
            entry_id = f"{self.rng.getrandbits(32):08x}"
            if entry_id not in self.seen:
                self.seen.add(entry_id)
                return entry_id

    def line(self, data: Data) -> bytes:
        template = self.templates[data["type"]]
        self.clock += timedelta(seconds=SECONDS_PER_ENTRY)
        stamp = self.clock.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        values = dict(data)
        if isinstance(values.get("firstKeptEntryId"), dict):
            values["firstKeptEntryId"] = self.ids[-values["firstKeptEntryId"]["keepLast"]]
        if isinstance(values.get("rollsUp"), dict):
            values["rollsUp"] = self.capsule
        fields = {"id": self._new_id(), "parentId": self.ids[-1] if self.ids else None, "timestamp": stamp}
        line = {key: fields.get(key, values.get(key, default)) for key, default in template.items()}
        line.update((key, value) for key, value in values.items() if key not in line)
        self.ids.append(line["id"])
        if line["type"] == "capsule":
            self.capsule = line["id"]
        return (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode()

    def write(self, entries: Iterator[Data], count: int) -> None:
        """Append entries until the file holds `count` of them."""
        with self.path.open("ab") as handle:
            while len(self.ids) < count:
                handle.write(self.line(next(entries)))


def settle(path: Path, *, finish_turn: bool = True) -> None:
    """Resume the session once, as a user would (measure + model input), and close it.

    The preflight's upkeep runs too: the snapshots of the extract's scan a live session would
    have left every `SPACING` entries (here written in one pass, as for any old session). A
    session that grew entry by entry counted every entry and kept its tracker's state: so is
    this one (a path measured from nothing counts only from its last usage figure on).
    `finish_turn`: its last turn ends as `%soba` ends one, with a `turn` checkpoint carrying
    the tracker's state (what a copy of the transcript alone opens from)."""
    session = open_session(path)
    catch_up = extract_snapshots.CATCH_UP_ENTRIES
    try:
        session.compactor.measure()
        session.compactor.tracker.settle()
        # A live session carried the scan forward at every preflight: here in one pass.
        extract_snapshots.CATCH_UP_ENTRIES = sys.maxsize
        session.compactor.keep_extract_snapshots()
        extract_snapshots.CATCH_UP_ENTRIES = catch_up
        session.compactor.model_input()
        session.compactor.measure()  # the state is saved beside the transcript
        if finish_turn:
            session.compactor.record_turn_complete()
    finally:
        extract_snapshots.CATCH_UP_ENTRIES = catch_up
        session.close()


def write_session(
    folder: Path, count: int, *, kind: str = "analysis", seed: int = SEED, settled: bool = True
) -> Path:
    """A session of `count` entries in a new `folder` (its transcript and, when `settled`,
    whatever soba-nb keeps beside it after a resume); returns the transcript's path."""
    folder.mkdir(parents=True, exist_ok=False)
    path = folder / SESSION_FILE
    open_session(path).close()  # header and config entries, as `%soba` writes them
    entries = analysis_rounds(seed) if kind == "analysis" else periodic_turns(seed)
    LineWriter(path, seed).write(entries, count)
    if settled:
        settle(path)
    return path


class CompactionFailed(RuntimeError):
    """`%compact` did not commit a capsule on a generated session."""


def compact_session(source: Path, folder: Path) -> Path:
    """A copy of the session in `source`'s folder, into `folder`, that ends in a capsule made
    by soba-nb's own `%compact` (deterministic capsule: no model), then resumed once."""
    import shutil

    shutil.copytree(source.parent, folder)
    path = folder / source.name
    session = open_session(path)
    try:
        result = session.compactor.compact()
    finally:
        session.close()
    if result.outcome.value != "completed":
        raise CompactionFailed(f"{path}: %compact ended {result.outcome.value}: {result.reason}")
    settle(path, finish_turn=False)  # it ends in the capsule
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int, help="entries in the session")
    parser.add_argument("folder", type=Path, help="a new folder for the session")
    parser.add_argument("--kind", choices=("analysis", "periodic"), default="analysis")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--capsule", action="store_true", help="also write a copy ending in a capsule")
    args = parser.parse_args(argv)
    path = write_session(args.folder, args.count, kind=args.kind, seed=args.seed)
    print(f"{path}: {args.count:,} entries, {path.stat().st_size:,} bytes")
    if args.capsule:
        compacted = compact_session(path, args.folder.with_name(args.folder.name + "-capsule"))
        print(f"{compacted}: ends in a capsule, {compacted.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
