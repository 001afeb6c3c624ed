"""A path measured from nothing (issue 28: a transcript copied without its side-cars) is
counted from the last usage figure's answer on: every figure it shows or uses is the one a
full count gives, and what came before the anchor is counted only when a figure needs it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from unittest.mock import patch

from compaction_support import make_compactor, open_transcript, thresholds, words
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_budget_tracker import STEP, play, state

from soba_nb.compaction import budget
from soba_nb.compaction.backlog import MIN_ENTRY_TOKENS, Backlog
from soba_nb.compaction.budget_state import state_path
from soba_nb.compaction.compactor import Compactor
from soba_nb.compaction.model_input import NOT_CLIPPED, VISIBLE_TYPES, entry_tokens
from soba_nb.transcript.entries import (
    CapsuleEntry,
    Entry,
    MessageEntry,
    ToolCallEntry,
    ToolResultEntry,
    UsageEntry,
)
from soba_nb.transcript.store import Transcript

HARD_LIMITS = (60, 300, 4000, 50_000)
"""From under the least a short path costs (no clip could make it fit) to far over it."""
FIGURE_STEPS = st.sampled_from(
    ["user", "assistant", "assistant", "call", "result", "usage", "usage", "truncated usage", "compaction usage",
     "intent", "soft compaction", "skill a", "skill b", "capsule keeping", "rewind"]
)  # fmt: skip
"""`STEP` with more answers and figures: most paths have an anchor."""


def cold(t: Transcript, hard: int = 4000) -> Compactor:
    """A compactor with nothing beside the transcript (a copy): no state, no counts."""
    state_path(t.file).unlink(missing_ok=True)
    return make_compactor(t, thresholds(hard=hard))


def counted_whole(t: Transcript, hard: int = 4000) -> Compactor:
    """A compactor that counted every entry of the path."""
    engine = cold(t, hard)
    engine.measure()
    engine.tracker.settle()
    state_path(t.file).unlink(missing_ok=True)
    return engine


def backlog_entries(backlog: Backlog, path: list[Entry]) -> list[Entry]:
    return [e for lo, hi in backlog.ranges for e in path[lo:hi] if isinstance(e, VISIBLE_TYPES)]


def rounds(t: Transcript, count: int, *, first: int = 0) -> None:
    """`count` rounds of request, answer, call, result and the provider's figure."""
    for n in range(first, first + count):
        t.append(MessageEntry(role="user", content=words(5 + n % 7)))
        t.append(MessageEntry(role="assistant", content=words(3 + n % 5)))
        t.append(ToolCallEntry(call_id=f"c{n}", name="python", arguments='{"code": "1"}'))
        t.append(ToolResultEntry(call_id=f"c{n}", name="python", content=words(20 + n % 30)))
        t.append(UsageEntry(input_tokens=500 + 70 * n))


@settings(max_examples=300, deadline=None)
@example([("user", 1), ("assistant", 2), ("usage", 3), ("user", 4)], 0)
@example([("user", 1), ("call", 2), ("result", 0), ("assistant", 3), ("usage", 1), ("call", 5)], 1)
@example([("skill a", 1), ("user", 1), ("assistant", 2), ("usage", 3), ("skill a", 4), ("skill b", 2)], 2)
@example([("user", 1), ("intent", 0), ("assistant", 2), ("soft compaction", 1), ("usage", 3), ("user", 4)], 3)
@example([("user", 9), ("assistant", 2), ("capsule keeping", 2), ("user", 3), ("assistant", 4), ("usage", 5)], 0)
@example([("call", 1), ("user", 1), ("assistant", 2), ("usage", 3), ("result", 0), ("user", 4)], 1)
@given(st.lists(st.tuples(st.one_of(STEP, FIGURE_STEPS), st.integers(0, 1000)), max_size=40), st.integers(0, len(HARD_LIMITS) - 1))
def test_figures_measured_from_the_anchor_equal_a_full_count(steps: list[tuple[str, int]], limit: int) -> None:
    hard = HARD_LIMITS[limit]
    with tempfile.TemporaryDirectory() as folder, patch.object(budget, "EAGER_BACKLOG_ENTRIES", 0):
        t, engine = play(Path(folder), steps)
        path = t.path()
        lazy = cold(t, hard)
        measured = lazy.measure()
        tracker = lazy.tracker
        whole = counted_whole(t, hard)
        full = whole.measure()
        # What a preflight reads needs nothing before the anchor...
        assert (measured.effective, measured.source, measured.reported_input_tokens) == (
            full.effective, full.source, full.reported_input_tokens,
        )  # fmt: skip
        assert tracker.guard == whole.tracker.guard and tracker.capsule_index == whole.tracker.capsule_index
        assert [i.checkpoint_id for i in tracker.pending_intents] == [i.checkpoint_id for i in whole.tracker.pending_intents]
        assert [s.id for s in tracker.skills] == [s.id for s in whole.tracker.skills]
        backlog = tracker.backlog
        if backlog is not None:
            assert tracker.state({}) is None  # nothing saved that a later process could not redo as fast
            assert all(lazy.counter.peek(e.id) is None for e in backlog_entries(backlog, path))
            # ... and the least it could cost is at most what it costs.
            not_results = [e for e in backlog_entries(backlog, path) if not isinstance(e, ToolResultEntry)]
            assert backlog.floor == MIN_ENTRY_TOKENS * len(not_results) <= sum(
                entry_tokens(e, whole.counter) for e in not_results
            )
        # The model input: the same messages, notes and size, on the send check's scale too;
        # one no clip could make fit is not counted to be assembled or checked.
        built, expected = lazy.model_input(), whole.model_input()
        assert (built.messages, built.notes, built.native) == (expected.messages, expected.notes, expected.native)
        assert lazy.send_figure(built) == whole.send_figure(expected)
        if built.backlog is not None:
            assert all(lazy.counter.peek(e.id) is None for e in backlog_entries(built.backlog, path))
        assert built.tokens == expected.tokens
        # Every figure, once read, is the full count's (and the kept-up tracker's).
        assert measured == full == engine.measure()
        assert state(tracker, path) == state(whole.tracker, path) == state(engine.tracker, path)
        assert tracker.backlog is None and tracker.state({}) is not None  # a state to save now


def test_a_long_path_copied_alone_is_measured_from_its_last_figure(tmp_path: Path) -> None:
    t = open_transcript(tmp_path)
    rounds(t, 120)  # 600 entries: past EAGER_BACKLOG_ENTRIES
    t.append(MessageEntry(role="user", content="and now plot the revenue"))
    warm = counted_whole(t, hard=50_000)
    before = warm.measure()
    copy = cold(t, hard=50_000)
    measured = copy.measure()
    # The last figure answered the last assistant message: that message, its call, result,
    # the figure and the new request are all that is counted (and the system prompt).
    assert copy.counter.cache_size <= 6 and copy.tracker.backlog is not None
    assert copy.tracker.backlog.entries == len(t.path()) - 5
    assert measured.effective == before.effective and measured.source == "provider_usage"
    assert measured.estimated == before.estimated  # counted now, once
    assert copy.counter.cache_size > 480


def test_an_input_no_clip_could_fit_is_not_counted_and_one_that_might_be_is(tmp_path: Path) -> None:
    """Over the hard limit even without its tool outputs (at the least each entry could cost),
    the input is never sent: it is assembled and checked without counting what came before
    the last usage figure. Otherwise the clip decisions read every count: it is counted."""
    t = open_transcript(tmp_path)
    rounds(t, 120)
    for hard, lazy in ((300, True), (4000, False)):
        warm = counted_whole(t, hard=hard)
        copy = cold(t, hard=hard)
        built, expected = copy.model_input(), warm.model_input()
        assert copy.send_figure(built) == warm.send_figure(expected) > hard
        assert built.notes == expected.notes and (copy.tracker.backlog is not None) == lazy
        if lazy:
            assert NOT_CLIPPED in built.notes and copy.counter.cache_size <= 6
        assert built.tokens == expected.tokens


def test_a_compaction_counts_the_backlog_once_and_plans_as_a_full_count(tmp_path: Path) -> None:
    """Its plan, its calibration and the capsule's before-figures are the whole region's."""
    t = open_transcript(tmp_path)
    rounds(t, 120)
    t.close()
    (tmp_path / "copy").mkdir()
    copy_file = shutil.copyfile(t.file, tmp_path / "copy" / t.file.name)
    results = []
    for file in (t.file, copy_file):
        store = Transcript.open(file)
        engine = make_compactor(store, thresholds(hard=3000, keep=600))
        if file == t.file:
            engine.measure()
            engine.tracker.settle()
        else:
            assert engine.measure() and engine.tracker.backlog is not None
        result = engine.compact()
        capsule = store.path()[-1]
        assert isinstance(capsule, CapsuleEntry) and engine.tracker.backlog is None
        results.append((result.outcome, result.tokens_before, capsule.estimated_before, capsule.first_kept_entry_id))
        store.close()
    assert results[0] == results[1] and results[0][0].value == "completed"


def test_the_send_figure_is_a_size_when_the_server_counted_far_less(tmp_path: Path) -> None:
    """A server whose figure is far below our count (1 token for a 2,500-token prompt) and a
    clip of 2,000 tokens: the request's size on the trigger's scale was negative (-2,216),
    which a request carries to the provider's messages ("about -2,216 tokens")."""
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content=words(10)))
    t.append(ToolCallEntry(call_id="c1", name="python", arguments='{"code": "1"}'))
    t.append(ToolResultEntry(call_id="c1", name="python", content=words(3000)))
    t.append(MessageEntry(role="assistant", content=words(5)))
    t.append(UsageEntry(input_tokens=1))
    t.append(MessageEntry(role="user", content=words(10)))
    for hard, clipped in ((500, True), (8000, False)):
        engine = make_compactor(t, thresholds(hard=hard))
        built = engine.model_input()
        measured = engine.measure()
        assert (built.tokens < measured.estimated) is clipped
        assert 0 <= engine.send_figure(built) <= measured.effective
        assert engine.request_for_sending().messages == built.messages  # sent as built
