"""A setting the user gave is kept while it fits, and a window note is shown once per session.

Found through the magics (issue 22): with the window learned from the server (12,000), an
explicit `safetyReserveTokens: 2000` became 750 and the hard limit 9,250 instead of 8,000;
and the window notes were printed again, 4–5 lines of them, at every turn.
"""

from __future__ import annotations

from conftest import write_soba_json
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.transcript.entries import WindowEntry
from soba_nb.transcript.store import Transcript

SERVER_WINDOW = 12000
TURNS = 4


def agent(ip):
    return ip.magics_manager.registry["SobaMagics"].agent


def turns(ip, scripted, count: int, start: int = 0) -> list[str]:
    outputs = []
    for index in range(start, start + count):
        scripted.script(text(f"Answer {index}."))
        with capture_output() as out:
            ip.run_line_magic("soba", f"question {index}")
        assert f"Answer {index}." in out.stdout
        outputs.append(out.stdout)
    return outputs


def test_explicit_figures_that_fit_the_servers_window_are_kept(ip, nb_dir, llm_server, scripted):
    write_soba_json(
        nb_dir,
        llm_server.url,
        {"model": {"name": "my-finetune", "maxOutputTokens": 2000}, "compaction": {"safetyReserveTokens": 2000}},
    )
    llm_server.route("GET", "/props", body={"default_generation_settings": {"n_ctx": SERVER_WINDOW}})
    outputs = turns(ip, scripted, TURNS)
    limits = agent(ip).limits
    assert (limits.context_window, limits.safety_reserve_tokens, limits.max_output_tokens) == (12000, 2000, 2000)
    assert limits.hard_limit == agent(ip).compactor.thresholds.hard_limit == 8000
    with capture_output() as out:
        ip.run_line_magic("budget", "")
    assert "/ 8,000 tokens" in out.stdout
    assert not any("warning:" in output for output in outputs)  # nothing the user set changed


def test_a_window_note_is_shown_once_per_session(ip, nb_dir, llm_server, scripted):
    """An explicit window the server caps, and an explicit keepRecentTokens that cannot stay
    below the new hard limit: two notes, each shown at the first turn and never again."""
    write_soba_json(
        nb_dir,
        llm_server.url,
        {
            "model": {"name": "my-finetune", "contextWindow": 32000, "maxOutputTokens": 2000},
            "compaction": {"safetyReserveTokens": 2000, "keepRecentTokens": 9000, "timeoutMs": 5000},
        },
    )
    llm_server.route("GET", "/props", body={"default_generation_settings": {"n_ctx": SERVER_WINDOW}})
    outputs = turns(ip, scripted, TURNS)
    window_note = "model.contextWindow from soba.json is 32,000, but the server says 12,000: using the server's"
    keep_note = "compaction.keepRecentTokens 9,000 (from soba.json) is not below the hard limit (8,000): using 2,000"
    assert window_note in outputs[0] and keep_note in outputs[0]
    assert outputs[0].count("warning:") == 2
    assert not any("warning:" in output for output in outputs[1:])
    limits = agent(ip).limits
    assert (limits.hard_limit, limits.safety_reserve_tokens, limits.keep_recent_tokens) == (8000, 2000, 2000)

    # `%budget` between turns re-reads soba.json (the same settings): still nothing new.
    with capture_output():
        ip.run_line_magic("budget", "")
    assert not any("warning:" in output for output in turns(ip, scripted, 1, start=TURNS))


def test_a_note_that_changes_is_new(ip, nb_dir, llm_server, scripted):
    """An overflow later teaches a smaller window: the notes it brings are shown, once."""
    write_soba_json(
        nb_dir,
        llm_server.url,
        {
            "model": {"name": "my-finetune", "contextWindow": 32000, "maxOutputTokens": 2000},
            "compaction": {"safetyReserveTokens": 2000, "keepRecentTokens": 6000, "timeoutMs": 5000},
        },
    )
    llm_server.route("GET", "/props", body={"default_generation_settings": {"n_ctx": SERVER_WINDOW}})
    first = turns(ip, scripted, 2)
    assert "keepRecentTokens" not in "".join(first)  # 6,000 is below the hard limit 8,000
    agent(ip).learn_window(10000, "overflow", "the server's stated limit is 10,000 tokens")
    later = turns(ip, scripted, 3, start=2)
    keep_note = "compaction.keepRecentTokens 6,000 (from soba.json) is not below the hard limit (6,000): using 1,500"
    assert keep_note in later[0]
    assert "keepRecentTokens" not in "".join(later[1:])
    windows = [e for e in Transcript.load(agent(ip).file).entries if isinstance(e, WindowEntry)]
    assert [w.context_window for w in windows if w.source == "overflow"] == [10000]
