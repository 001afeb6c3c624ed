"""An amended capsule (SPEC §14, `soba_nb.capsule_files.amend`): the entry it appends, what
model input and the budget make of it."""

from __future__ import annotations

import msgspec
import pytest
from compaction_support import (
    FakeSummarizer,
    add_exchange,
    good_summary,
    make_compactor,
    open_transcript,
    thresholds,
)

from soba_nb.capsule_files.amend import AmendError, amend_capsule, amended_entry
from soba_nb.compaction.model_input import assemble, capsule_text, visible_context
from soba_nb.compaction.native_continuation import NativeTarget
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import CapsuleEntry, NativeContinuation


def compacted(tmp_path):
    transcript = open_transcript(tmp_path)
    for index in range(8):
        add_exchange(transcript, 300, index=index)
    compactor = make_compactor(transcript, thresholds(keep=400), summarizer=FakeSummarizer())
    result = compactor.compact()
    assert isinstance(result.entry, CapsuleEntry)
    return transcript, compactor, result.entry


def test_the_amendment_replaces_the_capsule_in_model_input_and_in_the_budget(tmp_path):
    transcript, compactor, original = compacted(tmp_path)
    add_exchange(transcript, 40, index=99)  # a turn after the compaction stays in the tail
    text = original.content.replace("## Work done\n\n", "## Work done\n\n- Keep refunds out of revenue." + " Finance books them." * 40 + "\n")
    amended = amend_capsule(transcript, original.checkpoint_id, text, counter=compactor.counter)

    context = visible_context(transcript.path_view())
    assert context.capsule == amended
    assert not any(isinstance(e, CapsuleEntry) for e in context.entries)
    kept = visible_context(transcript.path_view()[: transcript.path_view().index(original) + 1])
    assert context.entries[: len(kept.entries)] == kept.entries  # the same kept tail, then the turn after
    assert context.entries[-1].content.startswith("word")  # type: ignore[union-attr]

    built = compactor.model_input()
    assert "Keep refunds out of revenue." in built.messages[0].content
    # The tracker rebuilt on the new capsule: its estimate is the assembled input's size.
    assert compactor.measure().estimated == assemble(
        context, system="You are a test agent.", tools=compactor.tools, counter=TokenCounter.for_model("openai", "gpt-4o")
    ).tokens
    # Measured again: the continuation grew by what the capsule text did.
    counter = TokenCounter.for_model("openai", "gpt-4o")
    grown = counter.count_message("user", capsule_text(amended)) - counter.count_message("user", capsule_text(original))
    assert grown > 0 and amended.tokens_after == original.tokens_after + grown


def test_a_later_compaction_rolls_up_the_amendment(tmp_path):
    transcript, compactor, original = compacted(tmp_path)
    amended = amend_capsule(transcript, original.checkpoint_id, good_summary("The amended goal."))
    for index in range(10, 16):
        add_exchange(transcript, 300, index=index)
    result = compactor.compact()
    assert isinstance(result.entry, CapsuleEntry) and result.entry.rolls_up == amended.id


def test_the_providers_native_item_is_not_carried_over(tmp_path):
    transcript, _, original = compacted(tmp_path)
    native = NativeContinuation(provider="openai", model="gpt-4o", kind="openai.responses.compact", payload={"x": 1})
    with_native = msgspec.structs.replace(original, native=native, continuation="native")
    entry = amended_entry(with_native, good_summary("Corrected."))
    assert entry.native is None and entry.continuation is None
    assert entry.content.startswith("## Goal and constraints\n\nCorrected.")
    # A target that accepts the original's item would send it instead of any text: the
    # amendment, holding none, is sent as text to that same target.
    target = NativeTarget(provider="openai", model="gpt-4o", kinds=frozenset({native.kind}))
    assert visible_context([with_native], target=target).native == native
    assert visible_context([entry], target=target).native is None


def test_without_a_counter_the_figures_are_the_originals(tmp_path):
    _, _, original = compacted(tmp_path)
    entry = amended_entry(original, good_summary("Corrected."), author="ana@jupyter-ana")
    assert (entry.tokens_after, entry.author, entry.amends) == (original.tokens_after, "ana@jupyter-ana", original.checkpoint_id)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "the cell is empty"),
        ("## Goal and constraints\n\nx\n", r"missing 12 section heading\(s\)"),
    ],
)
def test_a_bad_text_is_refused_and_nothing_appended(tmp_path, text, problem):
    transcript, _, original = compacted(tmp_path)
    before = len(transcript)
    with pytest.raises(AmendError, match=problem):
        amend_capsule(transcript, original.checkpoint_id, text)
    assert len(transcript) == before


def test_a_loaded_capsule_keeps_its_handoff_frame(tmp_path):
    transcript, _, original = compacted(tmp_path)
    loaded = msgspec.structs.replace(original, source="/tmp/handoff.capsule.md", title="Handoff")
    entry = amended_entry(loaded, good_summary("Corrected."))
    assert (entry.source, entry.title) == (loaded.source, "Handoff")
    assert capsule_text(entry).startswith("Handoff context loaded from another session")

