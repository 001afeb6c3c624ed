"""What a session costs (SPEC §11), through the magics of a real InteractiveShell against the
loopback server: every `usage` entry priced from the server's own figures in each wire format
(Chat Completions, Anthropic Messages, Responses), cached input at its own price; compaction
requests recorded as `usage` entries with their `operationId` and priced apart, never taken
as the budget's figure; `%budget` and `soba-nb budget` saying the same line, after a restart
too; and `agent.maxSessionCostUsd` refusing a request before it leaves (the server's log
proves nothing was sent), inference and compaction alike."""

from __future__ import annotations

import json
from decimal import ROUND_UP, Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
from compaction_support import good_summary
from conftest import SMALL_LIMITS, TEST_KEY_ENV, new_shell, shut_down
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_server import text

from soba_nb.agent.cost import CostLedger, prices_for
from soba_nb.agent.measure import measure_recorded
from soba_nb.catalogue import PRICES_TAKEN
from soba_nb.cli import main
from soba_nb.config import ModelSettings, PricingSettings, SobaConfig, recorded_config
from soba_nb.paths import shown
from soba_nb.providers.anthropic import usage_from_wire as anthropic_usage
from soba_nb.providers.openai import usage_from_wire as openai_usage
from soba_nb.providers.responses import usage_from_wire as responses_usage
from soba_nb.transcript.entries import (
    CapsuleEntry,
    ConfigEntry,
    MessageEntry,
    SessionEntry,
    UsageEntry,
)
from soba_nb.transcript.store import Transcript

PRICING = {"inputPerMTok": 2.5, "outputPerMTok": 10.0, "cachedInputPerMTok": 1.25}
FORMATS = {
    "chat": {"provider": "openai", "name": "gpt-4o"},
    "responses": {"provider": "openai", "api": "responses", "name": "gpt-4o"},
    "anthropic": {"provider": "anthropic", "name": "claude-sonnet-4-5"},
}
"""The three wire formats the loopback server speaks."""
MILLION = Decimal(1_000_000)


def model_requests(server: Any) -> list[Any]:
    """Requests to the model (inference and compaction), not the window discovery's."""
    return [r for r in server.requests if r.operation]


def configure(
    nb_dir: Path,
    server: Any,
    *,
    wire: str = "chat",
    pricing: dict[str, float] | None = PRICING,
    cap: float | None = None,
    small: bool = False,
) -> Path:
    """`soba.json` for the loopback server in one wire format, with prices and a cap."""
    limits = SMALL_LIMITS if small else {}
    model = {
        **FORMATS[wire],
        "baseUrl": server.anthropic_url if wire == "anthropic" else server.url,
        "apiKeyEnv": TEST_KEY_ENV,
        **limits.get("model", {}),
    }
    if pricing is not None:
        model["pricing"] = pricing
    config: dict[str, Any] = {"model": model, "compaction": dict(limits.get("compaction", {}))}
    if cap is not None:
        config["agent"] = {"maxSessionCostUsd": cap}
    path = nb_dir / "soba.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def agent(ip: Any) -> Any:
    return ip.magics_manager.registry["SobaMagics"].agent


def usages(ip: Any) -> list[UsageEntry]:
    return [e for e in Transcript.load(agent(ip).file).entries if isinstance(e, UsageEntry)]


def budget(ip: Any, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    ip.run_line_magic("budget", "")
    return capsys.readouterr().out


def cost_line(out: str) -> str:
    [line] = [line for line in out.splitlines() if line.startswith("Cost: ")]
    return line


def price(entry: UsageEntry, prices: dict[str, float] = PRICING) -> Decimal:
    """SPEC §11's formula, by hand: the uncached input, the cached input, the output."""
    cached = entry.cached_input_tokens if isinstance(entry.cached_input_tokens, int) else 0
    rates = {key: Decimal(str(value)) for key, value in prices.items()}
    cached_rate = rates.get("cachedInputPerMTok", rates["inputPerMTok"])
    return ((entry.input_tokens - cached) * rates["inputPerMTok"] + cached * cached_rate
            + entry.output_tokens * rates["outputPerMTok"]) / MILLION  # fmt: skip


def dollars(amount: Decimal) -> str:
    return f"${amount.quantize(Decimal('0.0001'))}"


def some_turns(ip: Any, scripted: Any, count: int = 6) -> None:
    ip.run_line_magic("auto_compact", "off")  # the test decides when to compact
    for index in range(count):
        scripted.script(text(f"Answer {index}. " + "The data has many columns worth describing. " * 45))
        ip.run_line_magic("soba", f"question {index}: describe the data")


# -- pricing each request ------------------------------------------------------------------


@pytest.mark.parametrize("wire", sorted(FORMATS))
def test_each_wire_format_is_priced_from_the_servers_figures_cached_input_apart(ip, nb_dir, scripted, capsys, wire):
    soba_json = configure(nb_dir, scripted.server, wire=wire)
    scripted.script(text("The answer.", input_tokens=4000, output_tokens=400, cached_input_tokens=1600))
    ip.run_line_magic("soba", "describe the data")

    [usage] = usages(ip)
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (4000, 1600, 400)
    assert usage.operation == "inference"
    assert usage.operation_id == scripted.inference_requests()[0].operation_id
    # (4000 - 1600) × 2.5 + 1600 × 1.25 + 400 × 10 = 12,000 → $0.0120
    assert cost_line(budget(ip, capsys)) == (
        f"Cost: $0.0120 this session (inference $0.0120 · compaction $0.0000) · prices: model.pricing ({shown(soba_json)})"
    )
    raw = [json.loads(line) for line in agent(ip).file.read_text().splitlines()]
    [on_disk] = [line for line in raw if line["type"] == "usage"]
    assert on_disk["cachedInputTokens"] == 1600 and on_disk["operation"] == "inference"


def test_a_server_that_reports_no_cache_prices_all_input_as_input(ip, nb_dir, scripted, capsys):
    configure(nb_dir, scripted.server, pricing={"inputPerMTok": 3, "outputPerMTok": 15})
    scripted.script(text("One.", input_tokens=3000, output_tokens=200), text("Two.", input_tokens=3500, output_tokens=100))
    ip.run_line_magic("soba", "first")
    ip.run_line_magic("soba", "second")
    usage_lines = [line for line in agent(ip).file.read_text().splitlines() if '"type":"usage"' in line]
    assert len(usage_lines) == 2 and not any("cachedInputTokens" in line for line in usage_lines)  # absent: not said
    # 3000 × 3 + 200 × 15 + 3500 × 3 + 100 × 15 = 24,000 → $0.0240
    assert "Cost: $0.0240 this session (inference $0.0240 · compaction $0.0000)" in budget(ip, capsys)


def test_a_gateway_model_without_prices_is_not_priced(ip, nb_dir, scripted, capsys):
    configure(nb_dir, scripted.server, pricing=None)  # gpt-4o, but at a server that is not OpenAI's
    scripted.script(text("Hi.", input_tokens=2000, output_tokens=50))
    ip.run_line_magic("soba", "hello")
    assert cost_line(budget(ip, capsys)) == "Cost: not priced"
    assert len(usages(ip)) == 1  # recorded all the same: priced once model.pricing says so

    capsys.readouterr()
    assert main(["budget", str(agent(ip).file)]) == 0
    assert cost_line(capsys.readouterr().out) == "Cost: not priced"

    configure(nb_dir, scripted.server)  # 2000 × 2.5 + 50 × 10 = 5,500 → $0.0055
    assert cost_line(budget(ip, capsys)).startswith("Cost: $0.0055 this session (inference $0.0055 ·")


@pytest.mark.parametrize(
    ("parse", "usage", "expected"),
    [
        (openai_usage, {"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 40}},
         (100, 40, 5)),
        (openai_usage, {"prompt_tokens": 100, "completion_tokens": 5}, (100, None, 5)),
        (openai_usage, {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 400}}, (100, None, 0)),
        (openai_usage, {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": True}}, (100, None, 0)),
        (openai_usage, {"prompt_tokens": 100, "prompt_tokens_details": [7]}, (100, None, 0)),
        (responses_usage, {"input_tokens": 90, "output_tokens": 9, "input_tokens_details": {"cached_tokens": 30}},
         (90, 30, 9)),
        (responses_usage, {"input_tokens": 90, "input_tokens_details": {"cached_tokens": -1}}, (90, None, 0)),
        (anthropic_usage, {"input_tokens": 60, "cache_creation_input_tokens": 10, "cache_read_input_tokens": 40,
                           "output_tokens": 5}, (110, 40, 5)),
        (anthropic_usage, {"input_tokens": 60, "output_tokens": 5}, (60, None, 5)),
    ],
)  # fmt: skip
def test_cached_input_is_read_from_each_wire_format_and_a_figure_that_cannot_be_is_ignored(parse, usage, expected):
    parsed = parse(usage)
    assert (parsed.input_tokens, parsed.cached_input_tokens, parsed.output_tokens) == expected


def test_prices_come_from_model_pricing_else_the_catalogue_at_the_vendors_own_api():
    gpt = prices_for(ModelSettings(name="gpt-4o-2024-08-06"))
    assert gpt is not None and (gpt.input, gpt.cached_input, gpt.output) == (Decimal("2.50"), Decimal("1.25"), Decimal("10.00"))
    assert gpt.source == f"catalogue, GPT-4o list price as of {PRICES_TAKEN}"
    official = prices_for(ModelSettings(name="gpt-4o", base_url="https://api.openai.com/v1"))
    assert official is not None and official.input == Decimal("2.50")
    claude = prices_for(ModelSettings(provider="anthropic", name="claude-sonnet-4-5-20250929", api_key_env="K"))
    assert claude is not None and (claude.input, claude.cached_input, claude.output) == (Decimal(3), Decimal("0.3"), Decimal(15))

    overridden = ModelSettings(name="gpt-4o", pricing=PricingSettings(input_per_m_tok=1.1, output_per_m_tok=4.4))
    mine = prices_for(overridden, "soba.json")
    assert mine is not None and (mine.input, mine.cached_input, mine.output) == (Decimal("1.1"), Decimal("1.1"), Decimal("4.4"))
    assert mine.source == "model.pricing (soba.json)"

    assert prices_for(ModelSettings(name="gpt-4o", base_url="https://openrouter.ai/api/v1")) is None  # a gateway
    assert prices_for(ModelSettings(name="llama3:8b", base_url="http://localhost:11434/v1")) is None
    assert prices_for(ModelSettings(name="gpt-5.5")) is None  # a version the catalogue does not name
    assert prices_for(ModelSettings(name="claude-sonnet-4-5")) is None  # Claude is not billed at OpenAI's API
    free = prices_for(ModelSettings(provider="local", name="SmolLM2-135M-Instruct", api_key_env=""))
    assert free is not None and free.cost(10**6, 0, 10**6) == 0 and free.source == "embedded model, free"


def test_the_arithmetic_is_decimal():
    prices = prices_for(ModelSettings(name="x", pricing=PricingSettings(input_per_m_tok=0.1, output_per_m_tok=0.2)))
    assert prices is not None
    # 0.1 and 0.2 as binary floats would make 0.30000000000000004 here.
    assert prices.cost(1_000_000, 0, 1_000_000) == Decimal("0.3")
    assert sum((prices.cost(1, 0, 0) for _ in range(10**4)), Decimal(0)) == Decimal("0.001")
    cached = prices_for(ModelSettings(name="x", pricing=PricingSettings(input_per_m_tok=2.5, output_per_m_tok=10,
                                                                        cached_input_per_m_tok=1.25)))  # fmt: skip
    assert cached is not None and cached.cost(4000, 1600, 400) == Decimal("0.012")


# -- compaction requests ---------------------------------------------------------------------


def test_a_compactions_usage_is_recorded_with_its_operation_id_and_priced_apart(ip, nb_dir, scripted, capsys):
    configure(nb_dir, scripted.server, small=True)
    some_turns(ip, scripted)
    scripted.summary = text(good_summary(), input_tokens=3000, output_tokens=500)
    ip.run_line_magic("compact", "")

    entries = Transcript.load(agent(ip).file).entries
    [capsule] = [e for e in entries if isinstance(e, CapsuleEntry)]
    assert capsule.quality == "full"  # the compaction completed: the usage did not make it stale
    [summary_request] = [r for r in scripted.server.requests if r.operation == "compaction"]
    [spent] = [e for e in entries if isinstance(e, UsageEntry) and e.operation == "compaction"]
    assert spent.operation_id == capsule.operation_id == summary_request.operation_id
    assert (spent.input_tokens, spent.output_tokens) == (3000, 500)
    assert entries.index(spent) > entries.index(capsule)  # recorded once the operation ended

    inference = sum((price(e) for e in entries if isinstance(e, UsageEntry) and e.operation == "inference"), Decimal(0))
    compaction = price(spent)  # 3000 × 2.5 + 500 × 10 = 12,500 → $0.0125
    assert compaction == Decimal("0.0125")
    assert cost_line(budget(ip, capsys)).startswith(
        f"Cost: {dollars(inference + compaction)} this session (inference {dollars(inference)} · compaction $0.0125)"
    )


def test_a_compactions_usage_never_measures_the_budget(ip, nb_dir, scripted, capsys):
    configure(nb_dir, scripted.server, small=True)
    some_turns(ip, scripted)
    # A summary prompt far larger than the path: taken as the path's figure, it would be seen.
    scripted.summary = text(good_summary(), input_tokens=4900, output_tokens=500)
    ip.run_line_magic("compact", "")
    session = agent(ip)
    effective = session.compactor.measure().effective

    # The same file without the compaction's usage entry, measured from scratch.
    lines = session.file.read_text().splitlines(keepends=True)
    without = [line for line in lines if '"operation":"compaction"' not in line]
    assert len(without) == len(lines) - 1
    copy = nb_dir / "copy.soba" / session.file.name
    copy.parent.mkdir()
    copy.write_text("".join(without), encoding="utf-8")
    _, alone = measure_recorded(Transcript.load(copy), session.config)
    assert effective == alone.effective < 4900
    assert f"Budget: {effective:,} / " in budget(ip, capsys)

    scripted.script(text("fine", input_tokens=1234))
    ip.run_line_magic("soba", "next")
    [last] = [e for e in usages(ip) if e.operation == "inference"][-1:]
    assert last.input_tokens == 1234 and session.compactor.measure().source == "provider_usage"


def test_a_native_compactions_usage_is_recorded_and_priced(ip, nb_dir, scripted, capsys):
    configure(nb_dir, scripted.server, wire="responses", small=True)
    some_turns(ip, scripted)
    ip.run_line_magic("compact", "")
    entries = Transcript.load(agent(ip).file).entries
    [capsule] = [e for e in entries if isinstance(e, CapsuleEntry)]
    assert capsule.continuation == "native"
    [native_request] = [r for r in scripted.server.requests if r.path == "/v1/responses/compact"]
    [spent] = [e for e in entries if isinstance(e, UsageEntry) and e.operation == "compaction"]
    assert spent.operation_id == capsule.operation_id == native_request.operation_id
    assert f"compaction {dollars(price(spent))})" in cost_line(budget(ip, capsys))


# -- the cap ---------------------------------------------------------------------------------


def test_the_cap_refuses_a_request_that_could_pass_it_and_sends_nothing(ip, nb_dir, scripted, capsys):
    soba_json = configure(nb_dir, scripted.server, cap=0.1)
    scripted.script(text("The answer.", input_tokens=4000, output_tokens=400, cached_input_tokens=1600))
    ip.run_line_magic("soba", "describe the data")  # $0.0120; the worst case was 0.0120 + 0.08 + input
    sent_before = len(model_requests(scripted.server))
    capsys.readouterr()

    ip.run_line_magic("soba", "and now plot it")
    out = capsys.readouterr()
    assert len(model_requests(scripted.server)) == sent_before  # the server's log: nothing was sent
    session = agent(ip)
    input_tokens = session.compactor.send_figure(session.compactor.model_input())
    reach = (Decimal("0.012") + input_tokens * Decimal("2.5") / MILLION + 8000 * Decimal(10) / MILLION)
    could_reach = f"${reach.quantize(Decimal('0.0001'), rounding=ROUND_UP)}"
    message = (
        f"request not sent: this session has cost $0.0120; the next request could reach {could_reach}, "
        f"over agent.maxSessionCostUsd $0.1000. To go on, raise agent.maxSessionCostUsd (in {shown(soba_json)}) "
        "and run the cell again"
    )
    assert message in out.out + out.err
    path = session.transcript.path()
    [last] = [e for e in path if isinstance(e, MessageEntry)][-1:]
    assert last.role == "user" and last.content == "and now plot it"  # no answer, no usage
    assert len(usages(ip)) == 1

    configure(nb_dir, scripted.server, cap=0.5)  # raised: the next turn goes
    ip.run_line_magic("soba", "and now plot it")
    assert len(model_requests(scripted.server)) == sent_before + 1


def test_a_cap_on_a_model_without_prices_sends_nothing(ip, nb_dir, scripted, capsys):
    configure(nb_dir, scripted.server, pricing=None, cap=5)
    capsys.readouterr()
    ip.run_line_magic("soba", "hello")
    out = capsys.readouterr()
    assert model_requests(scripted.server) == []
    assert (
        "request not sent: agent.maxSessionCostUsd is $5.0000, but openai/gpt-4o has no prices, so what a request "
        "costs cannot be known; set model.pricing (inputPerMTok, outputPerMTok) in soba.json"
    ) in out.out + out.err


def test_the_cap_keeps_a_summary_request_from_leaving_and_the_compaction_completes(ip, nb_dir, scripted, capsys):
    configure(nb_dir, scripted.server, small=True)
    some_turns(ip, scripted)
    so_far = agent(ip).cost().total
    configure(nb_dir, scripted.server, small=True, cap=float(so_far + Decimal("0.0001")))
    sent_before = len(model_requests(scripted.server))
    capsys.readouterr()

    ip.run_line_magic("compact", "")
    out = capsys.readouterr().out
    assert len(model_requests(scripted.server)) == sent_before  # no summary request left
    [capsule] = [e for e in agent(ip).transcript.path() if isinstance(e, CapsuleEntry)]
    assert capsule.quality == "degraded" and f"{capsule.checkpoint_id} · fallback" in out
    result = agent(ip).compactor.last_result
    assert result.reason.startswith("fallback: the model summary was not asked (request not sent: this session has cost")

    capsys.readouterr()
    ip.run_line_magic("soba", "next")  # the inference request is refused as well, and says why
    assert len(model_requests(scripted.server)) == sent_before
    out = capsys.readouterr()
    assert "request not sent: this session has cost" in out.out + out.err


# -- the same figure everywhere, after a restart too -----------------------------------------


def test_a_resumed_session_and_the_cli_show_the_same_cost(ip, nb_dir, scripted, capsys):
    configure(nb_dir, scripted.server, cap=2)
    scripted.script(text("One.", input_tokens=4000, output_tokens=400, cached_input_tokens=1600),
                    text("Two.", input_tokens=5000, output_tokens=100))  # fmt: skip
    ip.run_line_magic("soba", "first")
    ip.run_line_magic("soba", "second")
    before = cost_line(budget(ip, capsys))
    file = agent(ip).file
    assert before.startswith("Cost: $0.0255 this session (inference $0.0255 · compaction $0.0000)")
    assert before.endswith(" · cap $2.0000 (agent.maxSessionCostUsd)")

    shut_down(ip)  # a kernel restart: a new shell on the same transcript
    ip2 = new_shell(nb_dir)
    assert cost_line(budget(ip2, capsys)) == before
    assert agent(ip2).file == file

    capsys.readouterr()
    assert main(["budget", str(file)]) == 0
    assert cost_line(capsys.readouterr().out) == before
    assert main(["budget", str(file), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cost"]["totalUsd"] == "0.0255" and info["cost"]["inferenceUsd"] == "0.0255"
    assert info["cost"]["compactionUsd"] == "0" and info["maxSessionCostUsd"] == 2
    assert info["cost"]["line"] + " · cap $2.0000 (agent.maxSessionCostUsd)" == before


def test_each_request_keeps_the_prices_it_was_recorded_under(tmp_path):
    """A later price change does not rewrite what earlier requests cost; a request recorded
    without a price is priced once model.pricing prices the same model."""
    transcript = Transcript.open(tmp_path / "s.soba" / "s.jsonl", create_header=SessionEntry())
    unpriced = msgspec.convert({"model": {"name": "gpt-4o", "baseUrl": "http://gw.example/v1"}}, SobaConfig)
    priced = msgspec.convert(
        {"model": {"name": "gpt-4o", "baseUrl": "http://gw.example/v1", "pricing": {"inputPerMTok": 1, "outputPerMTok": 2}}},
        SobaConfig,
    )
    dearer = msgspec.convert(
        {"model": {"name": "gpt-4o", "baseUrl": "http://gw.example/v1", "pricing": {"inputPerMTok": 10, "outputPerMTok": 20}}},
        SobaConfig,
    )
    other = msgspec.convert({"model": {"name": "llama3", "baseUrl": "http://other.example/v1"}}, SobaConfig)
    for config in (unpriced, priced, dearer, other):
        transcript.append(ConfigEntry(config=config.to_json()))
        transcript.append(UsageEntry(input_tokens=1_000_000, output_tokens=0))
    transcript.append(UsageEntry(input_tokens=0, output_tokens=1_000_000, operation="compaction"))
    ledger = CostLedger()
    ledger.follow(transcript)
    now = ledger.cost(recorded_config(dearer.to_json(), {}, "test"))
    # unpriced then priced at today's $10; $1 as recorded; $10 as recorded; llama3 not priced
    assert (now.inference, now.compaction, now.unpriced_requests) == (Decimal(21), Decimal(0), 2)
    assert now.line() == (
        "Cost: $21.0000 this session (inference $21.0000 · compaction $0.0000) · prices: model.pricing · "
        "2 requests not priced"
    )
    ledger.follow(transcript)  # nothing new: nothing counted twice
    assert ledger.cost(dearer).inference == Decimal(21)


PRICE_CHOICES = [None, (2.5, 10.0, 1.25), (0.15, 0.6, None), (3.0, 15.0, 0.3), (1.1, 4.4, 0.275)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(range(len(PRICE_CHOICES))),
            st.tuples(
                st.integers(0, 2_000_000), st.one_of(st.none(), st.integers(-5, 2_000_000)), st.integers(0, 100_000),
                st.sampled_from(["inference", "compaction"]),
            ),
        ),
        max_size=40,
    )
)
def test_requests_priced_together_cost_what_each_costs_alone(steps: list[Any]) -> None:
    """The ledger sums tokens by the prices they were recorded with and prices each sum once:
    exactly what pricing every request alone and adding up gives (a cost is linear and exact
    in decimals), across price changes, unpriced stretches and odd cached figures."""
    ledger, expected = CostLedger(), {"inference": Decimal(0), "compaction": Decimal(0)}
    prices = None
    for step in steps:
        if isinstance(step, int):
            choice = PRICE_CHOICES[step]
            model: dict[str, Any] = {"name": "gpt-4o", "baseUrl": "http://gw.example/v1"}
            if choice is not None:
                model["pricing"] = {"inputPerMTok": choice[0], "outputPerMTok": choice[1]}
                if choice[2] is not None:
                    model["pricing"]["cachedInputPerMTok"] = choice[2]
            config = msgspec.convert({"model": model}, SobaConfig)
            ledger.add([ConfigEntry(config=config.to_json())])
            prices = prices_for(config.model)
            continue
        input_tokens, cached, output, operation = step
        entry = UsageEntry(input_tokens=input_tokens, cached_input_tokens=cached, output_tokens=output, operation=operation)
        ledger.add([entry])
        if prices is not None:
            expected[operation] += prices.cost(input_tokens, cached or 0, output)
    unpriced = msgspec.convert({"model": {"name": "llama3", "baseUrl": "http://other.example/v1"}}, SobaConfig)
    now = ledger.cost(unpriced)  # no prices now: only what was priced when recorded counts
    assert (now.inference, now.compaction) == (expected["inference"], expected["compaction"])
