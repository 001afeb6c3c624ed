"""A server's usage figures are data (SPEC §12, §13): a negative prompt count (a broken gateway,
a hostile server) was recorded as it came, and the session's effective tokens went negative —
every limit looked far away, so nothing was compacted before the window overflowed — and its
cost went negative, so `agent.maxSessionCostUsd` never stopped a request. A figure that is no
count of tokens (negative, a boolean, over `MAX_CONTEXT_WINDOW`) is now no figure: the answer
is kept, its usage is not. A transcript or a turn's budget state carrying one (a hand edit, a
planted file) is refused or ignored, never believed; and a recorded window is checked on resume
as a server's figure is before it is recorded."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from llm_server import LLMServer, text

from soba_nb.config import MAX_CONTEXT_WINDOW, ModelSettings
from soba_nb.providers.anthropic import AnthropicProvider
from soba_nb.providers.base import ChatMessage, ModelRequest, Provider
from soba_nb.providers.openai import OpenAIProvider
from soba_nb.providers.responses import ResponsesProvider

KEY_ENV = "SOBA_TEST_USAGE_KEY"
FAST_RETRIES: dict[str, Any] = {"max_retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.02}
NOT_COUNTS = (-1, -(10**15), MAX_CONTEXT_WINDOW + 1, True)


def _openai(server: LLMServer) -> Provider:
    return OpenAIProvider(ModelSettings(base_url=server.url, api_key_env=KEY_ENV, name="gpt-test"), **FAST_RETRIES)


def _responses(server: LLMServer) -> Provider:
    settings = ModelSettings(base_url=server.url, api_key_env=KEY_ENV, name="gpt-test", api="responses")
    return ResponsesProvider(settings, **FAST_RETRIES)


def _anthropic(server: LLMServer) -> Provider:
    settings = ModelSettings(provider="anthropic", base_url=server.anthropic_url, api_key_env=KEY_ENV, name="claude-test")
    return AnthropicProvider(settings, **FAST_RETRIES)


WIRE_FORMATS: dict[str, Callable[[LLMServer], Provider]] = {
    "chat": _openai,
    "responses": _responses,
    "anthropic": _anthropic,
}


@pytest.fixture(params=sorted(WIRE_FORMATS))
def provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LLMServer, Provider]]:
    monkeypatch.setenv(KEY_ENV, "sk-test-usage")
    with LLMServer() as server, WIRE_FORMATS[request.param](server) as opened:
        yield server, opened


def ask(provider: Provider, stream: bool) -> Any:
    request = ModelRequest(
        system="You are a notebook agent.",
        messages=[ChatMessage(role="user", content="Load data.csv")],
        max_output_tokens=256,
        operation_id="op-usage",
        stream=stream,
    )
    return provider.complete(request)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("figure", NOT_COUNTS, ids=["minus-one", "minus-huge", "over-max", "true"])
def test_a_prompt_figure_that_is_no_count_is_no_usage_and_the_answer_is_kept(
    provider: tuple[LLMServer, Provider], stream: bool, figure: int
) -> None:
    server, opened = provider
    server.script(text("Loaded 3 rows.", input_tokens=figure))
    answer = ask(opened, stream)
    assert answer.text == "Loaded 3 rows."
    assert answer.usage is None


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_an_answer_figure_that_is_no_count_is_taken_as_none(provider: tuple[LLMServer, Provider], stream: bool) -> None:
    server, opened = provider
    server.script(text("Loaded 3 rows.", input_tokens=120, output_tokens=-(10**12)))
    answer = ask(opened, stream)
    assert answer.usage is not None
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (120, 0)


def test_a_percent_soba_turn_behind_a_server_reporting_a_negative_prompt_keeps_its_budget_and_cost(
    nb_dir: Path, llm_server: LLMServer, scripted, capsys
) -> None:
    """The whole way, in a real shell: the turn completes, no usage entry carries the figure,
    the effective tokens are the session's own count and the cost is not negative."""
    from conftest import SMALL_LIMITS, new_shell, shut_down, write_soba_json
    from IPython.utils.capture import capture_output

    prices = {"pricing": {"inputPerMTok": 2.5, "outputPerMTok": 10}}
    write_soba_json(nb_dir, llm_server.url, {**SMALL_LIMITS, "model": {**SMALL_LIMITS["model"], **prices}})
    ip = new_shell(nb_dir)
    scripted.script(text("Loaded 3 rows.", input_tokens=-(10**15), output_tokens=-(10**12)))
    with capture_output():
        ip.run_line_magic("soba", "load data.csv")
    session = ip.magics_manager.registry["SobaMagics"].agent
    lines = [json.loads(line) for line in session.transcript.file.read_bytes().splitlines()]
    # No usage entry carries the server's figure: the one recorded is our own count, marked
    # estimated (SPEC §16: the cost cap holds without usage figures).
    [usage] = [line for line in lines if line["type"] == "usage"]
    assert usage["estimated"] is True and usage["inputTokens"] == usage["sentTokens"] > 0 <= usage["outputTokens"]
    assert any(line["type"] == "message" and line.get("content") == "Loaded 3 rows." for line in lines)
    measured = session.compactor.measure()
    assert measured.effective > 0 and measured.source != "provider_usage"

    from soba_nb.cli import main

    assert main(["budget", "--json", str(session.transcript.file)]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["effectiveTokens"] == measured.effective
    assert figures["cost"]["priced"] and Decimal(figures["cost"]["totalUsd"]) > 0
    assert figures["cost"]["estimatedRequests"] == 1
    shut_down(ip)


def finished_session(ip, scripted) -> Path:
    from IPython.utils.capture import capture_output

    scripted.script(text("Loaded 3 rows.", input_tokens=900))
    with capture_output():
        ip.run_line_magic("soba", "load data.csv")
    return ip.magics_manager.registry["SobaMagics"].agent.transcript.file


def test_a_transcript_line_with_a_negative_figure_is_refused_in_one_line(ip, nb_dir: Path, scripted, capsys) -> None:
    from soba_nb.cli import main

    path = finished_session(ip, scripted)
    lines = path.read_bytes().splitlines()
    at = next(n for n, line in enumerate(lines) if json.loads(line)["type"] == "usage")
    planted = json.loads(lines[at])
    planted["inputTokens"] = -(10**15)
    lines[at] = json.dumps(planted).encode()
    copy = nb_dir / "planted.jsonl"
    copy.write_bytes(b"\n".join(lines) + b"\n")

    assert main(["budget", str(copy)]) != 0
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert f"{copy}:{at + 1}: bad entry" in error and "inputTokens" in error


def test_a_turns_budget_state_with_a_negative_figure_is_not_believed(ip, nb_dir: Path, scripted, capsys) -> None:
    from soba_nb.cli import main

    path = finished_session(ip, scripted)
    folder = nb_dir / "copies"
    folder.mkdir()
    honest = Path(shutil.copyfile(path, folder / "honest.jsonl"))
    assert main(["budget", "--json", str(honest)]) == 0
    expected = json.loads(capsys.readouterr().out)

    lines = path.read_bytes().splitlines()
    last = json.loads(lines[-1])
    assert last["type"] == "checkpoint" and last["budget"]["estimated"] > 0
    last["budget"]["estimated"] = -(10**15)
    last["budget"]["usageInput"] = -(10**15)
    planted = folder / "planted.jsonl"
    planted.write_bytes(b"\n".join([*lines[:-1], json.dumps(last).encode()]) + b"\n")
    assert main(["budget", "--json", str(planted)]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["effectiveTokens"] == expected["effectiveTokens"] > 0


@pytest.mark.parametrize(
    ("window", "source"), [(5, "overflow"), (5, "truncation"), (5, "server"), (2**62, "server")]
)
def test_a_recorded_window_no_window_can_be_does_not_strand_the_resumed_session(
    nb_dir: Path, llm_server: LLMServer, scripted, capsys, window: int, source: str
) -> None:
    """A window entry is checked on resume as a server's figure is before it is recorded: a
    planted 5-token window left no request room to be sent (every turn refused as one that
    "cannot fit even alone"), and one of 2**62 put every limit out of reach."""
    from conftest import new_shell, shut_down, write_soba_json
    from IPython.utils.capture import capture_output

    from soba_nb.cli import main
    from soba_nb.transcript.entries import WindowEntry

    write_soba_json(nb_dir, llm_server.url, {})  # the window is the catalogue's: a server's figure may replace it
    ip = new_shell(nb_dir)
    scripted.script(text("Loaded 3 rows.", input_tokens=900), text("Plotted."))
    with capture_output():
        ip.run_line_magic("soba", "load data.csv")
    session = ip.magics_manager.registry["SobaMagics"].agent
    path, honest = session.transcript.file, session.limits
    session.transcript.append(WindowEntry(context_window=window, source=source, detail="planted", model="openai/gpt-4o"))
    shut_down(ip)

    assert main(["budget", "--json", str(path)]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert (figures["contextWindow"], figures["hardLimit"]) == (honest.context_window, honest.hard_limit)
    ip = new_shell(nb_dir)
    with capture_output() as shown:
        ip.run_line_magic("soba", f"--session {path} plot it")
    resumed = ip.magics_manager.registry["SobaMagics"].agent
    assert resumed.transcript.file == path and resumed.limits == honest
    assert "not sent" not in shown.stdout and "Plotted." in shown.stdout
    shut_down(ip)
