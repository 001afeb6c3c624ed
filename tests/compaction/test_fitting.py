"""A forced compaction fits a small window (`soba_nb.compaction.fitting`, SPEC §12): the capsule
gives way first (lists, then its quoted requests), then less is kept in full; only a request
that cannot fit even alone is refused, in those words."""

from __future__ import annotations

import pytest
from compaction_support import (
    FakeSummarizer,
    good_summary,
    make_compactor,
    open_transcript,
    thresholds,
    words,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from soba_nb.compaction.compactor import HardLimitExceeded
from soba_nb.compaction.deterministic import BARE_NOTE
from soba_nb.compaction.fitting import first_fitting, later_cuts, shortest_fitting
from soba_nb.compaction.given_way import ONE_LINE
from soba_nb.compaction.outcomes import Outcome
from soba_nb.compaction.planner import Cut, NothingToCompact, plan_cut
from soba_nb.compaction.triggers import Trigger, TurnState
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import CapsuleEntry, MessageEntry, ToolCallEntry, ToolResultEntry

COUNTER = TokenCounter.for_model("openai", "gpt-4o")


def capsule_of(transcript) -> CapsuleEntry:
    return [e for e in transcript.path() if isinstance(e, CapsuleEntry)][-1]


def test_long_requests_are_clipped_to_head_and_tail_before_a_request_is_refused(tmp_path):
    """The earlier requests are long; the fallback capsule that quotes them whole would not
    fit: they are clipped, head and tail, and the request being worked on is carried whole."""
    t = open_transcript(tmp_path)
    for index in range(6):
        t.append(MessageEntry(role="user", content=f"START{index} " + words(300) + f" END{index}"))
        t.append(MessageEntry(role="assistant", content=words(150)))
    t.append(MessageEntry(role="user", content="Summarise what you know in one line."))
    engine = make_compactor(t, thresholds(hard=900, keep=850, min_tokens=100, min_reclaimable=50))
    result = engine.preflight(TurnState(soft_attempted=True))
    assert result is not None and result.trigger == Trigger.HARD_LIMIT.value
    assert result.outcome is Outcome.COMPLETED, result.reason
    content = capsule_of(t).content
    # The session's first request stays, its head and tail; in a window this small the quoted
    # requests take at most an eighth of it: the others are counted when not even their head and
    # tail fit (the transcript holds them). START5 is in the kept tail.
    assert "START0" in content and "END0" in content and " … " in content
    assert "START4" in content or "older request(s) left out" in content
    assert engine.request_for_sending().tokens <= 900
    last = engine.request_for_sending().messages[-1]
    assert last.content == "Summarise what you know in one line."


def test_at_last_the_capsule_is_bare(tmp_path):
    """A window that takes little more than the request: the capsule keeps only its headings,
    a note that the earlier work is in the transcript, and the request goes whole."""
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="Load the data. " + words(100)))
    t.append(MessageEntry(role="assistant", content=words(200)))
    for index in range(5):
        t.append(MessageEntry(role="user", content=f"unanswered {index} " + words(60)))
    request = "What now? " + words(190)
    t.append(MessageEntry(role="user", content=request))
    engine = make_compactor(t, thresholds(hard=450, keep=400, min_tokens=100, min_reclaimable=50))
    result = engine.preflight(TurnState(soft_attempted=True))
    assert result is not None and result.outcome is Outcome.COMPLETED, result.reason
    assert BARE_NOTE in capsule_of(t).content
    model_input = engine.request_for_sending()
    assert model_input.tokens <= 450
    assert model_input.messages[-1].content == request


def test_a_request_that_cannot_fit_even_alone_is_refused_in_those_words(tmp_path):
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="Load the data."))
    t.append(MessageEntry(role="assistant", content=words(300)))
    t.append(MessageEntry(role="user", content=words(700)))
    engine = make_compactor(t, thresholds(hard=600, keep=500, min_tokens=100, min_reclaimable=50), summarizer=FakeSummarizer())
    result = engine.preflight(TurnState(soft_attempted=True))
    assert result is not None and result.outcome is Outcome.FAILED
    assert "cannot fit even alone" in result.reason and "the request 7" in result.reason


def exchange_path(shape: list[tuple[str, int]]):
    """Entries from a shape: ("user"|"assistant", tokens) or ("tools", calls)."""
    entries = []
    for kind, size in shape:
        if kind == "tools":
            entries.append(MessageEntry(role="assistant", content="calling"))
            ids = [f"c{len(entries)}_{n}" for n in range(size)]
            entries += [ToolCallEntry(call_id=i, name="python", arguments="{}") for i in ids]
            entries += [ToolResultEntry(call_id=i, name="python", content=words(20)) for i in ids]
        else:
            entries.append(MessageEntry(role=kind, content=words(size)))
    previous = None
    linked = []
    for entry in entries:
        entry = entry.__class__(**{f: getattr(entry, f) for f in entry.__struct_fields__ if f not in ("parent_id",)}, parent_id=previous)  # type: ignore[attr-defined]
        previous = entry.id
        linked.append(entry)
    return linked


SHAPES = st.lists(
    st.one_of(st.tuples(st.sampled_from(["user", "assistant"]), st.integers(1, 60)), st.tuples(st.just("tools"), st.integers(1, 3))),
    min_size=3,
    max_size=25,
)


@settings(max_examples=120, deadline=None)
@given(SHAPES)
def test_later_cuts_never_separate_a_call_from_its_result(shape):
    path = exchange_path([("user", 10), *shape])
    try:
        cut = plan_cut(path, COUNTER, keep_recent_tokens=10**6)
    except Exception:
        return  # nothing to compact in this shape
    total = cut.kept_tokens + cut.summarized_tokens
    kept_sizes = []
    for later in later_cuts(cut, COUNTER):
        assert later.kept_tokens + later.summarized_tokens == total
        assert (*later.summarize, *later.kept) == (*cut.summarize, *cut.kept)
        calls = {e.call_id for e in later.kept if isinstance(e, ToolCallEntry)}
        results = {e.call_id for e in later.kept if isinstance(e, ToolResultEntry)}
        assert results <= calls  # every result kept has its call kept
        assert isinstance(later.kept[0], MessageEntry)
        kept_sizes.append(later.kept_tokens)
    assert kept_sizes == sorted(kept_sizes, reverse=True)


def test_first_fitting_finds_the_most_kept_that_fits():
    cuts = [Cut(summarize=(), kept=(), first_kept_entry_id=str(n), kept_tokens=100 - n, summarized_tokens=n, previous=None) for n in range(10)]
    asked = []

    def fits(cut):
        asked.append(cut.first_kept_entry_id)
        return cut.kept_tokens <= 93

    assert first_fitting(cuts, fits).first_kept_entry_id == "7"
    assert len(asked) <= 4  # halving, not one by one
    assert first_fitting(cuts, lambda cut: False) is None


def test_shortest_fitting_tries_one_item_first_then_the_request_steps():
    calls = []

    def render(items_max, request_chars):
        calls.append((items_max, request_chars))
        size = (items_max or 400) + (request_chars or 300)
        return (items_max, request_chars), size

    assert shortest_fitting(render, 100)[0] == (1, 80)  # 1 + 80 fits, 1 + 160 does not
    assert calls[0] == (1, None)
    calls.clear()
    assert shortest_fitting(render, 360)[0] == (60, None)  # lists alone are enough: halving
    assert all(request_chars is None for _, request_chars in calls)
    calls.clear()
    assert shortest_fitting(render, 10)[0] == (1, ONE_LINE)  # no clipped capsule fits: one line
    assert calls[-2:] == [(1, 0), (1, ONE_LINE)]  # the bare capsule is tried before it
    assert shortest_fitting(render, -5)[0] == (1, ONE_LINE)  # none fits: the shortest of all


def test_when_a_capsule_gives_way_the_story_goes_before_the_facts() -> None:
    """A fallback capsule shortened for a small window keeps more files and commands than
    narrative lines (SPEC §4: every file touched and command run survives it)."""
    from soba_nb.compaction.deterministic import (
        LIST_ITEMS_MAX,
        NARRATIVE_MAX_ITEMS,
        WORK_DONE_NEW_LINES,
        capsule_from_scan,
    )
    from soba_nb.compaction.extract import Run, Scan

    scan = Scan({})
    scan.work = [(False, f"- said thing {i}") for i in range(60)]
    scan.files_read = {f"data/file_{i}.csv": f"data/file_{i}.csv" for i in range(60)}
    scan.runs = {f"shell cmd {i}": Run("shell", f"shell `cmd {i}`", "exit status 0", False) for i in range(60)}
    full = capsule_from_scan(scan)
    assert full.work_done.count("said thing") == WORK_DONE_NEW_LINES and full.files_read.count("file_") == 60
    shorter = capsule_from_scan(scan, items_max=LIST_ITEMS_MAX // 8)
    assert shorter.files_read.count("file_") == 50 and shorter.verification.count("cmd ") == 50
    kept_story = shorter.work_done.count("said thing")
    assert kept_story < NARRATIVE_MAX_ITEMS // 8 and "more, older" in shorter.work_done  # (the note takes a line)


def after_a_capsule_the_request_grows(tmp_path, summarizer=None, result_words=100, hard=700):
    """A hard-limit compaction at the preflight keeps only the request; then the model calls a
    tool and its result no longer fits beside the capsule written for the request alone (seen
    with llama.cpp at 2,048: the region is one group, a request and its calls)."""
    t = open_transcript(tmp_path)
    for index in range(6):
        t.append(MessageEntry(role="user", content=f"Step {index}: load and clean table {index}. " + words(120)))
        t.append(MessageEntry(role="assistant", content=f"Done {index}. " + words(150)))
    request = "Now this: " + words(300)
    t.append(MessageEntry(role="user", content=request))
    engine = make_compactor(t, thresholds(hard=hard, keep=1500, min_tokens=100, min_reclaimable=50), summarizer=summarizer)
    first = engine.preflight(TurnState())
    assert first is not None and first.outcome is Outcome.COMPLETED
    t.append(ToolCallEntry(call_id="c1", name="python", arguments='{"code": "df.describe()"}'))
    t.append(ToolResultEntry(call_id="c1", name="python", content=words(result_words)))
    assert engine.measure().effective > hard
    return t, engine, request


@pytest.mark.parametrize("result_words", [220, 260])
def test_a_capsule_rolls_up_again_when_the_request_it_kept_outgrows_it(tmp_path, result_words):
    t, engine, request = after_a_capsule_the_request_grows(tmp_path, result_words=result_words)
    before = capsule_of(t)
    sent = engine.request_for_sending()  # was: "nothing to compact: the history before the kept window is empty"
    after = capsule_of(t)
    assert sent.tokens <= 700
    # The capsule gives way when it can (rolled up, shorter); one that quotes only the requests it
    # replaced (the request being worked on is in the tail) has little to give: then the result
    # is clipped in model input (whole in the transcript), with a note.
    rolled = after.id != before.id and after.rolls_up == before.id and len(after.content) < len(before.content)
    assert rolled or any("clipped result of python call c1" in note for note in sent.notes)
    assert [m.content for m in sent.messages if m.role == "user"][-1] == request  # the request, whole
    assert any(m.role == "tool" for m in sent.messages)  # its call and result kept, never split


def test_a_model_capsule_too_large_to_roll_up_gives_way_to_the_fallback(tmp_path):
    long_model_capsule = FakeSummarizer(text=good_summary(words(230)))
    t, engine, _ = after_a_capsule_the_request_grows(tmp_path, summarizer=long_model_capsule, result_words=220)
    assert engine.request_for_sending().tokens <= 700
    assert capsule_of(t).quality == "degraded" and "did not fit" in engine.last_result.reason


def test_only_a_forced_compaction_with_a_capsule_rolls_it_up_alone(tmp_path):
    t = open_transcript(tmp_path)
    t.append(MessageEntry(role="user", content="Now this: " + words(300)))
    path = t.path()
    with pytest.raises(NothingToCompact):  # no capsule to roll up
        plan_cut(path, COUNTER, keep_recent_tokens=1500, max_kept_tokens=100)
    t.append(CapsuleEntry(operation_id="op", checkpoint_id="ck_1", trigger="hard_limit", quality="degraded",
                          tokens_before=1, tokens_after=1, first_kept_entry_id=None, content="## Goal and constraints\n\nclean it\n"))
    t.append(MessageEntry(role="user", content="And this: " + words(300)))
    path = t.path()
    with pytest.raises(NothingToCompact):  # not forced: nothing new to summarize is nothing to do
        plan_cut(path, COUNTER, keep_recent_tokens=1500)
    cut = plan_cut(path, COUNTER, keep_recent_tokens=1500, max_kept_tokens=100)
    assert cut.summarize == () and cut.empty and cut.previous is not None and cut.kept[-1] is path[-1]


def test_a_request_whose_own_calls_leave_no_room_is_refused_saying_so(tmp_path):
    """The calls a request made since are kept whole (never split from their results): when
    they and the request do not fit, even with no capsule (SPEC §17), the refusal says what
    they cost."""
    t, engine, _ = after_a_capsule_the_request_grows(tmp_path, hard=450)
    with pytest.raises(HardLimitExceeded) as raised:
        engine.request_for_sending()
    message = str(raised.value)
    assert "cannot fit even alone" in message and "the request 307, the calls it made since 117" in message
