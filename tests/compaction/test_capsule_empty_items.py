"""An empty section says `(none)` and nothing else (SPEC §14, issue 38): an item that only says
"empty" (`- (none)`, `* none`, `- n/a`), written by a model in one capsule, is never carried as
an item beside real ones into the next."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from soba_nb.compaction.capsule import Capsule, parse_capsule, render_capsule, section_items
from soba_nb.compaction.deterministic import build_deterministic_capsule
from soba_nb.transcript.entries import Entry, MessageEntry, ToolCallEntry, ToolResultEntry

MODEL_CAPSULE = """\
## Goal and constraints

Clean the sales data.

## Work done

- Loaded sales.csv into `df`.

## In progress

- (none)

## Pending

* none

## Decisions

- n/a

## Blockers

- None.

## Next steps

- **(none)**

## Files read

- sales.csv

## Files modified

(none)

## Verification

- (none)

## Active skills

- nothing

## Kernel state

- (none)

## Artifacts

- (none)
"""


def entries() -> list[Entry]:
    code = "clean.to_csv('out/clean.csv')\nprint(len(clean))"
    return [
        MessageEntry(role="user", content="save the clean table"),
        ToolCallEntry(call_id="c1", name="python", arguments=json.dumps({"code": code})),
        ToolResultEntry(call_id="c1", name="python", content="stdout:\n1722"),
        MessageEntry(role="assistant", content="Saved 1722 rows to out/clean.csv."),
    ]


def test_a_previous_capsule_s_none_items_give_way_to_the_new_items() -> None:
    capsule = build_deterministic_capsule(entries(), previous=parse_capsule(MODEL_CAPSULE))
    rendered = render_capsule(capsule)
    assert "- (none)" not in rendered and "* none" not in rendered and "- n/a" not in rendered
    assert capsule.verification.splitlines() == [
        "- python `clean.to_csv('out/clean.csv') ⏎ print(len(clean))` → ok: 1722"
    ]
    assert capsule.artifacts.splitlines() == ["- out/clean.csv"]
    assert capsule.in_progress == ""  # the request was answered: nothing of it is in progress
    assert capsule.files_modified.splitlines() == ["- out/clean.csv"]
    # A section nothing new filled says `(none)` alone.
    sections = dict(parse_capsule(rendered).sections())
    for empty in ("Pending", "Decisions", "Blockers", "Active skills"):
        assert sections[empty] == ""
        assert f"## {empty}\n\n(none)\n\n##" in rendered


def test_a_body_of_only_empty_items_is_empty_and_real_items_stay_verbatim() -> None:
    assert Capsule(pending="- (none)\n* none\n- n/a\n- Nothing yet").pending == ""
    assert Capsule(pending="- (none)\n- check refunds\n\n- (none)\n\n- ask finance").pending == (
        "- check refunds\n\n- ask finance"
    )
    # Not an empty marker: an item that says more, one with continuation lines, fenced code.
    kept = "- none of the regions is missing\n- (none)\n  but see the log\n\n```\n- (none)\n```"
    assert Capsule(pending=kept).pending == kept
    assert section_items("- (none)\n- a\n* N/A") == ["- a"]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.sampled_from(["- (none)", "- a", "* none", "", "text", "- n/a", "```", "  cont", "(none)", "- **None.**"]),
        max_size=12,
    )
)
def test_render_and_parse_keep_a_cleaned_body(lines: list[str]) -> None:
    once = parse_capsule(render_capsule(Capsule(work_done="\n".join(lines))))
    assert parse_capsule(render_capsule(once)) == once  # cleaning again changes nothing
    assert not any(item.strip() in ("- (none)", "* none", "- n/a", "- **None.**") for item in section_items(once.work_done))
