"""The context window follows the model and the server, and what an overflow teaches stays.

Found through the magics: `contextWindow` stayed 128,000 for `--model llama3:8b` and for a
llama.cpp server started with `-c 8192`, so the hard limit was fiction and every turn relied
on overflow recovery; an overflow error stating "maximum context length is 8192" was
forgotten at once, and by a resumed session too.
"""

from __future__ import annotations

import json

import pytest
from compaction_support import good_summary, words
from conftest import new_shell, shut_down, write_soba_json
from disagreeing import DisagreeingModel
from IPython.utils.capture import capture_output
from llm_server import text

from soba_nb.cli import main as cli_main
from soba_nb.transcript.entries import WindowEntry
from soba_nb.transcript.store import Transcript

NO_WINDOW = {"model": {}, "compaction": {"timeoutMs": 5000}}
"""soba.json naming only the server: the window must come from somewhere real."""
LONG_ANSWER = "The data has many columns worth describing. " * 45
"""About 400 tokens."""


def budget(ip) -> str:
    with capture_output() as out:
        ip.run_line_magic("budget", "")
    return out.stdout


def agent(ip):
    return ip.magics_manager.registry["SobaMagics"].agent


def test_a_llama3_model_gets_its_catalogue_window(ip, nb_dir, llm_server):
    write_soba_json(nb_dir, llm_server.url, NO_WINDOW)
    ip.run_line_magic("soba", "--model llama3:8b")
    shown = budget(ip)
    assert "Window: 8,192 tokens (catalogue: Llama 3)" in shown
    limits = agent(ip).limits
    assert agent(ip).compactor.thresholds.hard_limit == limits.hard_limit < 8192 - limits.max_output_tokens


def test_a_llama_cpp_server_says_its_window(ip, nb_dir, llm_server, scripted, capsys):
    write_soba_json(nb_dir, llm_server.url, {"model": {"name": "my-finetune"}, "compaction": {}})
    llm_server.route("GET", "/props", body={"default_generation_settings": {"n_ctx": 8192}, "total_slots": 1})
    shown = budget(ip)
    assert "Window: 8,192 tokens (server: llama.cpp GET /props n_ctx)" in shown
    scripted.script(text("Hi."))
    ip.run_line_magic("soba", "hello")
    props = [r for r in llm_server.requests if r.path == "/props"]
    assert len(props) == 1  # asked once per session, not per turn
    session = agent(ip).file

    capsys.readouterr()
    assert cli_main(["doctor", str(nb_dir)]) == 0
    assert "window     8,192 (server: llama.cpp GET /props n_ctx)" in capsys.readouterr().out
    assert cli_main(["budget", str(session), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["contextWindow"] == 8192 and report["windowSource"].startswith("server: llama.cpp")


@pytest.mark.parametrize(
    ("route", "model", "shown"),
    [
        (
            ("POST", "/api/show", {"parameters": "num_ctx                        8192", "model_info": {"llama.context_length": 131072}}),
            "llama3.1:8b",
            "Window: 8,192 tokens (server: Ollama POST /api/show num_ctx)",
        ),
        (
            ("GET", "/v1/models", {"data": [{"id": "Qwen/Qwen2.5-7B-Instruct", "max_model_len": 16384}]}),
            "Qwen/Qwen2.5-7B-Instruct",
            "Window: 16,384 tokens (server: vLLM GET /v1/models max_model_len)",
        ),
    ],
    ids=["ollama", "vllm"],
)
def test_ollama_and_vllm_say_their_window_over_the_catalogue(ip, nb_dir, llm_server, scripted, route, model, shown):
    """The catalogue says 131,072 for Llama 3.1 and 32,768 for Qwen2.5; the server knows better."""
    write_soba_json(nb_dir, llm_server.url, {"model": {"name": model}, "compaction": {}})
    method, path, body = route
    llm_server.route(method, path, body=body)
    scripted.script(text("Hi."))
    ip.run_line_magic("soba", "hello")
    assert shown in budget(ip)
    asked = [r for r in llm_server.requests if (r.method, r.path) == (method, path)]
    assert len(asked) == 1
    if method == "POST":
        assert asked[0].body == {"model": model}
    limits = agent(ip).limits
    assert limits.context_window == int(shown.split()[1].replace(",", ""))
    assert agent(ip).compactor.thresholds.hard_limit == limits.hard_limit < limits.context_window


def test_a_stated_limit_lowers_the_window_for_the_session_and_after_a_restart(ip, nb_dir, llm_server):
    write_soba_json(
        nb_dir,
        llm_server.url,
        {"model": {"contextWindow": 16000, "maxOutputTokens": 500}, "compaction": {"keepRecentTokens": 1000, "safetyReserveTokens": 500}},
    )
    model = DisagreeingModel(llm_server, window=5000)  # the server really has 5,000
    ip.run_line_magic("auto_compact", "off")
    outputs = []
    for index in range(14):
        model.script(text(f"Answer {index}. {LONG_ANSWER}"))
        with capture_output() as out:
            ip.run_line_magic("soba", f"question {index}")
        outputs.append(out.stdout)
    refused = [tokens for _, tokens, fits in model.judged if not fits]
    assert len(refused) == 1, refused  # one overflow; afterwards the window is known
    assert any("context overflow" in o for o in outputs)
    assert not any("failed" in o for o in outputs)
    windows = [e for e in Transcript.load(agent(ip).file).entries if isinstance(e, WindowEntry)]
    assert [(w.context_window, w.source) for w in windows] == [(5000, "overflow")]
    assert agent(ip).limits.context_window == 5000

    shut_down(ip)
    ip = new_shell(nb_dir)
    assert "Window: 5,000 tokens (overflow error" in budget(ip)
    model.script(text("Still here."))
    ip.run_line_magic("soba", "and after the restart?")
    assert len([t for _, t, fits in model.judged if not fits]) == 1


@pytest.mark.parametrize("kind", ["fits-after-compaction", "request-alone-too-big"])
def test_a_retry_known_not_to_fit_the_stated_limit_is_never_sent(ip, nb_dir, llm_server, kind):
    write_soba_json(
        nb_dir,
        llm_server.url,
        {"model": {"contextWindow": 16000, "maxOutputTokens": 500}, "compaction": {"keepRecentTokens": 1000, "safetyReserveTokens": 500}},
    )
    # The server counts 1.2× what we do and really has 4,500: its error states both figures.
    model = DisagreeingModel(llm_server, factor=1.2, window=4500)
    ip.run_line_magic("auto_compact", "off")
    if kind == "fits-after-compaction":
        # Grow until the server refuses; that turn must still get its answer, from a retry
        # that fits the stated limit.
        for index in range(20):
            model.script(text(f"Answer {index}. {LONG_ANSWER}"))
            with capture_output() as out:
                ip.run_line_magic("soba", f"question {index}")
            if any(not fits for _, _, fits in model.judged):
                break
        assert f"Answer {index}." in out.stdout
    else:
        model.script(text("Done."))
        with capture_output() as out:
            ip.run_line_magic("soba", "Explain: " + "the sensor drifted while warming up; " * 400)
        assert "failed" in out.stdout
    sent_over = [tokens for op, tokens, fits in model.judged if op == "inference" and not fits]
    assert len(sent_over) == 1  # the refused request, never a second one over the limit


def test_a_compacted_retry_still_over_the_stated_limit_is_not_sent(ip, nb_dir, llm_server):
    """The recovery compaction completes (smaller than the refused request, under the new hard
    limit) but the retry would still not fit what the server stated, on the server's own
    scale: it is refused here, not sent to be refused there."""
    write_soba_json(
        nb_dir,
        llm_server.url,
        {"model": {"contextWindow": 16000, "maxOutputTokens": 500}, "compaction": {"keepRecentTokens": 2500, "safetyReserveTokens": 500}},
    )
    # The server counts 1.3× what we do, reports no usage (so nothing calibrates us before
    # its error), and really has 4,500; the summary comes back a little longer than asked for
    # (within what a stream may run to: 1.1× its maxOutputTokens and 32 tokens, SPEC §17, or
    # it is cut and rejected), the requests soba quotes beside it are long (60 words each),
    # and the kept tail is as large as the recovery allows: the model capsule still fits our
    # count of the hard limit, not the server's.
    model = DisagreeingModel(llm_server, factor=1.3, window=4500)
    model.summary = text(good_summary(words(380)))
    ip.run_line_magic("auto_compact", "off")
    for index in range(20):
        model.script(text(f"Answer {index}. {LONG_ANSWER}", usage=False))
        with capture_output() as out:
            ip.run_line_magic("soba", f"question {index}: {words(60)}")
        if any(not fits for _, _, fits in model.judged):
            break
    assert "Compacted (context_overflow)" in out.stdout
    assert "request not sent: the retry after the overflow would still be" in out.stdout
    assert "%compact" in out.stdout and "%rewind" in out.stdout
    refused = next(i for i, (_, _, fits) in enumerate(model.judged) if not fits)
    assert [op for op, _, _ in model.judged[refused + 1 :]] == ["compaction"]  # no retry went out
