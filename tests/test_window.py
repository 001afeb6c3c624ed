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
    assert capped.context_window == 8192 and capped.notes == ("model.contextWindow from soba.json is 32,000, but the server says 8,192: using the server's",)
    # The explicit figures still fit the server's window: they stay (SPEC §12).
    assert (capped.max_output_tokens, capped.safety_reserve_tokens, capped.keep_recent_tokens) == (1000, 1000, 4000)
    assert capped.hard_limit == 6192
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


# -- explicit settings are kept while they fit (SPEC §12) ------------------------------------

SERVER_12K = ServerWindow(12000, "llama.cpp GET /props n_ctx")


def test_explicit_figures_that_fit_the_servers_window_are_kept():
    """Issue 22: an explicit safetyReserveTokens 2,000 became 750, the hard limit 9,250, not 8,000."""
    c = config({"name": "my-finetune", "maxOutputTokens": 2000}, {"safetyReserveTokens": 2000})
    limits = resolve_limits(c, server=SERVER_12K)
    assert (limits.max_output_tokens, limits.safety_reserve_tokens, limits.hard_limit) == (2000, 2000, 8000)
    assert limits.notes == ()
    # What the user did not set still follows the smaller window.
    assert limits.keep_recent_tokens == 8000 // 4 and limits.min_tokens_for_auto_compact == 8000 // 2


def test_only_the_figure_that_cannot_hold_gives_way():
    c = config({"name": "my-finetune", "maxOutputTokens": 2000}, {"safetyReserveTokens": 11000})
    limits = resolve_limits(c, server=SERVER_12K)
    assert (limits.max_output_tokens, limits.safety_reserve_tokens) == (2000, 12000 // 16)
    assert limits.notes == (
        "compaction.safetyReserveTokens 11,000 (from soba.json) leaves no hard limit in a window of 12,000: using 750",
    )


def test_the_figure_furthest_over_its_share_gives_way_first_and_alone_when_that_is_enough():
    c = config({"name": "my-finetune", "maxOutputTokens": 9000}, {"safetyReserveTokens": 4000})
    limits = resolve_limits(c, server=SERVER_12K)
    # 9,000 is 6,000 over a quarter of the window; 4,000 only 3,250 over a sixteenth.
    assert (limits.max_output_tokens, limits.safety_reserve_tokens, limits.hard_limit) == (3000, 4000, 5000)
    assert len(limits.notes) == 1 and limits.notes[0].startswith("model.maxOutputTokens 9,000 (from soba.json)")


def test_an_explicit_keep_recent_tokens_stays_while_below_the_hard_limit():
    kept = resolve_limits(config({"name": "m", "maxOutputTokens": 2000}, {"safetyReserveTokens": 2000, "keepRecentTokens": 7999}), server=SERVER_12K)
    assert kept.keep_recent_tokens == 7999 and kept.notes == ()
    scaled = resolve_limits(config({"name": "m", "maxOutputTokens": 2000}, {"safetyReserveTokens": 2000, "keepRecentTokens": 8000}), server=SERVER_12K)
    assert scaled.keep_recent_tokens == 2000
    assert scaled.notes == ("compaction.keepRecentTokens 8,000 (from soba.json) is not below the hard limit (8,000): using 2,000",)


def test_explicit_trigger_floors_are_kept_whatever_the_window():
    c = config({"name": "m"}, {"minTokensForAutoCompact": 50000, "minReclaimableTokens": 30000})
    limits = resolve_limits(c, server=SERVER_12K)
    assert (limits.min_tokens_for_auto_compact, limits.min_reclaimable_tokens) == (50000, 30000)
    assert limits.soft_limit(c) == limits.hard_limit - 1 and limits.notes == ()


@given(
    window=st.integers(min_value=64, max_value=2_000_000),
    max_output=st.one_of(st.none(), st.integers(min_value=1, max_value=40_000)),
    safety=st.one_of(st.none(), st.integers(min_value=0, max_value=40_000)),
    keep=st.one_of(st.none(), st.integers(min_value=0, max_value=40_000)),
)
def test_explicit_figures_are_kept_exactly_when_they_fit(window, max_output, safety, keep):
    model = {"name": "my-finetune"} | ({} if max_output is None else {"maxOutputTokens": max_output})
    compaction = {key: value for key, value in (("safetyReserveTokens", safety), ("keepRecentTokens", keep)) if value is not None}
    try:
        c = config(model, compaction)
    except ValueError:
        return  # does not fit the configured window: refused at load
    limits = resolve_limits(c, server=ServerWindow(window, "server"))
    assert limits.hard_limit > 0 and 0 <= limits.keep_recent_tokens < limits.hard_limit
    shown = (limits.max_output_tokens, limits.safety_reserve_tokens)
    given_figures = (max_output, safety)
    if max_output is not None and safety is not None and hard_limit(limits.context_window, max_output, safety) > 0:
        assert shown == given_figures
        if keep is not None and keep < limits.hard_limit:
            assert limits.keep_recent_tokens == keep
    changed = [name for name, value, now in (("maxOutputTokens", max_output, shown[0]), ("safetyReserveTokens", safety, shown[1])) if value is not None and value != now]
    for name in changed:  # a user's figure never changes silently
        assert any(name in note for note in limits.notes)
