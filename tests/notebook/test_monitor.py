"""The budget figures and the streaming renderer: `%budget` snapshots, barrier line, sidebar
feed, throttling (SPEC §9)."""

from __future__ import annotations

import html
import time
from itertools import pairwise

from compaction_support import good_summary
from conftest import new_shell, shut_down
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.agent.events import TextDelta
from soba_nb.agent.loop import TurnResult
from soba_nb.compaction.outcomes import CompactionEvent, CompactionResult, Outcome
from soba_nb.compaction.triggers import Trigger
from soba_nb.notebook.monitor import (
    MAX_UPDATES_PER_S,
    BudgetSnapshot,
    BudgetView,
    SidebarPublisher,
    Throttle,
    live_line,
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
"""Enough turns that a capsule really makes the input smaller (see tests/notebook/test_magics.py)."""


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


class RecordingSidebar:
    """Stands in for `comm.publish`: records each sidebar message with the clock time."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.sent: list[tuple[float, dict]] = []

    def __call__(self, message: dict) -> bool:
        self.sent.append((self.clock(), message))
        return True

    def of_type(self, kind: str) -> list[dict]:
        return [message for _, message in self.sent if message["type"] == kind]


def recording_sidebar(ip) -> RecordingSidebar:
    """The magics' sidebar feed, recorded (wall clock)."""
    recorder = RecordingSidebar()
    ip.magics_manager.registry["SobaMagics"].sidebar.send = recorder
    return recorder


def rich_texts(outputs) -> list[str]:
    """The `text/plain` of each rich output a capture recorded, checking it is not a repr."""
    texts = [output.data["text/plain"] for output in outputs]
    assert all(not text.startswith("<") for text in texts)
    return texts


def test_the_barrier_line_refreshes_every_half_second_and_at_most_10_times_a_second():
    clock = FakeClock()
    sidebar = RecordingSidebar(clock)
    publisher = SidebarPublisher(clock=clock, send=sidebar)

    publisher.on_event(CompactionEvent("compaction_start", "op_1", "user"))
    steps = int(BARRIER_S / PROGRESS_EVENT_INTERVAL_S)
    for step in range(1, steps + 1):
        clock.advance(PROGRESS_EVENT_INTERVAL_S)
        publisher.on_event(CompactionEvent("compaction_progress", "op_1", "user", percent=step * 89 // steps))
    clock.advance(PROGRESS_EVENT_INTERVAL_S)
    publisher.on_event(CompactionEvent("compaction_end", "op_1", "user", 100, degraded_result()))

    progress = [(t, m) for t, m in sidebar.sent if m["type"] == "progress"]
    assert all(m["line"] == f"Compacting context · {m['percent']}%" for _, m in progress)
    live = [t for t, _ in progress]
    gaps = [later - earlier for earlier, later in pairwise(live)]
    assert max(gaps) <= MAX_REFRESH_GAP_S
    assert max_in_any_second(live) <= MAX_UPDATES_PER_S
    result = sidebar.sent[-1][1]
    assert result == {
        "type": "result",
        "line": degraded_result().line(),
        "outcome": "completed",
        "degraded": True,
    }
    assert "fallback" in result["line"] and "4,000 → 1,500 tokens" in result["line"]


def test_the_live_line_says_before_response_only_when_an_inference_follows():
    assert live_line(Trigger.USER.value, 42) == "Compacting context · 42%"
    for trigger in Trigger:
        if trigger is not Trigger.USER:
            assert live_line(trigger.value, 42) == "Compacting context before response · 42%"

    # The cell and the sidebar show the same line, the one the kernel words.
    clock = FakeClock()
    display, sidebar = RecordingDisplay(clock), RecordingSidebar(clock)
    renderer = TurnRenderer(rich=True, display=display, clock=clock, sidebar=SidebarPublisher(clock, sidebar))
    renderer.on_event(CompactionEvent("compaction_start", "op_2", "auto_threshold"))
    clock.advance(1)
    renderer.on_event(CompactionEvent("compaction_progress", "op_2", "auto_threshold", percent=82))
    cell_lines = [text for _, _, text in display.shown]
    sidebar_lines = [m["line"] for m in sidebar.of_type("progress")]
    assert cell_lines == sidebar_lines == [
        "Compacting context before response · 0%",
        "Compacting context before response · 82%",
    ]


# -- figures ---------------------------------------------------------------------------------


def test_a_budget_view_is_static_html_with_the_same_text():
    snapshot = BudgetSnapshot(effective=40000, hard_limit=48808, soft_limit=39046, source="estimated", auto=False)
    assert snapshot.level == "soft"
    assert snapshot.lines()[0] == (
        "Budget: 40,000 / 48,808 tokens (82% of hardLimit) · softLimit 39,046 · source estimated · auto off"
    )
    assert "Last compaction: none on this path" in snapshot.text()
    view = BudgetView(snapshot)
    bundle = view._repr_mimebundle_()
    assert set(bundle) == {"text/html", "text/plain"}  # no widget: nothing to keep in sync
    assert bundle["text/plain"] == view.text() == repr(view) == snapshot.text()
    page = bundle["text/html"]
    assert f"width:{snapshot.percent:.1f}%" in page
    assert f"left:{snapshot.soft_percent:.1f}%" in page  # the soft threshold marker
    assert all(html.escape(line) in page for line in snapshot.lines())
    assert BudgetSnapshot(48809, 48808, 39046, "estimated", True).level == "hard"


def test_an_earlier_budget_output_keeps_the_figures_of_its_moment(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.display_mode = 'rich'")
    with capture_output() as first:
        ip.run_line_magic("budget", "")
    turns_to_compact(ip, scripted)
    with capture_output():
        ip.run_line_magic("compact", "")
    with capture_output() as last:
        ip.run_line_magic("budget", "")

    [before], [after] = first.outputs, last.outputs
    # Static HTML (no widget model), displayed once without a display id: nothing can
    # update it later.
    assert set(before.data) == {"text/html", "text/plain"}
    assert not before.update and "display_id" not in (before.transient or {})
    assert "Last compaction: none on this path" in before.data["text/plain"]
    assert "Last compaction: Compacted (user)" in after.data["text/plain"]
    agent = ip.magics_manager.registry["SobaMagics"].agent
    assert after.data["text/plain"] == snapshot_of(agent).text()
    assert before.data["text/plain"] != after.data["text/plain"]


def test_budget_after_a_degraded_barrier(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.display_mode = 'rich'")
    turns_to_compact(ip, scripted)
    scripted.summary = text("I'm sorry, I cannot summarize this conversation.")
    with capture_output() as cap:
        ip.run_line_magic("compact", "")
        ip.run_line_magic("budget", "")

    agent = ip.magics_manager.registry["SobaMagics"].agent
    result = agent.compactor.last_result
    assert result.outcome is Outcome.COMPLETED and result.quality == "degraded"
    *cell_lines, budget = rich_texts(cap.outputs)
    assert cell_lines[0] == "Compacting context · 0%" and cell_lines[-1] == result.line()
    assert "fallback" in result.line()
    snapshot = snapshot_of(agent)
    assert budget == snapshot.text()
    assert snapshot.effective == agent.compactor.measure().effective
    assert result.checkpoint_id in snapshot.last_compaction and "fallback" in snapshot.last_compaction
    assert "quality degraded" in budget
    assert f"width:{snapshot.percent:.1f}%" in cap.outputs[-1].data["text/html"]


def test_a_skipped_compaction_reads_the_same_in_the_cell_budget_and_sidebar(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.display_mode = 'rich'")
    sidebar = recording_sidebar(ip)
    scripted.script(text("Short answer."))
    with capture_output():
        ip.run_line_magic("soba", "hello")
    with capture_output() as cap:
        ip.run_line_magic("compact", "")
        ip.run_line_magic("budget", "")

    *cell_lines, hint, budget = rich_texts(cap.outputs)
    line = cell_lines[-1]
    assert line.startswith("skipped: ")
    assert hint.startswith('to hand the session over as it is, %capsule create "TITLE"')
    assert f"Last attempt: {line}" in budget.splitlines()
    [result] = sidebar.of_type("result")
    assert result["line"] == line and result["outcome"] == "skipped"
    assert sidebar.of_type("snapshot")[-1]["lastAttempt"] == line


def test_a_real_barrier_refreshes_the_line_at_least_every_half_second(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.display_mode = 'rich'")
    turns_to_compact(ip, scripted)
    scripted.summary = text(good_summary(), chunks=30, chunk_delay_s=0.05)
    sidebar = recording_sidebar(ip)
    with capture_output():
        ip.run_line_magic("compact", "")

    magics = ip.magics_manager.registry["SobaMagics"]
    assert magics.agent.compactor.last_result.quality == "full"
    changes = [t for t, m in sidebar.sent if m["type"] in ("progress", "result")]
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
    """Stands in for the ipykernel comm a JupyterLab sidebar opened to the monitor's target."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send(self, data: dict) -> None:
        self.sent.append(data)

    def on_close(self, callback) -> None:
        pass

    def on_msg(self, callback) -> None:
        pass


def test_the_magics_feed_the_jupyterlab_sidebar(ip, scripted, monkeypatch):
    from soba_nb.notebook import comm as sidebar

    monkeypatch.setattr(sidebar, "_comms", [])
    channel = RecordingComm()
    sidebar._opened(channel, {})  # what ipykernel does when the sidebar opens a comm
    ip.run_line_magic("config", "SobaMagics.display_mode = 'rich'")
    turns_to_compact(ip, scripted)
    scripted.summary = text("Error: upstream model unavailable")
    with capture_output() as cap:
        ip.run_line_magic("compact", "")

    kinds = [message["type"] for message in channel.sent]
    assert {"snapshot", "progress", "result"} <= set(kinds)
    cell_lines = rich_texts(cap.outputs)
    progress = [m for m in channel.sent if m["type"] == "progress"]
    assert progress[0]["line"] == cell_lines[0] == "Compacting context · 0%"
    assert all(m["line"] == f"Compacting context · {m['percent']}%" and m["trigger"] == "user" for m in progress)
    result = [m for m in channel.sent if m["type"] == "result"][-1]
    assert result["line"] == cell_lines[-1]  # the line the cell collapsed to
    assert result["degraded"] is True and result["outcome"] == "completed" and "fallback" in result["line"]
    snapshot = channel.sent[-1]
    agent = ip.magics_manager.registry["SobaMagics"].agent
    assert snapshot["type"] == "snapshot" and snapshot["effective"] == agent.compactor.measure().effective
    assert snapshot["degraded"] is True and snapshot["session"] == agent.session_id
    assert snapshot["lastAttempt"] is None  # it completed (with the fallback capsule)


def test_the_sidebar_follows_a_turn_while_it_runs(ip, scripted):
    """Issue 26 item 2: the panel's figures arrive at the start of the first turn and after
    each call, not only when the turn ends."""
    from llm_server import tool_calls

    sidebar = recording_sidebar(ip)
    slow = "import time\ntime.sleep(0.6)\n'x' * 4000"
    scripted.script(tool_calls(("python", {"code": slow})), tool_calls(("python", {"code": slow})), text("Done."))
    arrivals: list[tuple[str, int]] = []
    original = sidebar.__call__

    def during(message):
        original(message)
        if message["type"] == "snapshot":
            arrivals.append((str(len(scripted.inference_requests())), message["effective"]))

    ip.magics_manager.registry["SobaMagics"].sidebar.send = during
    with capture_output():
        ip.run_line_magic("soba", "work twice")
    requests_seen = [count for count, _ in arrivals]
    assert requests_seen[0] == "0"  # before the first request left
    assert "1" in requests_seen and "2" in requests_seen  # after each answer and its call, mid-turn
    figures = [effective for _, effective in arrivals]
    assert figures == sorted(figures) and figures[-1] > figures[0]


def test_the_cell_rounds_a_percentage_as_the_panel_does() -> None:
    """925 of 5,000 is 18.5 %: the cell says 19 %, as the sidebar does (`Math.round`); Python's
    own rounding had the cell say 18 % beside the panel's 19 %."""
    from soba_nb.notebook.monitor import BudgetSnapshot

    snapshot = BudgetSnapshot(effective=925, hard_limit=5000, soft_limit=4000, source="estimated", auto=True)
    assert "925 / 5,000 tokens (19% of hardLimit)" in snapshot.lines()[0]
    assert BudgetSnapshot(effective=905, hard_limit=5000, soft_limit=4000, source="estimated", auto=True).shown_percent == 18
