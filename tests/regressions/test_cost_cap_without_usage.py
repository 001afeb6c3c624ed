"""Issue 40 item 3 (SPEC §16 "The cost cap holds without usage figures"): a server that ignores
`stream_options.include_usage` was sent 26 requests under a $0.09 cap, each with a worst case of
$0.083, and `%budget` said $0.0000. Now a request whose server sends no usage is priced from
soba's own counts of what was sent and received, marked estimated everywhere the cost is shown;
the cap stays fail-closed. Real shell, loopback server (its log says what was sent)."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from compaction_support import good_summary
from conftest import SMALL_LIMITS, TEST_KEY_ENV, new_shell, shut_down
from llm_server import text, tool_calls

from soba_nb.cli import main
from soba_nb.transcript.entries import CapsuleEntry, UsageEntry
from soba_nb.transcript.store import Transcript

PRICING = {"inputPerMTok": 2.5, "outputPerMTok": 10.0}
MILLION = Decimal(1_000_000)
ANSWER = "The data has many columns worth describing. " * 100
"""About 900 tokens: $0.009 of output a request at these prices."""


def configure(nb_dir: Path, server: Any, *, cap: float | None, small: bool = False, **compaction: Any) -> None:
    model: dict[str, Any] = {
        "provider": "openai", "name": "gpt-4o", "baseUrl": server.url, "apiKeyEnv": TEST_KEY_ENV,
        "pricing": PRICING, "maxOutputTokens": 2000,
    }  # fmt: skip
    config: dict[str, Any] = {"model": model, "compaction": dict(compaction)}
    if small:
        model.update(SMALL_LIMITS["model"])
        config["compaction"] = {**SMALL_LIMITS["compaction"], **compaction}
    if cap is not None:
        config["agent"] = {"maxSessionCostUsd": cap}
    (nb_dir / "soba.json").write_text(json.dumps(config), encoding="utf-8")


def agent(ip: Any) -> Any:
    return ip.magics_manager.registry["SobaMagics"].agent


def model_requests(server: Any) -> list[Any]:
    return [r for r in server.requests if r.operation]


def usages(ip: Any) -> list[UsageEntry]:
    return [e for e in Transcript.load(agent(ip).file).entries if isinstance(e, UsageEntry)]


def price(entry: UsageEntry) -> Decimal:
    return (entry.input_tokens * Decimal("2.5") + entry.output_tokens * Decimal(10)) / MILLION


def cost_line(ip: Any, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    ip.run_line_magic("budget", "")
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Cost: ")]
    return line


def test_a_server_that_sends_no_usage_is_stopped_by_the_cap(ip, nb_dir, scripted, capsys):
    configure(nb_dir, scripted.server, cap=0.09)
    refusal = ""
    for index in range(10):
        scripted.script(text(f"Answer {index}. {ANSWER}", usage=False))
        capsys.readouterr()
        ip.run_line_magic("soba", f"question {index}: describe the data")
        out = capsys.readouterr()
        if "request not sent" in out.out + out.err:
            refusal = next(line for line in (out.out + out.err).splitlines() if "request not sent" in line)
            break
    sent = model_requests(scripted.server)
    assert sent and all(r.body["stream_options"]["include_usage"] for r in sent)  # asked for, not given
    assert "request not sent: this session has cost $0.0" in refusal
    assert "the next request could reach" in refusal and "over agent.maxSessionCostUsd $0.0900" in refusal
    assert len(sent) == index  # the refused request never left

    spent = usages(ip)
    assert len(spent) == len(sent) and all(e.estimated is True for e in spent)
    counter = agent(ip).counter
    for number, entry in enumerate(spent):
        assert entry.input_tokens == entry.sent_tokens and entry.input_tokens > 1000  # what was sent, counted
        assert entry.output_tokens == counter.count_text(f"Answer {number}. {ANSWER}")  # what came back
    total = sum(map(price, spent), Decimal(0))
    assert total <= Decimal("0.09")  # the cap held
    line = cost_line(ip, capsys)
    shown = f"${total.quantize(Decimal('0.0001'))}"
    assert line.startswith(f"Cost: {shown} (estimated: the server sent no usage for {len(spent)} requests) this session")
    assert shown != "$0.0000"


def test_tool_call_arguments_streamed_back_are_counted(ip, nb_dir, scripted):
    configure(nb_dir, scripted.server, cap=5)
    arguments = {"code": "total = sum(range(10))\n" * 40}
    scripted.script(tool_calls(("python", arguments), usage=False), text("Done.", usage=False))
    ip.run_line_magic("soba", "compute it")
    first, second = usages(ip)
    counter = agent(ip).counter
    assert first.estimated is True and first.output_tokens >= counter.count_text(json.dumps(arguments))
    assert second.estimated is True and second.output_tokens == counter.count_text("Done.")


def test_figures_from_the_server_are_not_marked_and_the_file_says_estimated_only_when_it_is(ip, nb_dir, scripted, capsys):
    configure(nb_dir, scripted.server, cap=5)
    scripted.script(text("One.", input_tokens=4000, output_tokens=400), text("Two.", usage=False))
    ip.run_line_magic("soba", "first")
    assert "estimated" not in cost_line(ip, capsys)
    ip.run_line_magic("soba", "second")
    lines = [json.loads(line) for line in agent(ip).file.read_text(encoding="utf-8").splitlines()]
    usage_lines = [line for line in lines if line["type"] == "usage"]
    assert "estimated" not in usage_lines[0] and usage_lines[1]["estimated"] is True
    assert "(estimated: the server sent no usage for 1 request) this session" in cost_line(ip, capsys)


def test_a_resumed_session_and_the_cli_show_the_same_estimated_cost(ip, nb_dir, scripted, capsys):
    configure(nb_dir, scripted.server, cap=5)
    scripted.script(text(ANSWER, usage=False), text("Two.", usage=False))
    ip.run_line_magic("soba", "first")
    ip.run_line_magic("soba", "second")
    before = cost_line(ip, capsys)
    assert "(estimated: the server sent no usage for 2 requests)" in before
    file = agent(ip).file

    shut_down(ip)
    ip2 = new_shell(nb_dir)
    assert cost_line(ip2, capsys) == before
    capsys.readouterr()
    assert main(["budget", str(file)]) == 0
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("Cost: ")] == [before]
    assert main(["budget", str(file), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cost"]["estimatedRequests"] == 2 and Decimal(info["cost"]["totalUsd"]) > 0


def long_turns(ip: Any, scripted: Any, count: int = 6) -> None:
    ip.run_line_magic("auto_compact", "off")
    for index in range(count):
        scripted.script(text(f"Answer {index}. " + "The data has many columns worth describing. " * 45))
        ip.run_line_magic("soba", f"question {index}: describe the data")


def test_a_summary_without_usage_is_priced_from_our_counts(ip, nb_dir, scripted, capsys):
    configure(nb_dir, scripted.server, cap=5, small=True)
    long_turns(ip, scripted)
    scripted.summary = text(good_summary(), usage=False)
    ip.run_line_magic("compact", "")
    entries = Transcript.load(agent(ip).file).entries
    [capsule] = [e for e in entries if isinstance(e, CapsuleEntry)]
    assert capsule.quality == "full"
    [spent] = [e for e in entries if isinstance(e, UsageEntry) and e.operation == "compaction"]
    assert spent.estimated is True and spent.operation_id == capsule.operation_id
    assert spent.input_tokens > 500 and spent.output_tokens > 50
    assert f"compaction ${price(spent).quantize(Decimal('0.0001'))}" in cost_line(ip, capsys)
    assert "(estimated: the server sent no usage for 1 request)" in cost_line(ip, capsys)


# -- the compaction's requests: cut off at timeoutMs, native without figures -----------------


def compaction_usages(ip: Any) -> tuple[CapsuleEntry, list[UsageEntry]]:
    entries = Transcript.load(agent(ip).file).entries
    [capsule] = [e for e in entries if isinstance(e, CapsuleEntry)]
    return capsule, [e for e in entries if isinstance(e, UsageEntry) and e.operation == "compaction"]


def test_a_summary_cut_off_at_timeout_ms_is_priced_for_what_was_sent(ip, nb_dir, scripted, capsys):
    """SPEC §16: the summary request left and the server began answering; the deadline cut it
    off. It is priced for the prompt as counted and the characters received, marked estimated."""
    configure(nb_dir, scripted.server, cap=5, small=True, timeoutMs=1500)
    long_turns(ip, scripted)
    summary = good_summary()
    scripted.summary = text(summary, chunks=20, stall_after=3, stall_s=30)  # 3 pieces, then nothing
    ip.run_line_magic("compact", "")
    capsule, [spent] = compaction_usages(ip)
    assert capsule.quality == "degraded"
    [asked] = [r for r in scripted.server.requests if r.operation == "compaction"]
    assert asked.operation_id == capsule.operation_id == spent.operation_id
    assert spent.estimated is True and spent.sent_tokens is None  # a compaction request: never a budget figure
    body = asked.body
    counter = agent(ip).counter
    prompt = counter.count_text(body["messages"][0]["content"]) + counter.count_message("user", body["messages"][1]["content"])
    assert spent.input_tokens == prompt > 500  # what was sent, counted
    received = sum(len(piece) for piece in _pieces(summary, 20)[:3])
    assert spent.output_tokens == -(-received // 4) > 0  # what came back before the deadline
    line = cost_line(ip, capsys)
    assert f"compaction ${price(spent).quantize(Decimal('0.0001'))}" in line
    assert "(estimated: the server sent no usage for 1 request)" in line

    scripted.script(text("Next.", input_tokens=3000, output_tokens=20))
    ip.run_line_magic("soba", "go on")
    assert len(compaction_usages(ip)[1]) == 1  # nothing arrived later to count twice


def test_a_summary_cut_off_before_any_text_is_priced_for_its_prompt(ip, nb_dir, scripted):
    configure(nb_dir, scripted.server, cap=5, small=True, timeoutMs=1200)
    long_turns(ip, scripted)
    scripted.summary = text(good_summary(), delay_s=30)  # not a byte before the deadline
    ip.run_line_magic("compact", "")
    capsule, [spent] = compaction_usages(ip)
    assert capsule.quality == "degraded"
    assert spent.estimated is True and spent.output_tokens == 0 and spent.input_tokens > 500


def test_the_cap_counts_a_cut_off_summary(ip, nb_dir, scripted, capsys):
    """Fail-closed: the cut-off summary's price counts toward agent.maxSessionCostUsd, so the
    next request whose worst case would pass the cap is not sent."""
    configure(nb_dir, scripted.server, cap=5, small=True, timeoutMs=1200)
    long_turns(ip, scripted)
    scripted.summary = text(good_summary(), delay_s=30)
    ip.run_line_magic("compact", "")
    _, [spent] = compaction_usages(ip)
    session = agent(ip)
    total = session.cost().total
    assert total >= price(spent) > 0
    # A cap just above the cost without the cut-off request, below the next request's worst case.
    configure(nb_dir, scripted.server, cap=float(total - price(spent) / 2), small=True, timeoutMs=1200)
    before = len(model_requests(scripted.server))
    capsys.readouterr()
    ip.run_line_magic("soba", "and now?")
    out = capsys.readouterr()
    assert "request not sent: this session has cost" in out.out + out.err
    assert len(model_requests(scripted.server)) == before


def configure_responses(nb_dir: Path, server: Any) -> None:
    model = {
        "provider": "openai", "api": "responses", "name": "gpt-4o", "baseUrl": server.url,
        "apiKeyEnv": TEST_KEY_ENV, "pricing": PRICING, **SMALL_LIMITS["model"],
    }  # fmt: skip
    config = {"model": model, "compaction": SMALL_LIMITS["compaction"], "agent": {"maxSessionCostUsd": 5}}
    (nb_dir / "soba.json").write_text(json.dumps(config), encoding="utf-8")


def test_a_native_compaction_without_usage_is_priced(ip, nb_dir, scripted, capsys):
    configure_responses(nb_dir, scripted.server)
    long_turns(ip, scripted)
    scripted.summary = text("Summary of the earlier conversation.", usage=False)
    ip.run_line_magic("compact", "")
    capsule, [spent] = compaction_usages(ip)
    assert capsule.continuation == "native"
    [asked] = [r for r in scripted.server.requests if r.path == "/v1/responses/compact"]
    assert spent.estimated is True and spent.operation_id == capsule.operation_id == asked.operation_id
    assert spent.input_tokens > 500 and spent.output_tokens > 0
    assert "(estimated: the server sent no usage for 1 request)" in cost_line(ip, capsys)


def test_a_native_compaction_cut_off_at_timeout_ms_is_priced_once(ip, nb_dir, scripted):
    """The native request outlives the deadline; it is priced for what was sent when the
    operation stops waiting, and the figures its late answer carries are dropped."""
    configure_responses(nb_dir, scripted.server)
    soba_json = json.loads((nb_dir / "soba.json").read_text(encoding="utf-8"))
    soba_json["compaction"]["timeoutMs"] = 1200
    (nb_dir / "soba.json").write_text(json.dumps(soba_json), encoding="utf-8")
    long_turns(ip, scripted)
    scripted.summary = text("Summary of the earlier conversation.", delay_s=2.5)  # answers late, with usage
    ip.run_line_magic("compact", "")
    capsule, spent = compaction_usages(ip)
    assert capsule.continuation != "native" and capsule.quality == "degraded"
    compaction_requests = [r for r in scripted.server.requests if r.operation == "compaction"]
    assert compaction_requests and compaction_requests[0].path == "/v1/responses/compact"
    native = [e for e in spent if e.operation_id == capsule.operation_id]
    assert native and all(e.estimated is True for e in native)
    assert native[0].input_tokens > 500 and native[0].output_tokens == 0
    time.sleep(2.0)  # the late answer arrives
    scripted.script(text("Next."))
    ip.run_line_magic("soba", "go on")
    assert compaction_usages(ip)[1] == spent  # nothing recorded twice


def _pieces(content: str, chunks: int) -> list[str]:
    from llm_server import _split

    return _split(content, chunks)
