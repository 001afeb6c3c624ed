"""What an empty conversation costs, kept as data (soba_nb/agent/fixed_counts.py): the file
holds what counting gives now, a session's counter knows it without counting, and a prompt or
schema that differs is counted, never taken from the file."""

from __future__ import annotations

import json

import pytest

from soba_nb.agent import fixed_counts
from soba_nb.agent.limits import session_counter
from soba_nb.agent.prompt import SHARED_PROMPT, SYSTEM_PROMPT
from soba_nb.agent.tool_schemas import TOOL_SCHEMAS
from soba_nb.compaction.model_input import fixed_key, fixed_tokens
from soba_nb.config import build_config
from soba_nb.tokens import TokenCounter


def test_the_file_holds_what_counting_gives_now() -> None:
    """Out of date (a prompt or schema changed): `python -m soba_nb.agent.fixed_counts --write`."""
    assert json.loads(fixed_counts.COUNTS_FILE.read_text(encoding="utf-8")) == fixed_counts.counted()


@pytest.mark.parametrize(("provider", "model"), [("openai", "gpt-4o-mini"), ("openai", "gpt-4-turbo"), ("anthropic", "claude-sonnet-4-5")])
def test_a_session_counter_knows_the_cost_without_counting(provider: str, model: str, forbid_tokenizer) -> None:
    expected = fixed_counts.counted()
    config = build_config([("test", {"model": {"provider": provider, "name": model}})])
    forbid_tokenizer()
    counter = session_counter(config)
    # What every session's prompt shares ahead of its environment line (counted apart, SPEC §15).
    assert fixed_tokens(SHARED_PROMPT, TOOL_SCHEMAS, counter) in expected[fixed_counts.kind(counter)].values()


def test_another_prompt_is_counted(forbid_tokenizer) -> None:
    config = build_config([("test", {"model": {"provider": "openai", "name": "gpt-4o"}})])
    counter = session_counter(config)
    assert fixed_tokens(SYSTEM_PROMPT + "\nA skill: plot with seaborn.", TOOL_SCHEMAS, counter) > fixed_tokens(
        SYSTEM_PROMPT, TOOL_SCHEMAS, counter
    )
    forbid_tokenizer()
    with pytest.raises(AssertionError, match="loaded"):  # nothing kept for it: it would be counted
        fixed_tokens(SYSTEM_PROMPT + "\nAnother skill.", TOOL_SCHEMAS, session_counter(config))


def test_a_broken_file_means_counting(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    broken = tmp_path / "fixed_counts.json"
    broken.write_text("{not json", encoding="utf-8")
    monkeypatch.setattr(fixed_counts, "COUNTS_FILE", broken)
    monkeypatch.setattr(fixed_counts, "_KNOWN", None)
    config = build_config([("test", {"model": {"provider": "openai", "name": "gpt-4o"}})])
    counter = session_counter(config)
    assert counter.peek(fixed_key(SHARED_PROMPT, TOOL_SCHEMAS)) is None  # nothing known: counted
    assert fixed_tokens(SYSTEM_PROMPT, TOOL_SCHEMAS, counter) == fixed_tokens(
        SYSTEM_PROMPT, TOOL_SCHEMAS, TokenCounter.for_model("openai", "gpt-4o")
    )
