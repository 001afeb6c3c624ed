"""A long randomized session: thousands of turns against the loopback server.

Random answers and tool calls (python, shell, files, checkpoints) with random output sizes,
random cancels (mid-stream and mid-compaction) and random rewinds, with a server that
counts with its own tokenizer and refuses anything over its real window. At the end: no
request over the window was sent, no request split a tool call from its result, no capsule
was appended by an operation that was cancelled, and `soba-nb verify` is clean.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest
from compaction_support import good_summary
from disagreeing import DisagreeingModel
from llm_server import LLMServer, RecordedRequest, Reply, text, tool_calls

from soba_nb.agent.loop import run_turn
from soba_nb.agent.session import AgentSession
from soba_nb.cli import main as cli_main
from soba_nb.config import build_config
from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry
from soba_nb.transcript.store import Transcript

TURNS = 1500
SEED = 1203
WINDOW = 6000
"""The server's real window, by its own count; our configuration says the same."""
CANCEL_SHARE = 0.06
REWIND_EVERY = 60
WORDS = ["the", "sensor", "drifted", "while", "warming", "up", "and", "the", "readings", "were", "logged", "again"]


def _prose(rng: random.Random, tokens: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(tokens))


class RandomModel(DisagreeingModel):
    """Answers with random text and tool calls; summaries sometimes slow (for cancels)."""

    def __init__(self, server: LLMServer, rng: random.Random):
        super().__init__(server, window=WINDOW)
        self.rng = rng
        self.summary = text(good_summary("Keep analysing the sensor logs."))

    def __call__(self, request: RecordedRequest) -> Reply:
        rng = self.rng
        if request.operation == "compaction":
            self.summary = text(good_summary(_prose(rng, 20)), delay_s=rng.choice([0, 0, 0, 0.05]))
        else:
            self.inference.append(self._next(rng))
        return super().__call__(request)

    def _next(self, rng: random.Random) -> Reply:
        roll = rng.random()
        if roll < 0.45:
            return text(_prose(rng, rng.randrange(5, 500)), chunks=rng.randrange(1, 6), chunk_delay_s=rng.choice([0, 0, 0.01]))
        if roll < 0.65:
            return tool_calls(("python", {"code": f"print('v' * {rng.randrange(0, 30000)})"}))
        if roll < 0.75:
            return tool_calls(("shell", {"command": f"seq 1 {rng.randrange(1, 3000)}", "timeout_s": 10}))
        if roll < 0.85:
            name = f"notes/n{rng.randrange(20)}.txt"
            return tool_calls(("write_file", {"path": name, "content": _prose(rng, rng.randrange(1, 300))}), ("read_file", {"path": name}))
        if roll < 0.9:
            return tool_calls(("checkpoint", {"kind": rng.choice(["milestone", "plan_pivot"]), "note": _prose(rng, 4)}))
        return tool_calls(("list_files", {"path": "."}), ("python", {"code": "x = 1"}))


def _split_pairs(request: RecordedRequest) -> int:
    """Tool results without their call before them, and calls without results, in one request."""
    problems = 0
    open_calls: set[str] = set()
    for message in request.body.get("messages", []):
        if message["role"] == "tool":
            if message.get("tool_call_id") not in open_calls:
                problems += 1
            open_calls.discard(message.get("tool_call_id"))
            continue
        problems += len(open_calls)
        open_calls = {call["id"] for call in message.get("tool_calls") or []}
    return problems + len(open_calls)


@pytest.mark.timeout(1200)
def test_a_long_randomized_session_keeps_every_promise(tmp_path: Path, figures, monkeypatch):
    rng = random.Random(SEED)
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.setenv("SOBA_NB_TEST_API_KEY", "sk-test-LongSession0123456789")
    with LLMServer() as server:
        model = RandomModel(server, rng)
        config = build_config(
            [
                (
                    "soba.json",
                    {
                        "model": {"provider": "openai", "name": "gpt-4o", "baseUrl": server.url, "apiKeyEnv": "SOBA_NB_TEST_API_KEY",
                                  "contextWindow": WINDOW, "maxOutputTokens": 500},
                        "compaction": {"minTokensForAutoCompact": 1500, "minReclaimableTokens": 500, "keepRecentTokens": 1000,
                                       "safetyReserveTokens": 500, "timeoutMs": 2000},
                    },
                )
            ]
        )
        session = AgentSession(config, sessions_dir=project / "nb.soba", project_root=project, namespace={})
        statuses: dict[str, int] = {}
        failures: list[str] = []
        started = time.monotonic()
        try:
            for turn in range(TURNS):
                cancel = threading.Event()
                if rng.random() < CANCEL_SHARE:
                    threading.Timer(rng.uniform(0, 0.06), cancel.set).start()
                result = run_turn(session, f"turn {turn}: {_prose(rng, rng.randrange(3, 60))}", cancel=cancel, max_steps=6)
                statuses[result.status] = statuses.get(result.status, 0) + 1
                if result.status == "failed":
                    failures.append(result.message)
                if turn % REWIND_EVERY == REWIND_EVERY - 1:
                    points = [e for e in session.transcript.path_view() if isinstance(e, CheckpointEntry | CapsuleEntry)]
                    if points:
                        session.rewind(rng.choice(points).id)
        finally:
            session.close()
        seconds = time.monotonic() - started
        inference = [r for r in server.requests if r.operation == "inference"]
        over = [tokens for op, tokens, fits in model.judged if not fits]
        split = sum(_split_pairs(r) for r in inference)
    flights = [json.loads(line) for line in (project / "nb.soba" / "flight.jsonl").read_text().splitlines()]
    cancelled_ops = {f["operationId"] for f in flights if f["outcome"] == "cancelled"}
    capsules = [e for e in Transcript.load(session.file).entries if isinstance(e, CapsuleEntry)]
    late = [c for c in capsules if c.operation_id in cancelled_ops]
    verify = cli_main(["verify", str(session.file)])
    figures.add(
        "long randomized session",
        f"{TURNS} turns ({', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))}) · {len(inference)} requests · "
        f"{len(capsules)} capsules, {len(cancelled_ops)} compactions cancelled · over the window {len(over)} · "
        f"split tool pairs {split} · capsules after cancel {len(late)} · verify {'clean' if verify == 0 else 'FAILED'} · "
        f"{seconds:.0f} s" + (f" · failed turns said: {' | '.join(sorted(set(failures)))[:600]}" if failures else ""),
    )
    assert (len(over), split, len(late), verify) == (0, 0, 0, 0), failures
    # Short requests and clipped tool output: a forced compaction always brings the input under
    # the hard limit (a long session's own capsule once grew past it and refused the request).
    assert [f for f in failures if "not sent" in f] == []
    assert statuses.get("completed", 0) > TURNS * 9 // 10, failures
