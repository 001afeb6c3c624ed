"""Gateways work (SPEC §13 "Gateways are servers too"), against a real LiteLLM proxy in front of
a real llama.cpp server with a 2,048-token window.

Found through the LiteLLM proxy (1.108) in front of llama-cpp-python's server (`n_ctx 2048`),
soba.json naming the gateway's alias `team-smol`: turn 1 answered, then the cell warned "the
server counted 502 input tokens where about 1,440 were sent: it cut the prompt silently", the
window dropped to 502 (hard limit 346), and turns 2–5 ended in a traceback escaping `%soba`
(`PromptBudgetTooSmall`); `contextWindow: 2048` changed nothing. Three causes: llama.cpp sends
no usage in streams, so LiteLLM makes up its own count (its own tokenizer, and like the server
without the tool schemas the model's chat template does not render: a third of our count), and
one such figure was read as a cut prompt; a window too small for the summary prompt raised; and
an oversized streamed request through LiteLLM comes back as HTTP 200 with one empty
`finish_reason: stop` chunk, while the same request unstreamed gets the 400 that states
"maximum context length is 2048 tokens".

Both servers are started here from their PyPI packages (`.ci/run` installs the `llama` and
`gateway` extras; without them the tests skip, saying so), on 127.0.0.1, and stopped after.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path

import pytest
from gateway_server import litellm_proxy, litellm_version, require_litellm
from IPython.utils.capture import capture_output
from llama_server import MODEL_ALIAS, llama_cpp_server, require_llama_cpp

from soba_nb.config import ModelSettings
from soba_nb.providers.base import ChatMessage, ModelRequest
from soba_nb.providers.discovery import discover_window
from soba_nb.providers.errors import ContextOverflowError
from soba_nb.providers.openai import OpenAIProvider
from soba_nb.transcript.entries import MessageEntry, UsageEntry, WindowEntry

N_CTX = 2048
ALIAS = "team-smol"
KNOWN_ALIAS = "team-smol-known"
"""An alias the admin gave a `max_input_tokens` (`model_info`): the gateway can say its window."""
KEY_ENV = "TEAM_GATEWAY_KEY"
MAX_OUTPUT_TOKENS = 256
"""Set by the admin beside the alias (a 135M model rambles on to the window otherwise)."""
SUMMARY_TIMEOUT_MS = 4000
"""The 135M model's summaries are rejected anyway (the deterministic capsule is used): not
worth 15 s of a 2-core machine each."""
TURNS_TIMEOUT_S = 900
"""Five turns of a 135M model on 2 cores take 2–3 minutes; a machine busy with other work,
more (pytest's default limit is 300 s)."""
TOPICS = (
    "describe the columns a sales dataframe usually has",
    "clean missing values, with code",
    "plot revenue by month, explaining each line",
    "find outliers with two methods",
)


def long_prompt(topic: str) -> str:
    """About 250 tokens: with the answers, the conversation passes the 2,048-token window by
    the fifth turn (the server counts no tool schemas: its chat template renders none)."""
    return f"Please {topic}. " + f"Be thorough about how to {topic}, step by step. " * 12


PROMPTS = (*(long_prompt(topic) for topic in TOPICS), "Summarise what we discussed in one line.")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """(gateway URL, its key): LiteLLM in front of llama.cpp, both started here, stopped after."""
    require_llama_cpp()
    require_litellm()
    folder: Path = tmp_path_factory.mktemp("gateway")
    key = "sk-team-" + secrets.token_hex(16)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(KEY_ENV, key)
        with llama_cpp_server(N_CTX, folder / "llama.log") as upstream:
            routes = {ALIAS: (upstream, MODEL_ALIAS), KNOWN_ALIAS: (upstream, f"{MODEL_ALIAS}-known")}
            with litellm_proxy(routes, folder, key_env=KEY_ENV, windows={KNOWN_ALIAS: N_CTX}) as url:
                yield url, key, folder


def soba_json(folder: Path, url: str, **model: object) -> None:
    """What an admin writes for a team: the gateway, the alias, the variable holding the key."""
    config = {
        "model": {
            "provider": "openai", "name": ALIAS, "baseUrl": url, "apiKeyEnv": KEY_ENV,
            "maxOutputTokens": MAX_OUTPUT_TOKENS, **model,
        },
        "compaction": {"timeoutMs": SUMMARY_TIMEOUT_MS},
    }
    (folder / "soba.json").write_text(json.dumps(config), encoding="utf-8")


def run(ip, prompt: str) -> str:
    with capture_output() as out:
        ip.run_line_magic("soba", prompt)
    return out.stdout + out.stderr


STATUS = re.compile(r"^(completed|failed|cancelled|step_limit)\b", re.MULTILINE)


def status(output: str) -> str:
    """How the turn ended, from its status line (an answer may say "failed" in its own words)."""
    found = STATUS.findall(output)
    return "traceback" if "Traceback" in output else found[-1] if found else "no status"


def files_holding(folder: Path, secret: str) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file() and secret.encode() in path.read_bytes()]


def five_turns(ip, nb_dir: Path, gateway, figures, name: str) -> list[str]:
    """The five turns through the gateway, their figures, and what every run must show."""
    url, key, folder = gateway
    started = time.monotonic()
    outputs = [run(ip, prompt) for prompt in PROMPTS]
    agent = ip.magics_manager.registry["SobaMagics"].agent
    limits = agent.limits
    entries = agent.transcript.entries
    failed = [out for out in outputs if status(out) != "completed"]
    usages = [e for e in entries if isinstance(e, UsageEntry) and e.operation == "inference" and e.sent_tokens]
    counts = ", ".join(f"{u.input_tokens:,}/{u.sent_tokens:,}" for u in usages[:4])
    figures.add(
        name,
        f"LiteLLM {litellm_version()} → llama.cpp n_ctx {N_CTX:,} · {len(outputs)} turns, {len(failed)} failed · "
        f"window {limits.context_window:,} ({limits.window_source.split(' (')[0]}) · hard limit {limits.hard_limit:,} · "
        f"overflows {sum('context overflow' in out for out in outputs)} · compactions "
        f"{sum('Compacted' in out for out in outputs)} · gateway's count / ours {counts} · "
        f"{time.monotonic() - started:.0f} s",
    )
    assert failed == [], failed[0][-800:]
    assert limits.hard_limit + limits.max_output_tokens <= N_CTX  # within the real window
    assert not [e for e in entries if isinstance(e, WindowEntry) and e.source == "truncation"]
    answers = [e for e in agent.transcript.path() if isinstance(e, MessageEntry) and e.role == "assistant"]
    assert len(answers) >= len(PROMPTS)
    assert files_holding(nb_dir.parent, key) == []  # the notebook folder, the home folder
    assert files_holding(folder, key) == []  # the gateway's config names the variable only
    return outputs


@pytest.mark.timeout(TURNS_TIMEOUT_S)
def test_five_turns_through_the_gateway_without_a_context_window(ip, nb_dir, gateway, figures):
    soba_json(nb_dir, gateway[0])
    outputs = five_turns(ip, nb_dir, gateway, figures, "gateway")
    limits = ip.magics_manager.registry["SobaMagics"].agent.limits
    assert (limits.context_window, limits.window_source.split(" (")[0]) == (N_CTX, "overflow error")
    # The overflow streamed back as an empty answer; asked again unstreamed, it said its words.
    overflowed = [out for out in outputs if "context overflow" in out]
    assert overflowed and "maximum context length is 2048 tokens" in overflowed[0]


@pytest.mark.timeout(TURNS_TIMEOUT_S)
def test_five_turns_through_the_gateway_with_the_context_window_set(ip, nb_dir, gateway, figures):
    soba_json(nb_dir, gateway[0], contextWindow=N_CTX)
    outputs = five_turns(ip, nb_dir, gateway, figures, "gateway (contextWindow set)")
    limits = ip.magics_manager.registry["SobaMagics"].agent.limits
    assert (limits.context_window, limits.window_source) == (N_CTX, "model.contextWindow from soba.json")
    assert not any("cut the prompt" in out or "is more than the server takes" in out for out in outputs)


def test_an_overflow_the_gateway_streams_as_an_empty_answer_shows_its_words(gateway, monkeypatch):
    url, key, _ = gateway
    monkeypatch.setenv(KEY_ENV, key)
    provider = OpenAIProvider(ModelSettings(provider="openai", name=ALIAS, base_url=url, api_key_env=KEY_ENV))
    request = ModelRequest(
        system="You are terse.",
        messages=[ChatMessage(role="user", content="Count the words. " + "word " * 3000)],
        max_output_tokens=32,
        operation_id="op_gateway",
    )
    with provider, pytest.raises(ContextOverflowError) as raised:
        provider.complete(request, timeout_s=60)
    assert raised.value.limit == N_CTX
    assert "maximum context length is 2048" in str(raised.value)
    assert key not in str(raised.value)


def test_the_gateway_says_the_window_of_a_model_it_knows(gateway):
    url, key, _ = gateway
    known = discover_window(url, KNOWN_ALIAS, api_key=key)
    assert known is not None and known.context_window == N_CTX
    assert "LiteLLM" in known.source and "max_input_tokens" in known.source
    assert discover_window(url, ALIAS, api_key=key) is None  # it does not know the model: it says nothing
