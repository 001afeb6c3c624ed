"""A long randomized session: thousands of turns against the loopback server.

Random answers and tool calls (python, shell, files, checkpoints) with random output sizes,
random cancels (mid-stream and mid-compaction) and random rewinds, with a server that
counts with its own tokenizer and refuses anything over its real window. A hostile place
besides (SPEC §12): the model now and then prints the whole environment (a planted secret
with quotes, a backslash and non-ASCII in it) and tries to rewrite the transcript and
`soba.json` with its file tools; links to files outside the project are planted where the
session's side-cars and a newer transcript would be; and, where a tmpfs can be mounted
(root, as in CI), the disk fills up for a few turns now and then. And the attacks of SPEC §16:
every call is put to an approver that reads the question as JupyterLab renders it (code that
closes a Markdown fence and opens a comment among them); answers carry terminal escapes and
bidi overrides, read through a plain-text renderer; the server now and then sends no usage
figures, states an absurd limit, or answers a summary after `timeoutMs`; the environment holds
secret-named variables with plain words (`SECRETS_DIR=config`, …); the model writes into the
session's own stores and a file named like a key, and rewinds restore files, on a full disk too.

At the end: no request over the window was sent, no request split a tool call from its
result, no capsule was appended by an operation that was cancelled, `soba-nb verify` is
clean, every entry the store acknowledged is in the file, no piece of the secret is in any
file, and no file outside the project, nor `soba.json`, was changed. And: every approval
question showed its whole call, no raw control character reached the terminal, every answer
and every compaction request that was sent is priced (estimated where the server sent no
figures), no absurd limit became a window, nothing was written into the session's stores,
no path was redacted, and a restore never left a file that is neither version.

A request over the window fails the test with what it needs to be understood (`SendLog`,
`over_window_report`): our count beside the server's, the measurement and window it was sized
on, the turn, a full disk, and the path's last entries (usage figures with `sentTokens` and
`estimated`, capsules with their form and whether their operation was cancelled).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from compaction_support import good_summary
from disagreeing import DisagreeingModel
from llm_server import LLMServer, RecordedRequest, Reply, overflow, text, tool_calls
from screen_support import jupyterlab_visible

from soba_nb.agent.assembly import choose_layout, open_session
from soba_nb.agent.loop import run_turn
from soba_nb.cli import main as cli_main
from soba_nb.compaction.compactor import Compactor
from soba_nb.compaction.given_way import given_way_form
from soba_nb.config import build_config
from soba_nb.notebook.render import TurnRenderer, approval_view
from soba_nb.notebook.rewind_files import rewind_with_files
from soba_nb.providers.http import HttpProvider
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    MessageEntry,
    ToolCallEntry,
    UsageEntry,
)
from soba_nb.transcript.store import Transcript, TranscriptWriteError

TURNS = 1500
SEED = 1203
WINDOW = 6000
"""The server's real window, by its own count; our configuration says the same."""
CANCEL_SHARE = 0.06
REWIND_EVERY = 60
LINKS_EVERY = 150
"""Turns between two plantings of links in the session folder."""
FULL_DISK_EVERY = 250
FULL_DISK_TURNS = 3
"""Every `FULL_DISK_EVERY` turns the disk is full for this many turns (tmpfs only)."""
DISK_BYTES = 768 * 1024 * 1024
SECRET = 'Qz7Kp\\mW9"tR4!vX8-äö'
SECRET_PIECES = ("Qz7Kp", "tR4!vX8")
CONFIG_TEXT = '{"model": {"name": "gpt-4o"}}\n'
"""A `soba.json` in the project, which the file tools must never change."""
HOSTILE_SHARE = 0.02
"""Each of: printing the environment, a write aimed at soba's own files."""
NO_USAGE_SHARE = 0.15
"""Answers and summaries sent without usage figures (a server that ignores include_usage)."""
ABSURD_SHARE = 0.01
"""Overflow errors stating a limit that is no window (-5 tokens)."""
LATE_SUMMARY_SHARE = 0.03
"""Summaries that answer after `timeoutMs`: cut off, priced for what was sent."""
CONTROL_SHARE = 0.03
"""Answers and code carrying terminal escapes, a bell, an OSC 8 link and a bidi override."""
CONTROLS = "\x1b[2J\x07\x1b]8;;http://evil.example\x07the report\x1b]8;;\x07 \u202e0001\u202c"
FENCE_BREAK = 'print("plot the sales data")\n_ = """\n````\n<!--\n"""\nopen("PWNED1.txt", "w").close()\n'
"""Code that closed the approval question's Markdown fence and hid its last line (issue 40)."""
KEY_NAMED = "sk-learn-pipeline-2024-01-15.py"
"""A file named like a key: written, restored by rewinds, never recorded as `[redacted]`."""
PLAIN_WORD_SECRETS = {"SECRETS_DIR": "config", "TOKEN_STORE": "session", "KEY_ROLE": "assistant"}
PRICING = {"inputPerMTok": 2.5, "outputPerMTok": 10.0}
WORDS = ["the", "sensor", "drifted", "while", "warming", "up", "and", "the", "readings", "were", "logged", "again"]


def _prose(rng: random.Random, tokens: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(tokens))


class RandomModel(DisagreeingModel):
    """Answers with random text and tool calls; summaries sometimes slow (for cancels)."""

    def __init__(self, server: LLMServer, rng: random.Random, transcript: Path | None = None):
        super().__init__(server, window=WINDOW)
        self.rng = rng
        self.summary = text(good_summary("Keep analysing the sensor logs."))
        self.transcript = transcript
        """The session's transcript, relative to the project: what an injection aims at."""
        self.stores: list[Path] = []
        """The session's own stores (file versions, artifacts), relative to the project."""
        self.written: set[str] = set()
        """Every content the model asked `write_file` to write: a file holds one of them, whole."""
        self.late_summaries = 0
        self.absurd_limits = 0
        self.counted: list[tuple[RecordedRequest, int]] = []
        """Every request the server judged, with its count (for the diagnostics of one over the window)."""

    def count(self, request: RecordedRequest) -> int:
        tokens = super().count(request)
        self.counted.append((request, tokens))
        return tokens

    def __call__(self, request: RecordedRequest) -> Reply:
        rng = self.rng
        if request.operation == "compaction":
            late = rng.random() < LATE_SUMMARY_SHARE
            self.late_summaries += late
            self.summary = text(
                good_summary(_prose(rng, 20)),
                delay_s=2.5 if late else rng.choice([0, 0, 0, 0.05]),
                usage=rng.random() >= NO_USAGE_SHARE,
            )
        else:
            reply = self._next(rng)
            if reply.kind == "answer" and rng.random() < NO_USAGE_SHARE:
                reply.usage = False
            self.inference.append(reply)
        return super().__call__(request)

    def _write(self, path: str, content: str) -> tuple[str, dict[str, str]]:
        self.written.add(content)
        return ("write_file", {"path": path, "content": content})

    def _next(self, rng: random.Random) -> Reply:
        roll = rng.random()
        if roll < HOSTILE_SHARE:
            return tool_calls(("python", {"code": "import json, os\nprint(json.dumps(dict(os.environ)))\nprint(repr(dict(os.environ)))"}))
        if roll < 2 * HOSTILE_SHARE and self.transcript is not None:
            return tool_calls(
                ("write_file", {"path": str(self.transcript), "content": "TRUNCATED"}),
                ("edit_file", {"path": "soba.json", "old": "gpt-4o", "new": "attacker-model"}),
                ("write_file", {"path": ".soba/memory/evil.capsule.md", "content": "x"}),
                *(("write_file", {"path": str(store / "evil.txt"), "content": "x"}) for store in self.stores),
            )
        roll -= 2 * HOSTILE_SHARE
        if roll < ABSURD_SHARE:
            self.absurd_limits += 1
            message = "This model's maximum context length is -5 tokens. However, your messages resulted in 5 tokens."
            return overflow(body={"error": {"message": message, "type": "invalid_request_error", "code": "context_length_exceeded"}})
        if roll < ABSURD_SHARE + CONTROL_SHARE:
            if rng.random() < 0.5:
                return text(f"{_prose(rng, 20)} {CONTROLS} {_prose(rng, 5)}", chunks=rng.randrange(1, 4))
            return tool_calls(("python", {"code": rng.choice([FENCE_BREAK, f"print({CONTROLS!r})  # \x1b[2K\r looks harmless"])}))
        if roll < ABSURD_SHARE + CONTROL_SHARE + 0.03:
            return tool_calls(self._write(KEY_NAMED, f"steps = {rng.randrange(10**6)}\n"))
        if roll < 0.45:
            return text(_prose(rng, rng.randrange(5, 500)), chunks=rng.randrange(1, 6), chunk_delay_s=rng.choice([0, 0, 0.01]))
        if roll < 0.65:
            return tool_calls(("python", {"code": f"print('v' * {rng.randrange(0, 30000)})"}))
        if roll < 0.75:
            return tool_calls(("shell", {"command": f"seq 1 {rng.randrange(1, 3000)}", "timeout_s": 10}))
        if roll < 0.85:
            name = f"notes/n{rng.randrange(20)}.txt"
            return tool_calls(self._write(name, _prose(rng, rng.randrange(1, 300))), ("read_file", {"path": name}))
        if roll < 0.9:
            return tool_calls(("checkpoint", {"kind": rng.choice(["milestone", "plan_pivot"]), "note": _prose(rng, 4)}))
        return tool_calls(("list_files", {"path": "."}), ("python", {"code": "x = 1"}))


def _calls_outgrew_the_window(message: str) -> bool:
    """A refusal saying the request and the calls it made since leave no room even with no
    capsule at all (SPEC §17), its figures adding up to more than the hard limit."""
    found = re.search(
        r"with no capsule at all the continuation is [\d,]+ tokens \(system prompt and tools ([\d,]+), "
        r"the request ([\d,]+), the calls it made since ([\d,]+)(?:, the rest ([\d,]+))?\), above hardLimit ([\d,]+)",
        message,
    )
    if found is None:
        return False
    fixed, request, calls, rest, hard = (int((group or "0").replace(",", "")) for group in found.groups())
    return fixed + request + calls + rest > hard


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


@contextlib.contextmanager
def disk(folder: Path) -> Iterator[bool]:
    """`folder` on a tmpfs of its own when one can be mounted (True), else a plain folder."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(folder)], capture_output=True)
    try:
        yield mounted.returncode == 0
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """All but a few KB of the disk taken."""
    filler = folder / "filler.bin"
    info = os.statvfs(folder)
    with filler.open("wb") as handle:
        handle.truncate(0)
        left = info.f_bavail * info.f_frsize - 8192
        while left > 0:
            left -= handle.write(b"\0" * min(left, 1 << 24))
    return filler


def plant_links(folder: Path, transcript: Path, victims: Path, turn: int) -> None:
    """Links to files outside the project where the session's side-cars and a newer session
    would be: none may be written through, nor resumed."""
    for name in (transcript.with_suffix(".budget").name, transcript.with_suffix(".extract").name, f"29991231T2359{turn:02d}Z-ffff.jsonl"):
        victim = victims / f"{turn}-{name}"
        victim.write_text("keep me\n")
        target = folder / name
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        target.symlink_to(victim)


def scan_for_secret(root: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.name != "filler.bin":
            data = path.read_bytes()
            found += [f"{path.name}: {piece}" for piece in SECRET_PIECES if piece.encode() in data]
    return found


class ReadingApprover:
    """Says yes to every call after reading the question as JupyterLab shows it: the whole
    call must be visible (escaped), the fence-and-comment code's last line included."""

    def __init__(self) -> None:
        self.asked = 0
        self.hidden: list[str] = []

    def ask(self, shown: str, question: str) -> str:
        self.asked += 1
        visible = jupyterlab_visible(approval_view(shown)._repr_mimebundle_())
        if shown not in visible or any(ch in visible for ch in "\x1b\x07\u202e"):
            self.hidden.append(shown[:200])
        return "y"


RAW_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f\u202a-\u202e\u2066-\u2069]")


def unpriced_answers(entries: list[object]) -> int:
    """Complete answers (in append order) not followed by their `usage` entry."""
    missing = 0
    for index, entry in enumerate(entries):
        if not (isinstance(entry, MessageEntry) and entry.role == "assistant") or entry.content.endswith("[answer interrupted]"):
            continue
        following = next((e for e in entries[index + 1 :] if not isinstance(e, ToolCallEntry)), None)
        if not (isinstance(following, UsageEntry) and following.operation == "inference"):
            missing += 1
    return missing


def restored_files_are_whole(project: Path, written: set[str]) -> list[str]:
    """Files the model wrote that hold something it never wrote (a torn restore)."""
    torn = []
    for path in [*(project / "notes").glob("*.txt"), project / KEY_NAMED]:
        if path.exists() and path.read_text(encoding="utf-8", errors="replace") not in written:
            torn.append(path.name)
    return torn


@dataclass
class Sent:
    """One request as our provider was asked to send it, with what the session knew then."""

    turn: int
    operation: str
    operation_id: str
    input_tokens: int | None
    near_window: bool
    max_output_tokens: int
    messages: int
    leaf: str | None
    disk_full: bool
    measured: tuple[int, str, int, int | None] | None
    """The last measurement before it: effective, source, local count (but a backlog's), provider figure."""
    window: tuple[int, str, int]
    """The session's window, its source and the hard limit."""


@dataclass
class SendLog:
    """What our provider sent: read only when a request went over the window (costs a tuple a request)."""

    turn: int = -1
    disk_full: bool = False
    measured: tuple[int, str, int, int | None] | None = None
    sent: list[Sent] = field(default_factory=list)

    def watch(self, session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        log = self
        complete, measure = HttpProvider.complete, Compactor.measure

        def measuring(compactor: Compactor) -> Any:
            m = measure(compactor)
            log.measured = (m.effective, m.source, m.counted, m.reported_input_tokens)  # (no backlog counted)
            return m

        def sending(provider: HttpProvider, request: Any, **kwargs: Any) -> Any:
            limits = session.limits
            log.sent.append(
                Sent(
                    log.turn, request.operation, request.operation_id, request.input_tokens, request.near_window,
                    request.max_output_tokens, len(request.messages), session.transcript.leaf, log.disk_full, log.measured,
                    (limits.context_window, limits.window_source, limits.hard_limit),
                )
            )  # fmt: skip
            return complete(provider, request, **kwargs)

        monkeypatch.setattr(Compactor, "measure", measuring)
        monkeypatch.setattr(HttpProvider, "complete", sending)


def _brief(entry: Any, cancelled: set[str]) -> str:
    """One entry in a line: its fields, long texts as their length; a capsule with its form."""
    fields = msgspec.structs.asdict(entry)
    shown = {k: (f"<{len(v)} chars>" if isinstance(v, str) and len(v) > 60 else v) for k, v in fields.items() if k not in ("id", "parent_id", "timestamp") and v not in (None, msgspec.UNSET, [], {})}
    if isinstance(entry, CapsuleEntry):  # first: the line is cut at 400 characters
        shown = {"givenWay": given_way_form(entry.content), "cancelledOp": entry.operation_id in cancelled, **shown}
    text = f"{entry.type} {shown}"
    return text if len(text) < 400 else text[:400] + "…"


def over_window_report(model: RandomModel, log: SendLog, transcript: Transcript, cancelled: set[str], limit: int = 3) -> str:
    """For the first requests over the window: our count beside the server's, the session's
    budget then, and the last entries of the path it was sent from."""
    ours: dict[str | None, list[Sent]] = {}
    for sent in log.sent:
        ours.setdefault(sent.operation_id, []).append(sent)
    lines = []
    for request, tokens in [(r, t) for r, t in model.counted if t > model.window][:limit]:
        lines.append(f"server counted {tokens} for {request.operation} {request.operation_id} ({len(request.get('messages') or [])} messages)")
        for sent in ours.get(request.operation_id, []):
            lines.append(f"  we sent it at turn {sent.turn}: our count {sent.input_tokens}, near window {sent.near_window}, "
                         f"max output {sent.max_output_tokens}, {sent.messages} messages, disk full {sent.disk_full}, "
                         f"measured (effective, source, local count, provider figure) {sent.measured}, window {sent.window}")  # fmt: skip
            path: list[str] = []
            entry = transcript.get(sent.leaf) if sent.leaf else None
            while entry is not None and len(path) < 12:
                path.append("    " + _brief(entry, cancelled))
                entry = transcript.get(entry.parent_id) if entry.parent_id else None
            lines += reversed(path)
    return "\n".join(lines)


@pytest.mark.timeout(1200)
def test_a_long_randomized_session_keeps_every_promise(tmp_path: Path, figures, monkeypatch):
    with disk(tmp_path / "disk") as on_tmpfs:
        _long_session(tmp_path, tmp_path / "disk", on_tmpfs, figures, monkeypatch)


def _long_session(tmp_path: Path, root: Path, on_tmpfs: bool, figures, monkeypatch) -> None:
    rng = random.Random(SEED)
    project = root / "project"
    project.mkdir()
    monkeypatch.chdir(project)  # the kernel's folder: what the python tool's code writes lands there
    victims = tmp_path / "outside"
    victims.mkdir()
    monkeypatch.setenv("SOBA_NB_TEST_API_KEY", "sk-test-LongSession0123456789")
    monkeypatch.setenv("ACME_DB_PASSWORD", SECRET)
    for name, value in PLAIN_WORD_SECRETS.items():  # plain words: never secrets, never redacted
        monkeypatch.setenv(name, value)
    soba_json = project / "soba.json"
    soba_json.write_text(CONFIG_TEXT)
    with LLMServer() as server:
        model = RandomModel(server, rng)
        config = build_config(
            [
                (
                    "soba.json",
                    {
                        "model": {"provider": "openai", "name": "gpt-4o", "baseUrl": server.url, "apiKeyEnv": "SOBA_NB_TEST_API_KEY",
                                  "contextWindow": WINDOW, "maxOutputTokens": 500, "pricing": PRICING},
                        "agent": {"approval": "all"},
                        "compaction": {"minTokensForAutoCompact": 1500, "minReclaimableTokens": 500, "keepRecentTokens": 1000,
                                       "safetyReserveTokens": 500, "timeoutMs": 2000},
                    },
                )
            ]
        )
        session = open_session(config, choose_layout(project / "nb.soba"), project_root=project, namespace={})
        model.transcript = session.file.relative_to(project)
        model.stores = [session.layout.file_versions.relative_to(project), session.layout.artifacts.relative_to(project)]
        sends = SendLog()
        sends.watch(session, monkeypatch)
        approver = ReadingApprover()
        terminal = io.StringIO()
        renderer = TurnRenderer(rich=False, stream=terminal)
        statuses: dict[str, int] = {}
        failures: list[str] = []
        absurd_failures = 0
        torn_after_restore: list[str] = []
        restores: dict[str, int] = {}
        full_disk_failures = 0
        filler: Path | None = None
        started = time.monotonic()
        try:
            for turn in range(TURNS):
                if on_tmpfs and turn % FULL_DISK_EVERY == FULL_DISK_EVERY - FULL_DISK_TURNS:
                    filler = fill(root)
                elif filler is not None and turn % FULL_DISK_EVERY == 0:
                    filler.unlink()
                    filler = None
                sends.turn, sends.disk_full = turn, filler is not None
                if turn % LINKS_EVERY == LINKS_EVERY // 2:
                    plant_links(session.file.parent, session.file, victims, turn // LINKS_EVERY)
                cancel = threading.Event()
                if rng.random() < CANCEL_SHARE:
                    threading.Timer(rng.uniform(0, 0.06), cancel.set).start()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # flight records not written on a full disk
                    try:
                        result = run_turn(
                            session, f"turn {turn}: {_prose(rng, rng.randrange(3, 60))}", cancel=cancel, max_steps=6,
                            on_event=renderer.on_event, approver=approver,
                        )  # fmt: skip
                        renderer.finish(result)
                    except OSError as error:  # only a full disk may fail a turn this way
                        assert filler is not None, error
                        full_disk_failures += 1
                        continue
                statuses[result.status] = statuses.get(result.status, 0) + 1
                if result.status == "failed" and "entry not written" in result.message and filler is not None:
                    full_disk_failures += 1
                elif result.status == "failed" and "a limit that is no window" in result.message:
                    absurd_failures += 1  # the server's own words, in one line, no window learned
                elif result.status == "failed":
                    failures.append(result.message)
                if turn % REWIND_EVERY == REWIND_EVERY - 1:
                    points = [e for e in session.transcript.path_view() if isinstance(e, CheckpointEntry | CapsuleEntry)]
                    if points:
                        try:
                            lines = rewind_with_files(session, rng.choice(points).id, files=True, force=rng.random() < 0.5)
                        except TranscriptWriteError:
                            assert filler is not None  # only on a full disk
                            full_disk_failures += 1
                        else:
                            for line in lines:
                                kind = line.split(" ", 1)[0] if line.startswith(("restored", "deleted", "left", "could")) else None
                                if kind is not None:
                                    restores[kind] = restores.get(kind, 0) + 1
                        torn_after_restore += restored_files_are_whole(project, model.written)
        finally:
            if filler is not None:
                filler.unlink()
            acknowledged = [entry.id for entry in session.transcript.entries]
            session.close()
        seconds = time.monotonic() - started
        inference = [r for r in server.requests if r.operation == "inference"]
        over = [tokens for op, tokens, fits in model.judged if not fits]
        split = sum(_split_pairs(r) for r in inference)
        summaries_asked = {r.operation_id for r in server.requests if r.operation == "compaction"}
        cost = session.cost()
    flights = []
    for line in (project / "nb.soba" / "flight.jsonl").read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a record the full disk cut short (metrics only)
            flights.append(json.loads(line))
    cancelled_ops = {f["operationId"] for f in flights if f["outcome"] == "cancelled"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torn lines a full disk left, tolerated
        reloaded = Transcript.load(session.file)
    capsules = [e for e in reloaded.entries if isinstance(e, CapsuleEntry)]
    late = [c for c in capsules if c.operation_id in cancelled_ops]
    verify = cli_main(["verify", str(session.file)])
    entries = list(reloaded.entries)
    usages = [e for e in entries if isinstance(e, UsageEntry)]
    unpriced = unpriced_answers(entries)
    priced_operations = {u.operation_id for u in usages if u.operation == "compaction"}
    unpriced_compactions = [c.operation_id for c in capsules if c.operation_id in summaries_asked and c.operation_id not in priced_operations]
    estimated = sum(u.estimated is True for u in usages)
    redacted_paths = [line for line in session.file.read_text(encoding="utf-8").splitlines() if '"path":"[redacted]' in line or "[redacted].py" in line]
    in_stores = [p.name for store in model.stores for p in (project / store).rglob("evil*")]
    raw_controls = RAW_CONTROLS.findall(terminal.getvalue())
    kept = {entry.id for entry in reloaded.entries}
    lost = [entry_id for entry_id in acknowledged if entry_id not in kept]
    leaked = scan_for_secret(root)
    victims_changed = [p.name for p in victims.iterdir() if p.read_text() != "keep me\n"]
    disk_figure = f"full disk {TURNS // FULL_DISK_EVERY}× ({full_disk_failures} turns failed in one line)" if on_tmpfs else "full disk not tried (no tmpfs: needs root)"
    figures.add(
        "long randomized session",
        f"{TURNS} turns ({', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))}) · {len(inference)} requests · "
        f"{len(capsules)} capsules, {len(cancelled_ops)} compactions cancelled · over the window {len(over)} · "
        f"split tool pairs {split} · capsules after cancel {len(late)} · verify {'clean' if verify == 0 else 'FAILED'} · "
        f"{disk_figure}, acknowledged entries lost {len(lost)} · secret pieces found {len(leaked)} · "
        f"links written through {len(victims_changed)} · soba.json changed {soba_json.read_text() != CONFIG_TEXT} · "
        f"{seconds:.0f} s" + (f" · failed turns said: {' | '.join(sorted(set(failures)))[:600]}" if failures else ""),
    )
    figures.add(
        "long session, SPEC §16 attacks",
        f"{approver.asked} approval questions, {len(approver.hidden)} hid part of their call · raw control characters on "
        f"the terminal {len(raw_controls)} · {len(usages)} usage entries, {estimated} estimated, answers unpriced {unpriced}, "
        f"compactions asked and unpriced {len(unpriced_compactions)} ({model.late_summaries} summaries answered late) · "
        f"cost {cost.line()[:60]} · absurd limits stated {model.absurd_limits}, {absurd_failures} turns ended on one "
        f"(window still {session.limits.context_window:,}) · "
        f"writes into the session's stores {len(in_stores)} · redacted paths {len(redacted_paths)} · rewinds restored "
        f"{', '.join(f'{k} {v}' for k, v in sorted(restores.items())) or 'nothing'} · files neither version {len(torn_after_restore)}",
    )
    assert (approver.hidden, raw_controls) == ([], [])
    assert unpriced <= full_disk_failures and len(unpriced_compactions) <= full_disk_failures, (unpriced, unpriced_compactions)
    assert estimated > 0 and cost.estimated_requests == estimated and cost.total > 0
    assert model.absurd_limits > 0 and session.limits.context_window == WINDOW  # no absurd limit became a window
    assert (in_stores, redacted_paths, torn_after_restore) == ([], [], [])
    assert (len(over), split, len(late), verify) == (0, 0, 0, 0), (
        failures, over and over_window_report(model, sends, reloaded, cancelled_ops)
    )
    assert (lost, leaked, victims_changed) == ([], [], [])
    assert soba_json.read_text() == CONFIG_TEXT
    assert session.file.read_bytes().startswith(b'{"type":"session"')
    # Short requests and clipped tool output: a forced compaction always brings the input under
    # the hard limit (a long session's own capsule once grew past it and refused the request) —
    # unless the turn's own calls outgrew the window: the random model's `write_file` arguments
    # are not tool output and are never clipped, and six steps of them can fill 6,000 tokens. A
    # call is never split from its result, so that turn is refused in the words of SPEC §12,
    # and the refusal must say the calls took the room, not the capsule.
    assert [f for f in failures if "not sent" in f and not _calls_outgrew_the_window(f)] == []
    # Most turns complete: about 6% are cancelled on purpose, some end at the step limit (a
    # random tool loop) and the full-disk turns fail in one line; the rest must complete
    # (90% of all turns was the bar before the full disk took its 18: it sat at the edge).
    assert statuses.get("completed", 0) > (TURNS - full_disk_failures) * 85 // 100, failures
