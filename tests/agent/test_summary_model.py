"""A summary model of its own (`compaction.model`, SPEC §14), through the magics of a real
InteractiveShell against two loopback servers — one for the main model, one for the summary
model: the summary request goes to the summary server (its model name, its own key from its
own `apiKeyEnv`, `max_tokens` within its `maxOutputTokens`, a prompt fitted to its smaller
window) and every turn to the main server; the main provider's native compaction is not asked;
the summary's cost is counted as compaction at the summary model's prices; `soba-nb doctor`
lists it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
from compaction_support import good_summary
from conftest import SMALL_LIMITS, TEST_KEY_VALUE, write_soba_json
from llm_server import LLMServer, RecordedRequest, text

from soba_nb.agent.cost import CostLedger
from soba_nb.catalogue import PRICES_TAKEN
from soba_nb.cli import main
from soba_nb.config import SobaConfig, build_config
from soba_nb.paths import shown
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import CapsuleEntry, ConfigEntry, UsageEntry
from soba_nb.transcript.store import Transcript

SUMMARY_KEY_ENV = "SOBA_NB_SUMMARY_KEY"
SUMMARY_KEY_VALUE = "sk-summary-OnlyForTheSummaryModel42"
SUMMARY_WINDOW = 2400
SUMMARY_MAX_OUTPUT = 300
SUMMARY_INPUT = SUMMARY_WINDOW - SUMMARY_MAX_OUTPUT - SMALL_LIMITS["compaction"]["safetyReserveTokens"]
"""1,600 tokens for a summary request: far less than the main model's hardLimit of 5,000."""
MAIN_PRICING = {"inputPerMTok": 2.5, "outputPerMTok": 10.0}
SUMMARY_PRICING = {"inputPerMTok": 1.0, "outputPerMTok": 2.0}


@pytest.fixture
def summary_server() -> Iterator[LLMServer]:
    with LLMServer(default_reply=text(good_summary(), input_tokens=1500, output_tokens=250)) as server:
        yield server


def configure(nb_dir: Path, main_url: str, summary_url: str, *, api: str = "chat", **summary: Any) -> Path:
    """Main model gpt-4o at `main_url` (the small test limits), summaries by gpt-4o-mini at
    `summary_url` with its own key variable, window and prices."""
    own = {
        "name": "gpt-4o-mini",
        "baseUrl": summary_url,
        "apiKeyEnv": SUMMARY_KEY_ENV,
        "contextWindow": SUMMARY_WINDOW,
        "maxOutputTokens": SUMMARY_MAX_OUTPUT,
        "pricing": SUMMARY_PRICING,
        **summary,
    }
    layer = {
        "model": {**SMALL_LIMITS["model"], "api": api, "pricing": MAIN_PRICING},
        "compaction": {**SMALL_LIMITS["compaction"], "model": own},
    }
    return write_soba_json(nb_dir, main_url, layer)


def agent(ip: Any) -> Any:
    return ip.magics_manager.registry["SobaMagics"].agent


def model_requests(server: LLMServer) -> list[RecordedRequest]:
    """Requests to the model (not the window discovery's)."""
    return [r for r in server.requests if r.operation]


def some_turns(ip: Any, scripted: Any, count: int = 8) -> None:
    ip.run_line_magic("auto_compact", "off")  # the test decides when to compact
    for index in range(count):
        scripted.script(text(f"Answer {index}. " + "The data has many columns worth describing. " * 45))
        ip.run_line_magic("soba", f"question {index}: describe the data")


def prompt_tokens(request: RecordedRequest) -> int:
    """The summary request's system and user text, counted as the session counts them."""
    counter = TokenCounter.for_model("openai", "gpt-4o")
    return sum(counter.count_text(message["content"]) for message in request["messages"])


def test_the_summary_goes_to_the_summary_model_with_its_key_its_name_and_its_window(
    ip, nb_dir, scripted, summary_server, monkeypatch
):
    monkeypatch.setenv(SUMMARY_KEY_ENV, SUMMARY_KEY_VALUE)
    configure(nb_dir, scripted.server.url, summary_server.url)
    some_turns(ip, scripted)
    ip.run_line_magic("compact", "")

    [summary] = model_requests(summary_server)
    assert summary.operation == "compaction"
    assert summary["model"] == "gpt-4o-mini"
    assert summary.headers["authorization"] == f"Bearer {SUMMARY_KEY_VALUE}"  # its own key, not the main one
    assert summary.get("max_tokens", summary.get("max_completion_tokens")) == SUMMARY_MAX_OUTPUT
    session_history = sum(len(r["messages"]) for r in scripted.inference_requests()[-1:])
    assert session_history > 10  # a long session: the main model's window held much more
    assert prompt_tokens(summary) <= SUMMARY_INPUT  # fitted to the summary model's own window

    turns = model_requests(scripted.server)
    assert turns and all(r.operation == "inference" for r in turns)  # no summary asked of the main model
    assert all(r["model"] == "gpt-4o" and r.headers["authorization"] == f"Bearer {TEST_KEY_VALUE}" for r in turns)

    [capsule] = [e for e in Transcript.load(agent(ip).file).entries if isinstance(e, CapsuleEntry)]
    assert capsule.quality == "full" and capsule.model == "gpt-4o-mini"

    # The next turn goes to the main model, carrying the capsule the summary model wrote.
    scripted.script(text("Carrying on."))
    ip.run_line_magic("soba", "and now?")
    after = model_requests(scripted.server)[-1]
    assert after.operation == "inference" and after["model"] == "gpt-4o"
    assert "loaded data.csv" in json.dumps(after["messages"])
    assert len(model_requests(summary_server)) == 1


def test_the_main_providers_native_compaction_is_not_asked(ip, nb_dir, scripted, summary_server, monkeypatch):
    monkeypatch.setenv(SUMMARY_KEY_ENV, SUMMARY_KEY_VALUE)
    configure(nb_dir, scripted.server.url, summary_server.url, api="responses")  # Responses compacts natively
    some_turns(ip, scripted)
    ip.run_line_magic("compact", "")

    assert not [r for r in scripted.server.requests if r.path.endswith("/compact")]
    assert all(r.operation == "inference" for r in model_requests(scripted.server))
    [summary] = model_requests(summary_server)
    assert summary.operation == "compaction" and summary["model"] == "gpt-4o-mini"
    [capsule] = [e for e in Transcript.load(agent(ip).file).entries if isinstance(e, CapsuleEntry)]
    assert capsule.native is None and capsule.quality == "full"


def test_the_summary_is_counted_as_compaction_at_the_summary_models_prices(
    ip, nb_dir, scripted, summary_server, monkeypatch, capsys
):
    monkeypatch.setenv(SUMMARY_KEY_ENV, SUMMARY_KEY_VALUE)
    soba_json = configure(nb_dir, scripted.server.url, summary_server.url)
    some_turns(ip, scripted)
    ip.run_line_magic("compact", "")

    entries = Transcript.load(agent(ip).file).entries
    [spent] = [e for e in entries if isinstance(e, UsageEntry) and e.operation == "compaction"]
    assert (spent.input_tokens, spent.output_tokens, spent.model) == (1500, 250, "gpt-4o-mini")
    inference = sum(
        (Decimal(e.input_tokens) * Decimal("2.5") + Decimal(e.output_tokens) * 10
         for e in entries if isinstance(e, UsageEntry) and e.operation == "inference"),
        Decimal(0),
    ) / 1_000_000  # fmt: skip
    # 1500 × 1.0 + 250 × 2.0 = 2,000 → $0.0020 (at the main model's prices it would be $0.0063)
    total = (inference + Decimal("0.002")).quantize(Decimal("0.0001"), ROUND_HALF_UP)  # as the cell shows it
    capsys.readouterr()
    ip.run_line_magic("budget", "")
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Cost: ")]
    where = shown(soba_json)
    assert line == (
        f"Cost: ${total} this session (inference ${inference.quantize(Decimal('0.0001'), ROUND_HALF_UP)} · compaction $0.0020) · "
        f"prices: model.pricing ({where}) · summaries by gpt-4o-mini: compaction.model.pricing ({where})"
    )


def test_a_cap_checks_a_summary_at_the_summary_models_prices(ip, nb_dir, scripted, summary_server, monkeypatch, capsys):
    monkeypatch.setenv(SUMMARY_KEY_ENV, SUMMARY_KEY_VALUE)
    soba_json = configure(nb_dir, scripted.server.url, summary_server.url, pricing=None)  # a server of ours: no price
    config = json.loads(soba_json.read_text())
    config["agent"] = {"maxSessionCostUsd": 5.0}
    soba_json.write_text(json.dumps(config))
    some_turns(ip, scripted, count=6)
    capsys.readouterr()
    ip.run_line_magic("compact", "")

    assert model_requests(summary_server) == []  # not sent: what it costs cannot be known
    [capsule] = [e for e in Transcript.load(agent(ip).file).entries if isinstance(e, CapsuleEntry)]
    assert capsule.quality == "degraded"
    reason = agent(ip).compactor.last_result.reason
    assert reason.startswith("fallback: the model summary was not asked (request not sent: agent.maxSessionCostUsd")
    assert "openai/gpt-4o-mini has no prices" in reason and "set compaction.model.pricing" in reason


def test_a_summary_model_without_pricing_is_priced_from_the_catalogue_by_its_own_name():
    config = build_config([("soba.json", {"model": {"name": "gpt-4o"}, "compaction": {"model": {"name": "gpt-4o-mini"}}})])
    ledger = CostLedger()
    ledger.add([
        ConfigEntry(config=config.to_json(), explicit=config.explicit_keys),
        UsageEntry(input_tokens=1_000_000, output_tokens=0, operation="inference"),
        UsageEntry(input_tokens=1_000_000, output_tokens=1_000_000, operation="compaction"),
    ])  # fmt: skip
    cost = ledger.cost(config)
    assert cost.inference == Decimal("2.50")  # GPT-4o's list price
    assert cost.compaction == Decimal("0.75")  # GPT-4o mini's: 0.15 + 0.60, not GPT-4o's 12.50
    assert cost.line().endswith(f"· summaries by gpt-4o-mini: catalogue, GPT-4o mini list price as of {PRICES_TAKEN}")
    assert SobaConfig().summary_model is None and "summaries" not in CostLedger().cost(SobaConfig()).line()


def test_doctor_lists_the_summary_model(nb_dir, scripted, summary_server, capsys, monkeypatch):
    monkeypatch.delenv(SUMMARY_KEY_ENV, raising=False)
    configure(nb_dir, scripted.server.url, summary_server.url)
    capsys.readouterr()
    assert main(["doctor", str(nb_dir)]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("summaries")]
    assert line == (
        "summaries  gpt-4o-mini (openai, compaction.model) · window 2,400 · maxOutputTokens 300 · a summary request "
        f"up to {SUMMARY_INPUT:,} tokens · baseUrl {summary_server.url} · api key {SUMMARY_KEY_ENV} NOT set · "
        f"prices: compaction.model.pricing ({shown(nb_dir / 'soba.json')}) · native compaction not asked"
    )
    assert SUMMARY_KEY_VALUE not in line

    write_soba_json(nb_dir, scripted.server.url)
    assert main(["doctor", str(nb_dir)]) == 0
    assert "summaries  by the model (compaction.model is null)" in capsys.readouterr().out.splitlines()


def test_the_main_key_is_never_sent_to_the_summary_model(ip, nb_dir, scripted, summary_server, monkeypatch):
    """Its key comes from its own apiKeyEnv only: with that variable unset, the request to a
    server on this machine (which may need no key) carries none — not the main model's."""
    monkeypatch.delenv(SUMMARY_KEY_ENV, raising=False)
    configure(nb_dir, scripted.server.url, summary_server.url)
    some_turns(ip, scripted, count=6)
    ip.run_line_magic("compact", "")
    [summary] = model_requests(summary_server)
    assert "authorization" not in summary.headers
    assert TEST_KEY_VALUE not in json.dumps(summary.headers) + summary.raw.decode()
    assert all(r.headers["authorization"] == f"Bearer {TEST_KEY_VALUE}" for r in model_requests(scripted.server))


def test_a_summary_model_set_during_a_session_writes_the_next_summary(ip, nb_dir, scripted, summary_server, monkeypatch):
    """soba.json is read again at each magic: `compaction.model` added to it rebinds the
    session's models (the turns' provider stays), and removed, the main model summarizes again."""
    monkeypatch.setenv(SUMMARY_KEY_ENV, SUMMARY_KEY_VALUE)
    some_turns(ip, scripted, count=4)  # the main model alone
    configure(nb_dir, scripted.server.url, summary_server.url)
    some_turns(ip, scripted, count=4)
    ip.run_line_magic("compact", "")
    assert [r.operation for r in model_requests(summary_server)] == ["compaction"]
    assert all(r.operation == "inference" for r in model_requests(scripted.server))

    write_soba_json(nb_dir, scripted.server.url)  # compaction.model removed
    some_turns(ip, scripted, count=8)
    ip.run_line_magic("compact", "")
    assert len(model_requests(summary_server)) == 1
    assert [r for r in model_requests(scripted.server) if r.operation == "compaction"]
