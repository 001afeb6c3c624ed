"""`%load_ext soba_nb` loads the configured model's tokenizer on a background thread
(soba_nb/notebook/warm_up.py): the first `%soba` finds it loaded, a `%soba` that comes first
waits for the same load, and a configuration that does not load starts nothing and costs the
extension nothing."""

from __future__ import annotations

import json
import threading
import time

import pytest
from conftest import new_shell, shut_down
from llm_server import text

from soba_nb import tokenizer_cache, tokens
from soba_nb.notebook import warm_up


def warm_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == warm_up.THREAD_NAME]


@pytest.fixture
def unloaded(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """No tokenizer loaded in this process yet (as in a new kernel)."""
    fresh: dict[str, object] = {}
    monkeypatch.setattr(tokens, "_ENCODINGS", fresh)
    return fresh


def test_loading_the_extension_loads_the_configured_tokenizer_in_the_background(nb_dir, unloaded, monkeypatch):
    loads: list[str] = []
    slow_load = tokens.get_encoding

    def traced(name: str) -> object:
        loads.append(threading.current_thread().name)
        time.sleep(0.3)  # a slow machine: the shell is back before the load is done
        return slow_load(name)

    monkeypatch.setattr(tokens, "get_encoding", traced)
    started = time.monotonic()
    shell = new_shell(nb_dir)  # %load_ext soba_nb
    try:
        assert time.monotonic() - started < 0.3 + 5  # not waited for by the extension
        [thread] = warm_threads()
        thread.join(timeout=30)
        assert loads == [warm_up.THREAD_NAME] and "o200k_base" in unloaded
    finally:
        shut_down(shell)


@pytest.mark.parametrize(
    ("request_text", "waits"),
    [("hi", False), ("explique la colonne « région » (地区)", True)],
    ids=["plain text", "other text"],
)
def test_a_first_request_while_it_loads_never_loads_again_and_counts_the_same(
    nb_dir, scripted, unloaded, monkeypatch, request_text: str, waits: bool
):
    """Plain text (the system prompt, the tools, "hi") is counted from the encoding's plain
    tokens meanwhile (`soba_nb.plain_counts`); other text waits for the load under way."""
    calls: list[str] = []
    real = tokens._mergeable_ranks

    def slow_ranks(name: str, data: bytes) -> dict[bytes, int]:
        calls.append(threading.current_thread().name)
        time.sleep(0.5)
        return real(name, data)

    monkeypatch.setattr(tokens, "_mergeable_ranks", slow_ranks)
    monkeypatch.setattr(tokenizer_cache, "read_ranks", lambda name: None)  # the slow read, every time
    shell = new_shell(nb_dir)
    try:
        scripted.script(text("Hello."))
        shell.run_line_magic("soba", request_text)  # at once: the load is still running
        agent = shell.magics_manager.registry["SobaMagics"].agent
        if waits:  # (plain text is not waited for; the load may have ended all the same)
            assert "o200k_base" in unloaded
        for thread in warm_threads():
            thread.join(timeout=30)
        assert calls == [warm_up.THREAD_NAME]  # loaded once, by the warm-up
        assert agent.counter.count_text("hello world") == tokens.TokenCounter(agent.counter.choice).count_text("hello world") > 0
        assert agent.counter.count_text(request_text) == len(tokens.get_encoding("o200k_base").encode_ordinary(request_text))
    finally:
        shut_down(shell)


def test_a_configuration_that_does_not_load_starts_nothing(nb_dir, unloaded):
    (nb_dir / "soba.json").write_text(json.dumps({"model": {"contextWindow": "big"}}), encoding="utf-8")
    shell = new_shell(nb_dir)  # the extension loads all the same
    try:
        assert warm_threads() == [] and unloaded == {}
        assert "SobaMagics" in shell.magics_manager.registry
    finally:
        shut_down(shell)
