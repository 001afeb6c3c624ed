"""Where the context window comes from, and the limits that follow (soba_nb.window)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from soba_nb.catalogue import lookup
from soba_nb.compaction.limits import hard_limit, soft_limit
from soba_nb.config import build_config
from soba_nb.providers.discovery import ServerWindow
from soba_nb.transcript.entries import SettingEntry, WindowEntry
from soba_nb.window import learned_window, recorded_server_window, resolve_limits


def config(model=None, compaction=None, *, layer="soba.json"):
    layers = [(layer, {"model": {"provider": "openai", **(model or {})}, "compaction": compaction or {}})]
    return build_config(layers)


def test_the_default_model_keeps_the_spec_defaults():
    c = config()
    limits = resolve_limits(c, catalogue=lookup("openai", c.model.name))
    assert (limits.context_window, limits.max_output_tokens) == (128000, 8000)
    assert limits.hard_limit == c.hard_limit == 111808
    assert limits.thresholds(c).soft_limit == c.soft_limit
    assert limits.window_source == "catalogue: GPT-4o mini"


def test_the_worked_example_holds_with_an_explicit_window():
    c = config({"contextWindow": 65000, "maxOutputTokens": 8000}, {"safetyReserveTokens": 8192})
    limits = resolve_limits(c, catalogue=lookup("openai", c.model.name))
    assert limits.hard_limit == 48808 and limits.soft_limit(c) == 39046
    assert limits.window_source == "model.contextWindow from soba.json"


def test_a_llama3_model_gets_its_own_window_and_fitting_figures():
    c = config({"name": "llama3:8b", "baseUrl": "http://127.0.0.1:11434/v1"})
    limits = resolve_limits(c, catalogue=lookup("openai", "llama3:8b"))
    assert limits.context_window == 8192 and limits.window_source == "catalogue: Llama 3"
    assert 0 < limits.max_output_tokens <= 2048
    assert 0 < limits.keep_recent_tokens < limits.hard_limit
    assert limits.min_tokens_for_auto_compact < limits.hard_limit
    assert limits.notes == ()  # nothing the user set had to change


def test_explicit_config_wins_over_the_catalogue():
    c = config({"name": "llama3:8b", "contextWindow": 6000, "maxOutputTokens": 500}, {"safetyReserveTokens": 500, "keepRecentTokens": 1000})
    limits = resolve_limits(c, catalogue=lookup("openai", "llama3:8b"))
    assert (limits.context_window, limits.max_output_tokens, limits.hard_limit) == (6000, 500, 5000)


def test_the_server_replaces_a_guess_and_caps_an_explicit_window():
    server = ServerWindow(8192, "llama.cpp GET /props n_ctx")
    guessed = resolve_limits(config({"name": "mystery-model"}), server=server)
    assert guessed.context_window == 8192 and guessed.window_source == "server: llama.cpp GET /props n_ctx"
    bigger = resolve_limits(config({"name": "mystery-model"}), server=ServerWindow(262144, "vLLM GET /v1/models max_model_len"))
    assert bigger.context_window == 262144

    explicit = config({"name": "mystery-model", "contextWindow": 32000, "maxOutputTokens": 1000}, {"keepRecentTokens": 4000, "safetyReserveTokens": 1000})
    capped = resolve_limits(explicit, server=server)
    assert capped.context_window == 8192 and "the server says 8,192" in capped.notes[0]
    assert capped.hard_limit > 0 and capped.keep_recent_tokens < capped.hard_limit
    assert any("keepRecentTokens 4,000" in note for note in capped.notes)
    roomy = resolve_limits(explicit, server=ServerWindow(65536, "vLLM"))
    assert roomy.context_window == 32000  # an explicit window smaller than the server's stays


def test_a_learned_window_caps_everything_for_its_model_only():
    c = config({"name": "qwen2.5-coder:7b", "contextWindow": 32768, "maxOutputTokens": 4000})
    entries = [
        WindowEntry(context_window=9000, source="overflow", detail="stated 9,000", model="openai/qwen2.5-coder:7b"),
        WindowEntry(context_window=4096, source="truncation", detail="cut", model="openai/other"),
        WindowEntry(context_window=7000, source="overflow", detail="stated 7,000", model="openai/qwen2.5-coder:7b"),
        WindowEntry(context_window=16384, source="server", detail="Ollama num_ctx", model="openai/qwen2.5-coder:7b"),
    ]
    learned = learned_window(entries, "openai/qwen2.5-coder:7b")
    assert learned is not None and learned.context_window == 7000
    server = recorded_server_window(entries, "openai/qwen2.5-coder:7b")
    limits = resolve_limits(c, server=server, learned=learned)
    assert limits.context_window == 7000 and limits.window_source == "overflow error (stated 7,000)"
    assert limits.hard_limit > 0 and limits.keep_recent_tokens < limits.hard_limit


def test_a_session_setting_wins_over_the_config_for_auto():
    c = config()
    assert resolve_limits(c).auto is True
    off = resolve_limits(c, auto_setting=SettingEntry(key="compaction.auto", value=False))
    assert off.auto is False and off.auto_source.startswith("session setting")
    assert off.thresholds(c).auto is False


@given(
    window=st.integers(min_value=64, max_value=2_000_000),
    explicit_keep=st.one_of(st.none(), st.integers(min_value=0, max_value=50_000)),
)
def test_limits_always_hold_whatever_the_learned_window(window, explicit_keep):
    compaction = {} if explicit_keep is None else {"keepRecentTokens": explicit_keep}
    try:
        c = config({"name": "llama3.1:8b"}, compaction)
    except ValueError:
        return  # the explicit figure does not fit the configured window: refused at load
    learned = WindowEntry(context_window=window, source="overflow", model="openai/llama3.1:8b")
    limits = resolve_limits(c, catalogue=lookup("openai", "llama3.1:8b"), learned=learned)
    assert limits.context_window <= window
    assert limits.hard_limit == hard_limit(limits.context_window, limits.max_output_tokens, limits.safety_reserve_tokens)
    assert limits.hard_limit > 0
    assert 0 <= limits.keep_recent_tokens < limits.hard_limit
    soft = limits.soft_limit(c)
    assert soft == soft_limit(limits.hard_limit, limits.min_tokens_for_auto_compact, c.compaction.auto_compact_threshold_ratio)
    assert soft < limits.hard_limit


@pytest.mark.parametrize(("key", "value"), [("model.contextWindow", 70000), ("compaction.keepRecentTokens", 7000)])
def test_config_knows_which_layer_set_a_key(key, value):
    section, name = key.split(".")
    layers = [("defaults file", {}), ("/x/soba.json", {section: {name: value}}), ("environment", {})]
    assert build_config(layers).set_by(key) == "/x/soba.json"
    assert build_config([]).set_by(key) is None
