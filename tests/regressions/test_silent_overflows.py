"""Overflows that do not say so: an empty 200, and a prompt cut silently.

Found through the magics against llama.cpp and Ollama: an empty 200 body or stream for an
input near the window went through four ordinary retries and then failed, and Ollama
cutting the prompt to its num_ctx (its `prompt_tokens` far below our count of what was
sent) went unnoticed while the budget showed the truncated figure as if all was well.
"""

from __future__ import annotations

from conftest import write_soba_json
from disagreeing import DisagreeingModel
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.transcript.entries import CapsuleEntry, UsageEntry, WindowEntry
from soba_nb.transcript.store import Transcript

LONG_ANSWER = "The data has many columns worth describing. " * 45
"""About 400 tokens."""
LIMITS = {
    "model": {"contextWindow": 6000, "maxOutputTokens": 500},
    "compaction": {"keepRecentTokens": 1000, "safetyReserveTokens": 500, "minTokensForAutoCompact": 1500},
}
"""hardLimit 5,000 and softLimit 4,000 by our count."""


def agent(ip):
    return ip.magics_manager.registry["SobaMagics"].agent


def grow_until(ip, model, done, limit: int = 30) -> list[str]:
    outputs = []
    for index in range(limit):
        model.script(text(f"Answer {index}. {LONG_ANSWER}"))
        with capture_output() as out:
            ip.run_line_magic("soba", f"question {index}")
        outputs.append(out.stdout)
        if done(outputs):
            break
    return outputs


def test_an_empty_answer_near_the_window_is_an_overflow_not_four_retries(ip, nb_dir, llm_server):
    write_soba_json(nb_dir, llm_server.url, LIMITS)
    # llama.cpp started with a window smaller than configured: over it, it answers 200 with nothing.
    model = DisagreeingModel(llm_server, window=4300, kind="llamacpp")
    ip.run_line_magic("auto_compact", "off")
    outputs = grow_until(ip, model, lambda _: any(not fits for _, _, fits in model.judged))
    refused = [i for i, (op, _, fits) in enumerate(model.judged) if op == "inference" and not fits]
    assert 1 <= len(refused) <= 2  # the streamed request, then the same one asked plainly; no more
    last = outputs[-1]
    assert "context overflow" in last and "answered 200 with nothing" in last
    assert "gave up after" not in last
    after = model.judged[refused[-1] + 1 :]
    assert [op for op, _, _ in after][:2] == ["compaction", "inference"]
    assert all(fits for _, _, fits in after)
    assert f"Answer {len(outputs) - 1}." in last  # the turn got its answer from the retry
    path = Transcript.load(agent(ip).file).path()
    assert [c.trigger for c in path if isinstance(c, CapsuleEntry)] == ["context_overflow"]


def test_a_prompt_cut_silently_is_detected_and_the_budget_uses_our_count(ip, nb_dir, llm_server):
    write_soba_json(
        nb_dir,
        llm_server.url,
        {"model": {"contextWindow": 32000, "maxOutputTokens": 500}, "compaction": {"keepRecentTokens": 1000, "safetyReserveTokens": 500}},
    )
    # Ollama with num_ctx 3,000: longer prompts are cut to fit, and the usage says 3,000.
    model = DisagreeingModel(llm_server, window=3000, kind="ollama")
    ip.run_line_magic("auto_compact", "off")
    outputs = grow_until(ip, model, lambda outputs: "cut the prompt silently" in outputs[-1])
    warned = [o for o in outputs if "cut the prompt silently" in o]
    assert len(warned) == 1
    path = Transcript.load(agent(ip).file).path()
    usages = [u for u in path if isinstance(u, UsageEntry)]
    assert usages[-1].truncated and usages[-1].input_tokens == 3000
    # Detected once the counts have stopped growing with what is sent two steps in a row (one
    # step alone can be a figure on another scale: a gateway's count after the server's own).
    assert all(u.input_tokens < 3000 for u in usages[:-3])
    assert sum(not fits for _, _, fits in model.judged) <= 3
    assert [(w.context_window, w.source) for w in Transcript.load(agent(ip).file).entries if isinstance(w, WindowEntry)] == [
        (3000, "truncation")
    ]
    engine = agent(ip).compactor
    measurement = engine.measure()
    # Our count from the last figure the server gave before it started cutting (a figure at
    # its cut-off may be of a cut prompt too), never a truncated figure.
    assert measurement.effective > 3000
    assert measurement.reported_input_tokens is None or measurement.reported_input_tokens < 0.95 * 3000
    with capture_output() as out:
        ip.run_line_magic("budget", "")
    assert f"Budget: {measurement.effective:,} / " in out.stdout
    assert "Window: 3,000 tokens (truncated prompt" in out.stdout
    # The next turn compacts to the window the server really uses, or says why it cannot.
    model.script(text("After the warning."))
    with capture_output() as out:
        ip.run_line_magic("soba", "go on")
    assert "After the warning." in out.stdout or "request not sent" in out.stdout
    assert model.judged[-1][1] <= 3000 or "request not sent" in out.stdout


def test_a_server_that_merely_counts_differently_is_not_called_truncating(ip, nb_dir, scripted):
    """The loopback server counts crudely (bytes / 4 of the whole request body, schemas
    included): its count per token of ours swings with the content, and that is no cut."""
    from llm_server import tool_calls

    (nb_dir / "table.csv").write_text("".join(f"{i},{i * 7919 % 100003},{i * 31}\n" for i in range(400)))
    ip.run_line_magic("auto_compact", "off")
    scripted.script(
        text(f"Prose first. {LONG_ANSWER}"),
        tool_calls(("read_file", {"path": "table.csv"})),
        text("A table of numbers, read."),
        tool_calls(("python", {"code": "x = {'a': [1, 2, 3]}\nprint(x)"})),
        text("```json\n" + '{"k": [1, 2, 3], "v": "w"}\n' * 60 + "```"),
    )
    outputs = []
    for prompt in ("describe", "read table.csv", "run some code", "and json"):
        with capture_output() as out:
            ip.run_line_magic("soba", prompt)
        outputs.append(out.stdout)
    assert not any("cut the prompt" in o for o in outputs)
    assert not [e for e in Transcript.load(agent(ip).file).entries if isinstance(e, WindowEntry)]
