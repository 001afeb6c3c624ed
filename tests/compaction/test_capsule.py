"""Capsule Markdown: exact headings, tolerant parsing, round trips, summary validation (SPEC §4)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from soba_nb.compaction.capsule import (
    SECTION_FIELDS,
    SECTION_HEADINGS,
    Capsule,
    CapsuleFormatError,
    InvalidSummary,
    capsule_token_text,
    parse_capsule,
    render_capsule,
    validate_summary,
)

FULL = Capsule(
    goal_and_constraints="Clean the sales data.\n\n- never drop rows",
    work_done="- loaded sales.csv",
    decisions="- parquet, because it keeps dtypes",
    blockers="- `pytest -q` → exit status 1: Error: KeyError 'region'",
    files_read="- data/sales.csv",
    verification="- shell `pytest -q` → exit status 1",
    kernel_state="- df: DataFrame 120000×14",
)


def markdown(bodies: dict[str, str], *, skip: tuple[str, ...] = ()) -> str:
    return "\n\n".join(
        f"## {heading}\n\n{bodies.get(heading, '(none)')}" for heading in SECTION_HEADINGS if heading not in skip
    )


def test_the_thirteen_headings_in_spec_order() -> None:
    assert SECTION_HEADINGS == (
        "Goal and constraints", "Work done", "In progress", "Pending", "Decisions", "Blockers",
        "Next steps", "Files read", "Files modified", "Verification", "Active skills",
        "Kernel state", "Artifacts",
    )
    assert list(Capsule.model_fields)[:13] == list(SECTION_FIELDS)


def test_render_has_every_heading_in_order_and_says_none_for_empty_sections() -> None:
    text = render_capsule(FULL)
    headings = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert headings == list(SECTION_HEADINGS)
    assert "## In progress\n\n(none)\n\n## Pending\n\n(none)\n\n" in text
    assert text.startswith("## Goal and constraints\n\nClean the sales data.")
    assert text.endswith("## Artifacts\n\n(none)\n") and not text.endswith("\n\n")
    assert render_capsule(FULL) == text == capsule_token_text(FULL)


def test_parse_is_tolerant_of_spacing_case_and_decoration() -> None:
    text = (
        "Here is the capsule you asked for.\n\n"
        "##   GOAL & constraints  \nShip it.\n"
        "##   work DONE  \n\n  - step one  \n\n"
        "## 3. In progress\nnone\n"
        "##Pending\nN/A\n"
        "## **Decisions:**\n-\n"
        + markdown({}, skip=SECTION_HEADINGS[:5])
    )
    capsule = parse_capsule(text)
    assert capsule.goal_and_constraints == "Ship it."
    assert capsule.work_done == "- step one"
    assert capsule.in_progress == capsule.pending == capsule.decisions == ""
    assert capsule.blockers == ""
    assert capsule.extra_sections == []


def test_a_missing_heading_is_an_error_that_names_it() -> None:
    text = markdown({}, skip=("Blockers", "Kernel state"))
    with pytest.raises(CapsuleFormatError) as caught:
        parse_capsule(text)
    message = str(caught.value)
    assert "## Blockers" in message and "## Kernel state" in message and "\n" not in message
    assert caught.value.missing == ["Blockers", "Kernel state"]
    assert isinstance(caught.value, ValueError)
    assert parse_capsule(text, require_all=False).blockers == ""


def test_unknown_sections_are_kept_and_rendered_after_the_known_ones() -> None:
    text = "## Notes\n\nfirst\n\n" + markdown({"Work done": "- a"}) + "\n\n## Risks\n\n- b\n"
    capsule = parse_capsule(text)
    assert capsule.extra_sections == [("Notes", "first"), ("Risks", "- b")]
    rendered = render_capsule(capsule)
    assert rendered.index("## Artifacts") < rendered.index("## Notes") < rendered.index("## Risks")


def test_a_repeated_heading_keeps_both_bodies() -> None:
    text = markdown({"Work done": "- a"}) + "\n\n## Work done\n\n- b\n"
    assert parse_capsule(text).work_done == "- a\n\n- b"


def test_body_lines_that_look_like_headings_survive_a_round_trip() -> None:
    capsule = Capsule(
        goal_and_constraints="The user wrote:\n## Work done\n### fine\n\\## escaped already",
        work_done="```\n## Files read\n## comment\n",  # a fence left open
    )
    text = render_capsule(capsule)
    again = parse_capsule(text)
    assert again.goal_and_constraints == capsule.goal_and_constraints
    assert again.work_done == "```\n## Files read\n## comment\n```"
    assert again.files_read == ""
    assert render_capsule(again) == text


def test_an_unclosed_fence_in_a_model_summary_does_not_swallow_the_next_sections() -> None:
    text = markdown({"Work done": "```python\nx = 1", "Files read": "- a.csv"})
    capsule = parse_capsule(text)
    assert capsule.files_read == "- a.csv"
    assert capsule.work_done == "```python\nx = 1"


def test_extra_section_titles_must_not_be_capsule_headings() -> None:
    with pytest.raises(ValidationError):
        Capsule(extra_sections=[("work  DONE", "x")])
    with pytest.raises(ValidationError):
        Capsule(extra_sections=[("two\nlines", "x")])


TRICKY_LINES = st.sampled_from(
    [
        "## Work done", "##Files read", " ## Notes", "\\## Pending", "\\\\## x", "### deeper",
        "```", "````python", "~~~", "- item", "1. item", "(none)", "none", "", "   ", "\t",
        "## ", "##", "`` `", "\r", "text with ## inside",
    ]
)
BODIES = st.lists(st.one_of(TRICKY_LINES, st.text(max_size=30)), max_size=8).map("\n".join)
TITLES = st.one_of(st.sampled_from(["Notes", "Work", "Risks #", "#tag", "Ünïcode"]), st.text(min_size=1, max_size=20))


@st.composite
def capsules(draw: st.DrawFn) -> Capsule:
    bodies = {name: draw(BODIES) for name in SECTION_FIELDS}
    extras = []
    for title in draw(st.lists(TITLES, max_size=3)):
        try:
            Capsule(extra_sections=[(title, "")])
        except ValidationError:
            continue
        extras.append((title, draw(BODIES)))
    return Capsule(**bodies, extra_sections=extras)


@settings(max_examples=300, deadline=None)
@given(capsules())
def test_render_parse_render_is_stable(capsule: Capsule) -> None:
    text = render_capsule(capsule)
    assert render_capsule(parse_capsule(text)) == text


@settings(max_examples=200, deadline=None)
@given(capsules())
def test_parse_gives_back_the_capsule_when_no_fence_is_left_open(capsule: Capsule) -> None:
    fenced = any(("```" in b or "~~~" in b) for _, b in capsule.sections())
    if not fenced:
        assert parse_capsule(render_capsule(capsule)) == capsule


# --- validate_summary -------------------------------------------------------------------


def reason(text: str, *, finish_reason: str = "stop", has_tool_calls: bool = False) -> str:
    with pytest.raises(InvalidSummary) as caught:
        validate_summary(text, finish_reason=finish_reason, has_tool_calls=has_tool_calls)
    assert str(caught.value)
    return caught.value.code


def test_a_good_summary_is_accepted() -> None:
    capsule = validate_summary(render_capsule(FULL), finish_reason="stop", has_tool_calls=False)
    assert capsule == FULL


def test_a_capsule_that_mentions_errors_in_its_sections_is_accepted() -> None:
    text = "Here is the updated capsule.\n\n" + markdown(
        {
            "Blockers": "Error: the API answered 429 Too Many Requests (rate limit).\n"
            "```\nTraceback (most recent call last):\n  File \"x.py\"\nKeyError: 'region'\n```",
            "Work done": "- I'm sorry to report the first run failed; fixed it.",
        }
    )
    capsule = validate_summary(text, finish_reason="stop", has_tool_calls=False)
    assert "429" in capsule.blockers


@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_an_empty_summary_is_rejected(text: str) -> None:
    assert reason(text) == "empty"


def test_a_summary_cut_short_is_rejected() -> None:
    assert reason(render_capsule(FULL), finish_reason="length") == "cut_short"


def test_a_summary_with_a_tool_call_is_rejected() -> None:
    assert reason(render_capsule(FULL), has_tool_calls=True) == "tool_call"
    assert reason('<tool_call>{"name": "python"}</tool_call>\n' + render_capsule(FULL)) == "tool_call"


def test_a_summary_missing_headings_is_rejected_naming_them() -> None:
    with pytest.raises(InvalidSummary) as caught:
        validate_summary(markdown({"Work done": "- a"}, skip=("Verification",)), finish_reason="stop", has_tool_calls=False)
    assert caught.value.code == "missing_headings"
    assert "## Verification" in str(caught.value)
    assert reason("The session loaded data and trained a model.") == "missing_headings"


@pytest.mark.parametrize(
    "text",
    [
        "Error: upstream request failed",
        "I'm sorry, but I can't help with that.",
        "I cannot summarize this conversation.",
        "As an AI language model, I do not have access to the session.",
        "HTTP/1.1 429 Too Many Requests",
        "503 Service Unavailable",
        "Rate limit reached for gpt-4o-mini in organization org-x.",
        '{"error": {"message": "This model\'s maximum context length is 8192 tokens", "code": 400}}',
        "Traceback (most recent call last):\n  File \"agent.py\", line 3\nRuntimeError: boom",
        "<html><body>502 Bad Gateway</body></html>",
        "The server said: status code 500, internal server error, please retry.",
    ],
)
def test_a_summary_that_looks_like_an_error_message_is_rejected(text: str) -> None:
    assert reason(text) == "error_message"


def test_a_refusal_in_front_of_the_headings_is_rejected() -> None:
    assert reason("I'm sorry, I cannot do that.\n\n" + markdown({"Work done": "- x"})) == "error_message"


def test_a_summary_whose_sections_are_all_empty_is_rejected() -> None:
    assert reason(markdown({})) == "blank"
