"""A gateway's figures and answers are evidence, not truth (SPEC §13), exactly repeatable.

The same failures as `test_gateways_work` (a real LiteLLM proxy in front of llama.cpp), each
rule on its own against the loopback server:

- LiteLLM counts a stream's usage itself when the server sends none (another tokenizer, no tool
  schemas): 502 where we sent about 1,440 was read as a cut prompt, the window dropped to 502
  and `contextWindow: 2048` changed nothing;
- an oversized streamed request came back as one empty `finish_reason: stop` chunk and was
  taken for an empty answer, where unstreamed it is the 400 that states the window;
- a window too small for the summary prompt ended in a `PromptBudgetTooSmall` traceback.
"""

from __future__ import annotations

import dataclasses

import pytest
from conftest import write_soba_json
from disagreeing import DisagreeingModel
from IPython.utils.capture import capture_output
from llm_server import RecordedRequest, Reply, text

from soba_nb.transcript.entries import MessageEntry, UsageEntry, WindowEntry

N_CTX = 2048
LONG_ANSWER = "Here is how, step by step, with the reasons for each step. " * 33
"""About 400 tokens: within maxOutputTokens 512, as a server honouring max_tokens answers."""
GATEWAY_SHARE = 0.8
"""The gateway's own count of a stream against the server's (LiteLLM: 341–502 for 432–598)."""


class Gateway(DisagreeingModel):
    """LiteLLM in front of a llama.cpp server with an `N_CTX` window.

    The server counts the messages only (its chat template renders no tool schemas) and, over
    its window, refuses in its own words (a 400, which the gateway passes on unstreamed). A
    stream carries no usage from the server, so the gateway reports its own count (another
    tokenizer: `GATEWAY_SHARE` of the server's); and a streamed request over the window comes
    back as HTTP 200 with one empty `finish_reason: stop` chunk."""

    def __init__(self, server, **options):
        super().__init__(server, window=N_CTX, kind="openai", **options)

    def count(self, request: RecordedRequest) -> int:
        body = request.body if isinstance(request.body, dict) else {}
        return super().count(dataclasses.replace(request, body={**body, "tools": []}))

    def __call__(self, request: RecordedRequest) -> Reply:
        streamed = bool(request.get("stream"))
        if streamed and self.count(request) > self.window:
            self.judged.append((request.operation, self.count(request), False))
            return Reply(text="", usage=False)  # the disguised overflow
        reply = super().__call__(request)
        if streamed and reply.kind == "answer":
            reply.input_tokens = int(GATEWAY_SHARE * self.count(request))
        return reply


def agent(ip):
    return ip.magics_manager.registry["SobaMagics"].agent


def turns(ip, model, count: int) -> list[str]:
    outputs = []
    for index in range(count):
        model.script(text(f"Answer {index}. {LONG_ANSWER}"))
        with capture_output() as out:
            ip.run_line_magic("soba", f"Question {index}: explain how to clean a sales dataframe, step by step.")
        outputs.append(out.stdout + out.stderr)
    return outputs


def learned(ip) -> list[tuple[int, str]]:
    return [(e.context_window, e.source) for e in agent(ip).transcript.entries if isinstance(e, WindowEntry)]


@pytest.mark.parametrize("context_window", [None, N_CTX], ids=["no contextWindow", "contextWindow 2048"])
def test_a_gateways_own_counts_are_no_cut_prompt(ip, nb_dir, llm_server, context_window):
    """The first figure is about a third of our count (no tool schemas, another tokenizer): once
    read as a cut prompt, now evidence; the counts grow with what is sent, so nothing is cut."""
    model_layer = {"name": "team-smol", "maxOutputTokens": 512}
    if context_window is not None:
        model_layer["contextWindow"] = context_window
    write_soba_json(nb_dir, llm_server.url, {"model": model_layer, "compaction": {"timeoutMs": 3000}})
    model = Gateway(llm_server)
    outputs = turns(ip, model, 6)
    assert not any("cut the prompt" in out or "not a count to trust" in out for out in outputs)
    assert not any("Traceback" in out or "failed" in out for out in outputs), outputs
    # Over the hard limit on our count only (the gateway's, which the send check reads, is far
    # lower): nothing was clipped and nothing is wrong, so no turn says "not clipped".
    assert not any("not clipped" in out for out in outputs), outputs
    assert [source for _, source in learned(ip)] in ([], ["overflow"])  # never "truncation"
    first = next(e for e in agent(ip).transcript.entries if isinstance(e, UsageEntry))
    assert first.input_tokens < 0.5 * first.sent_tokens  # what the one-figure rule took for a cut
    limits = agent(ip).limits
    assert limits.context_window == N_CTX
    if context_window is not None:
        assert limits.window_source == "model.contextWindow from soba.json"


def test_an_overflow_streamed_as_an_empty_answer_is_asked_again_and_learned(ip, nb_dir, llm_server):
    """No contextWindow, nothing the gateway can say of the window: the first overflow comes
    as an empty streamed answer; asked again unstreamed it states the window, which is learned,
    and the turn is answered after one recovery compaction."""
    write_soba_json(nb_dir, llm_server.url, {"model": {"name": "team-smol", "maxOutputTokens": 512}, "compaction": {"timeoutMs": 3000}})
    model = Gateway(llm_server)
    outputs = turns(ip, model, 6)
    overflowed = [out for out in outputs if "context overflow" in out]
    assert overflowed and "maximum context length is 2048 tokens" in overflowed[0]
    assert not any("failed" in out for out in outputs)
    assert learned(ip)[0] == (N_CTX, "overflow")
    answers = [e.content for e in agent(ip).transcript.path() if isinstance(e, MessageEntry) and e.role == "assistant"]
    assert "" not in answers  # no disguised overflow was kept as an empty answer
    assert all(text.startswith("Answer ") for text in answers[-3:])
    requests = [(r.get("stream"), r.operation) for r in llm_server.requests if r.operation == "inference"]
    assert (True, "inference") in requests and (False, "inference") in requests


def test_a_ceiling_below_an_explicit_window_is_said(ip, nb_dir, llm_server):
    """Ollama cutting prompts at num_ctx 3,000 under `contextWindow: 32000`: the window is lowered
    (the counts stopped growing), and the cell says the explicit figure was not kept."""
    write_soba_json(
        nb_dir,
        llm_server.url,
        {"model": {"contextWindow": 32000, "maxOutputTokens": 500}, "compaction": {"keepRecentTokens": 1000, "safetyReserveTokens": 500}},
    )
    ip.run_line_magic("auto_compact", "off")
    model = DisagreeingModel(llm_server, window=3000, kind="ollama")
    outputs = []
    for index in range(20):
        model.script(text(f"Answer {index}. {LONG_ANSWER}"))
        with capture_output() as out:
            ip.run_line_magic("soba", f"question {index}")
        outputs.append(out.stdout)
        if "cut the prompt silently" in out.stdout:
            break
    assert "cut the prompt silently" in outputs[-1]
    assert "model.contextWindow 32,000 (from soba.json) is more than the server takes" in outputs[-1]
    assert learned(ip) == [(3000, "truncation")]


@pytest.mark.parametrize("window", [1300, 1700, 2400], ids=["hard limit 400", "hard limit 800", "hard limit 1,500"])
def test_no_window_however_small_ends_in_a_traceback(ip, nb_dir, llm_server, window):
    """An overflow teaches a window where, with the output and reserve the user set, the hard
    limit cannot hold the summary instructions (about 500 tokens), or not the system prompt and
    tools: each turn is answered or ends in the `request not sent` line, never a traceback."""
    write_soba_json(
        nb_dir,
        llm_server.url,
        {"model": {"name": "team-smol", "maxOutputTokens": 800}, "compaction": {"safetyReserveTokens": 100, "timeoutMs": 3000}},
    )
    model = DisagreeingModel(llm_server, window=window, kind="openai")
    outputs = turns(ip, model, 5)
    assert not any("Traceback" in out or "PromptBudgetTooSmall" in out for out in outputs)
    for out in outputs:
        assert "completed" in out or "request not sent" in out, out[-600:]
    assert agent(ip).limits.context_window == window
    refused = [out for out in outputs if "request not sent" in out]
    # Each refusal says what fits: nothing beside the system prompt and tools, or how much.
    if agent(ip).limits.hard_limit <= agent(ip).compactor.tracker.fixed:
        assert refused and "Nothing fits: the system prompt and tools alone take" in refused[-1]
    for out in refused:
        assert "Nothing fits" in out or "tokens of conversation fit beside the system prompt and tools" in out
