"""The budget monitor and the streaming renderer: figures, barrier line, throttling (SPEC §9)."""

from __future__ import annotations

import time
from itertools import pairwise

from compaction_support import good_summary
from conftest import new_shell, shut_down
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.agent.events import TextDelta
from soba_nb.agent.loop import TurnResult
from soba_nb.compaction.barrier import CompactionEvent, CompactionResult, Outcome
from soba_nb.notebook.monitor import (
    LIVE_LINE,
    MAX_UPDATES_PER_S,
    BudgetMonitor,
    BudgetSnapshot,
    Throttle,
    snapshot_of,
)
from soba_nb.notebook.render import TurnRenderer

CHUNKS = 5000
CHUNK_INTERVAL_S = 0.001
"""5,000 chunks a millisecond apart: five seconds of (fake) clock time."""
PROGRESS_EVENT_INTERVAL_S = 0.05
BARRIER_S = 6.0
MAX_REFRESH_GAP_S = 0.5
LONG_ANSWER = "The data has many columns worth describing. " * 45
TURNS_TO_COMPACT = 6
"""Enough turns that a capsule really makes the input smaller (see test_notebook_magics)."""


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingDisplay:
    """Stands in for `IPython.display.display`: records each show/update with the clock time."""

    def __init__(self, clock: FakeClock):
        self.clock = clock
        self.shown: list[tuple[float, int, str]] = []

    def __call__(self, obj, display_id: bool = False):
        handle = _Handle(self, len({h for _, h, _ in self.shown}))
        handle.update(obj)
        return handle


class _Handle:
    def __init__(self, display: RecordingDisplay, number: int):
        self.display = display
        self.number = number

    def update(self, obj) -> None:
        self.display.shown.append((self.display.clock(), self.number, repr(obj)))


def max_in_any_second(times: list[float]) -> int:
    """The most updates falling in any half-open one-second window."""
    return max((sum(1 for u in times if t <= u < t + 1) for t in times), default=0)


def degraded_result() -> CompactionResult:
    return CompactionResult("op_1", "user", Outcome.COMPLETED, "fallback: timeout", 4000, 1500, "ck_0123abcd", "degraded", 900)


def turns_to_compact(ip, scripted, *, quiet: bool = True) -> None:
    """Enough long turns, with auto-compaction off, that `%compact` has something to do."""
    ip.run_line_magic("auto_compact", "off")
    for index in range(TURNS_TO_COMPACT):
        scripted.script(text(f"Answer {index}. {LONG_ANSWER}"))
        if quiet:
            with capture_output():
                ip.run_line_magic("soba", f"question {index}")
        else:
            ip.run_line_magic("soba", f"question {index}")


# -- throttling ----------------------------------------------------------------------------


def test_throttle_allows_one_update_per_interval():
    clock = FakeClock()
    throttle = Throttle(MAX_UPDATES_PER_S, clock)
    assert throttle.ready()
    clock.advance(0.05)
    assert not throttle.ready()
    clock.advance(0.05)
    assert throttle.ready()


def test_a_5000_chunk_stream_makes_at_most_10_updates_a_second():
    clock = FakeClock()
    display = RecordingDisplay(clock)
    renderer = TurnRenderer(rich=True, display=display, clock=clock)
    pieces = [f"w{i} " for i in range(CHUNKS)]
    for piece in pieces:
        clock.advance(CHUNK_INTERVAL_S)
        renderer.on_event(TextDelta(piece))
    renderer.finish(TurnResult("completed", answer="".join(pieces)))

    times = [t for t, _, _ in display.shown]
    streamed = times[:-1]  # the last one is the closing render of the whole answer
    assert max_in_any_second(streamed) <= MAX_UPDATES_PER_S
    duration = CHUNKS * CHUNK_INTERVAL_S
    assert len(streamed) >= (MAX_UPDATES_PER_S - 1) * duration  # still live while it streams
    assert display.shown[-1][2] == "".join(pieces)  # ends with the whole answer
    assert {number for _, number, _ in display.shown} == {0}  # one output, updated in place


def test_the_barrier_line_refreshes_every_half_second_and_at_most_10_times_a_second():
    clock = FakeClock()
    monitor = BudgetMonitor(clock=clock)
    changes: list[tuple[float, str]] = []
    monitor.barrier.observe(lambda change: changes.append((clock(), change["new"])), names="value")

    monitor.on_event(CompactionEvent("compaction_start", "op_1", "user"))
    steps = int(BARRIER_S / PROGRESS_EVENT_INTERVAL_S)
    for step in range(1, steps + 1):
        clock.advance(PROGRESS_EVENT_INTERVAL_S)
        monitor.on_event(CompactionEvent("compaction_progress", "op_1", "user", percent=step * 89 // steps))
    clock.advance(PROGRESS_EVENT_INTERVAL_S)
    monitor.on_event(CompactionEvent("compaction_end", "op_1", "user", 100, degraded_result()))

    live = [t for t, value in changes[:-1]]
    assert all("Compacting context before response · " in value for _, value in changes[:-1])
    gaps = [later - earlier for earlier, later in pairwise(live)]
    assert max(gaps) <= MAX_REFRESH_GAP_S
    assert max_in_any_second(live) <= MAX_UPDATES_PER_S
    assert "fallback" in changes[-1][1] and "4,000 → 1,500 tokens" in changes[-1][1]
    assert "Compacting" not in monitor.text()


# -- figures ---------------------------------------------------------------------------------


def test_snapshot_text_bar_and_levels():
    snapshot = BudgetSnapshot(effective=40000, hard_limit=48808, soft_limit=39046, source="estimated", auto=False)
    assert snapshot.level == "soft"
    assert snapshot.lines()[0] == (
        "Budget: 40,000 / 48,808 tokens (82% of hardLimit) · softLimit 39,046 · source estimated · auto off"
    )
    assert "Last compaction: none on this path" in snapshot.text()
    monitor = BudgetMonitor()
    monitor.refresh(snapshot)
    assert f"width:{snapshot.percent:.1f}%" in monitor.bar.value
    assert f"left:{snapshot.soft_percent:.1f}%" in monitor.bar.value  # the soft threshold marker
    bundle = monitor._repr_mimebundle_()
    assert bundle["text/plain"] == monitor.text() == repr(monitor) == snapshot.text()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert BudgetSnapshot(48809, 48808, 39046, "estimated", True).level == "hard"


def test_widget_state_after_a_degraded_barrier(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.display_mode = 'rich'")
    turns_to_compact(ip, scripted)
    scripted.summary = text("I'm sorry, I cannot summarize this conversation.")
    with capture_output() as cap:
        ip.run_line_magic("compact", "")

    magics = ip.magics_manager.registry["SobaMagics"]
    agent, monitor = magics.agent, magics.monitor
    result = agent.compactor.last_result
    assert result.outcome is Outcome.COMPLETED and result.quality == "degraded"
    assert monitor.snapshot == snapshot_of(agent)
    assert monitor.snapshot.effective == agent.compactor.measure().effective
    assert f"width:{monitor.snapshot.percent:.1f}%" in monitor.bar.value
    assert result.line() in monitor.barrier.value.replace("&gt;", ">")
    assert "fallback" in monitor.barrier.value
    assert result.checkpoint_id in monitor.snapshot.last_compaction
    assert "fallback" in monitor.snapshot.last_compaction
    assert "quality degraded" in monitor.text()
    cell_lines = [o.data["text/plain"] for o in cap.outputs]
    assert cell_lines[0] == LIVE_LINE.format(percent=0) and cell_lines[-1] == result.line()


def test_a_real_barrier_refreshes_the_line_at_least_every_half_second(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.display_mode = 'rich'")
    turns_to_compact(ip, scripted)
    scripted.summary = text(good_summary(), chunks=30, chunk_delay_s=0.05)
    magics = ip.magics_manager.registry["SobaMagics"]
    changes: list[float] = []
    magics.monitor.barrier.observe(lambda change: changes.append(time.monotonic()), names="value")
    with capture_output():
        ip.run_line_magic("compact", "")

    assert magics.agent.compactor.last_result.quality == "full"
    assert changes[-1] - changes[0] >= 1.0  # the summary really took a while
    gaps = [later - earlier for earlier, later in pairwise(changes)]
    assert max(gaps) <= MAX_REFRESH_GAP_S
    assert max_in_any_second(changes) <= MAX_UPDATES_PER_S + 1  # + the collapse to the result


def test_the_last_compaction_survives_a_restart(ip, nb_dir, scripted, capsys):
    turns_to_compact(ip, scripted, quiet=False)
    ip.run_line_magic("compact", "")
    capsys.readouterr()
    ip.run_line_magic("budget", "")
    before = capsys.readouterr().out

    shut_down(ip)
    shell = new_shell(nb_dir)
    shell.run_line_magic("auto_compact", "off")
    capsys.readouterr()
    shell.run_line_magic("budget", "")
    after = capsys.readouterr().out
    assert after == before and "Last compaction: Compacted (user)" in after


class RecordingComm:
    """Stands in for an ipykernel comm whose frontend has the sidebar's target."""

    def __init__(self, target_name: str, data: dict):
        self.target_name = target_name
        self.sent = [data]
        self._closed = False

    def send(self, data: dict) -> None:
        self.sent.append(data)

    def on_close(self, callback) -> None:
        pass

    def on_msg(self, callback) -> None:
        pass


def test_the_monitor_feeds_the_jupyterlab_sidebar(ip, scripted, monkeypatch):
    import comm

    from soba_nb.notebook import comm as sidebar

    opened: list[RecordingComm] = []
    widget_comm = comm.create_comm

    def create_comm(*args, **kwargs):
        if kwargs.get("target_name") != sidebar.TARGET_NAME:
            return widget_comm(*args, **kwargs)  # the ipywidgets' own comms
        opened.append(RecordingComm(kwargs["target_name"], kwargs["data"]))
        return opened[-1]

    monkeypatch.setattr(comm, "create_comm", create_comm)
    monkeypatch.setattr(sidebar, "_comms", {})
    monkeypatch.setattr(ip, "kernel", object(), raising=False)  # as in ipykernel
    ip.run_line_magic("config", "SobaMagics.display_mode = 'rich'")
    turns_to_compact(ip, scripted)
    scripted.summary = text("Error: upstream model unavailable")
    with capture_output():
        ip.run_line_magic("compact", "")

    [channel] = opened
    assert channel.target_name == sidebar.TARGET_NAME
    kinds = [message["type"] for message in channel.sent]
    assert {"snapshot", "progress", "result"} <= set(kinds)
    result = [m for m in channel.sent if m["type"] == "result"][-1]
    assert result["degraded"] is True and "fallback" in result["line"]
    snapshot = channel.sent[-1]
    agent = ip.magics_manager.registry["SobaMagics"].agent
    assert snapshot["type"] == "snapshot" and snapshot["effective"] == agent.compactor.measure().effective
    assert snapshot["degraded"] is True and snapshot["session"] == agent.session_id
