"""The project's AGENTS.md (SPEC §19) through a real `InteractiveShell` and the loopback
server: what the model was sent, request by request, in every wire format."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMALL_LIMITS, TEST_KEY_ENV, write_soba_json
from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

from soba_nb.agent.instructions import AGENTS_FILE, MAX_INSTRUCTIONS_TOKENS
from soba_nb.compaction.instructions import INSTRUCTIONS_FRAME
from soba_nb.tokens import TokenCounter

RULES = (
    "# Conventions of this analysis\n\n"
    "- Money columns are in cents (integers); divide by 100 only when showing them.\n"
    "- Dates are UTC.\n"
    "- Never write to data/raw/.\n"
)
RULE = "Money columns are in cents"
OPENING = INSTRUCTIONS_FRAME.split("(")[0]
"""How the instructions' message starts: "Project instructions "."""
BIG_WINDOW = {
    "model": {"contextWindow": 65000, "maxOutputTokens": 8000},
    "compaction": {"safetyReserveTokens": 8192},
}
"""hardLimit 48,808: room for the whole 4,000 tokens."""
LONG_ANSWER = "The data has many columns worth describing. " * 45


def agent(ip):
    return ip.magics_manager.registry["SobaMagics"].agent


def inference(scripted):
    return scripted.inference_requests()


def wire_texts(request) -> tuple[str, list[tuple[str, str]]]:
    """(the system prompt, (role, text) of each message part in order), in any wire format."""
    body = request.body
    if request.wire == "anthropic":
        parts = [
            (message["role"], block.get("text", ""))
            for message in body["messages"]
            for block in message["content"]
            if block.get("type") == "text"
        ]
        return body.get("system", ""), parts
    if request.wire == "responses":
        parts = [
            (item["role"], item["content"] if isinstance(item["content"], str) else item["content"][0].get("text", ""))
            for item in body["input"]
            if item.get("type") == "message"
        ]
        return body.get("instructions", ""), parts
    messages = body["messages"]
    assert messages[0]["role"] == "system"
    return messages[0]["content"], [(m["role"], m["content"] or "") for m in messages[1:]]


def assert_sent_once_first(request, rule: str = RULE) -> None:
    system, parts = wire_texts(request)
    assert rule not in system
    role, first = parts[0]
    assert role == "user" and first.startswith(OPENING) and rule in first, parts[0]
    assert json.dumps(request.body, ensure_ascii=False).count(rule) == 1


def not_sent(request, rule: str = RULE) -> bool:
    return rule not in json.dumps(request.body, ensure_ascii=False)


def test_sent_first_after_the_system_prompt_once_in_every_request_of_a_turn(ip, nb_dir, scripted):
    (nb_dir / AGENTS_FILE).write_text(RULES, encoding="utf-8")
    scripted.script(tool_calls(("python", {"code": "1 + 1"})), tool_calls(("list_files", {"path": "."})), text("Done."))
    with capture_output() as out:
        ip.run_line_magic("soba", "look at the data")
    requests = inference(scripted)
    assert len(requests) == 3
    for request in requests:
        assert_sent_once_first(request)
    assert AGENTS_FILE not in out.stdout  # nothing to say about a page of instructions
    transcript = agent(ip).file.read_text(encoding="utf-8")
    assert RULE not in transcript  # the request bodies carry it, not every turn's entries


@pytest.mark.parametrize("wire", ["anthropic", "responses"])
def test_every_wire_format_carries_them_first_and_once(ip, nb_dir, scripted, wire):
    model = {"provider": "anthropic", "name": "claude-test"} if wire == "anthropic" else {"api": "responses"}
    url = scripted.server.anthropic_url if wire == "anthropic" else scripted.server.url
    write_soba_json(nb_dir, url, {**SMALL_LIMITS, "model": {**SMALL_LIMITS["model"], **model, "apiKeyEnv": TEST_KEY_ENV}})
    (nb_dir / AGENTS_FILE).write_text(RULES, encoding="utf-8")
    scripted.script(tool_calls(("python", {"code": "1 + 1"})), text("Done."))
    ip.run_line_magic("soba", "--new look at the data")
    requests = inference(scripted)
    assert [r.wire for r in requests] == [wire, wire]
    for request in requests:
        assert_sent_once_first(request)


def test_after_compact_the_next_request_still_carries_them_once(ip, nb_dir, scripted):
    (nb_dir / AGENTS_FILE).write_text(RULES, encoding="utf-8")
    ip.run_line_magic("auto_compact", "off")
    for index in range(6):
        scripted.script(text(f"Answer {index}. {LONG_ANSWER}"))
        ip.run_line_magic("soba", f"question {index}: describe the data")
    with capture_output():
        ip.run_line_magic("compact", "")
    capsules = agent(ip).capsules()
    assert capsules and RULE not in capsules[-1].content  # the capsule need not carry them
    summary = [r for r in scripted.server.requests if r.operation == "compaction"]
    assert summary and all(not_sent(r) for r in summary)  # nor is the summary asked to
    scripted.script(text("Still in cents."))
    ip.run_line_magic("soba", "and now?")
    after = inference(scripted)[-1]
    assert_sent_once_first(after)
    _, parts = wire_texts(after)
    assert parts[1][1].startswith("Context Capsule")  # the capsule after them, never before


def test_no_instructions_leaves_them_out_for_that_turn_only(ip, nb_dir, scripted):
    (nb_dir / AGENTS_FILE).write_text(RULES, encoding="utf-8")
    scripted.script(tool_calls(("python", {"code": "1 + 1"})), text("One."), text("Two."))
    ip.run_line_magic("soba", "--no-instructions first question")
    ip.run_line_magic("soba", "second question")
    first, second, third = inference(scripted)
    assert wire_texts(first)[1][-1] == ("user", "first question")  # the option is no part of the prompt
    assert not_sent(first) and not_sent(second)
    assert_sent_once_first(third)


def test_an_edited_file_is_read_at_the_next_turn(ip, nb_dir, scripted):
    (nb_dir / AGENTS_FILE).write_text(RULES, encoding="utf-8")
    scripted.script(text("One."), text("Two."))
    ip.run_line_magic("soba", "first question")
    (nb_dir / AGENTS_FILE).write_text(RULES.replace("cents", "euros"), encoding="utf-8")
    ip.run_line_magic("soba", "second question")
    first, second = inference(scripted)
    assert_sent_once_first(first)
    assert not_sent(second) and json.dumps(second.body).count("Money columns are in euros") == 1


def long_rules(tokens: int) -> str:
    """An AGENTS.md of about `tokens` tokens (a little over), one rule a line."""
    counter = TokenCounter.for_model("openai", "gpt-4o")
    line = "- Rule {index:04d}: column amount_{index:04d} is in cents and its date column is UTC.\n"
    count = tokens // counter.count_text(line.format(index=1000)) + 1
    body = "".join(line.format(index=index) for index in range(count))
    assert tokens <= counter.count_text(body) < tokens * 1.1
    return body


def test_over_4000_tokens_is_clipped_with_one_line(ip, nb_dir, scripted, llm_server):
    write_soba_json(nb_dir, llm_server.url, BIG_WINDOW)
    rules = long_rules(6_000)
    (nb_dir / AGENTS_FILE).write_text(rules, encoding="utf-8")
    scripted.script(text("One."), text("Two."))
    with capture_output() as out:
        ip.run_line_magic("soba", "--new first question")
    lines = [line for line in out.stdout.splitlines() if AGENTS_FILE in line]
    assert len(lines) == 1 and re.search(r"AGENTS\.md is [\d,]+ tokens; the first [\d,]+ are sent", lines[0]), out.stdout
    total, sent = (int(figure.replace(",", "")) for figure in re.findall(r"[\d,]{3,}", lines[0]))
    assert total > MAX_INSTRUCTIONS_TOKENS >= sent > MAX_INSTRUCTIONS_TOKENS * 0.95
    with capture_output() as again:
        ip.run_line_magic("soba", "second question")
    assert AGENTS_FILE not in again.stdout  # said once per session
    _, parts = wire_texts(inference(scripted)[0])
    first = parts[0][1]
    assert first.startswith(OPENING) and "- Rule 0001:" in first and rules.splitlines()[-1] not in first
    assert f"the first {sent:,} of its {total:,} tokens are sent" in first  # the model knows it is clipped


def test_a_link_out_of_the_project_is_refused_in_one_line(ip, nb_dir, scripted, tmp_path):
    outside = tmp_path / "elsewhere.md"
    outside.write_text(RULES, encoding="utf-8")
    (nb_dir / AGENTS_FILE).symlink_to(outside)
    scripted.script(text("One."))
    with capture_output() as out:
        ip.run_line_magic("soba", "first question")
    lines = [line for line in out.stdout.splitlines() if AGENTS_FILE in line]
    assert len(lines) == 1 and "outside the project; not sent" in lines[0], out.stdout
    assert not_sent(inference(scripted)[0])


def test_not_utf8_or_a_folder_is_one_line_and_nothing_sent(ip, nb_dir, scripted):
    (nb_dir / AGENTS_FILE).write_bytes(b"Money columns are in cents \xff\xfe\n")
    scripted.script(text("One."), text("Two."))
    with capture_output() as out:
        ip.run_line_magic("soba", "first question")
    assert "AGENTS.md: not UTF-8 text (byte 27); not sent" in out.stdout
    (nb_dir / AGENTS_FILE).unlink()
    (nb_dir / AGENTS_FILE).mkdir()
    with capture_output() as out:
        ip.run_line_magic("soba", "second question")
    assert "AGENTS.md: a folder, not a file; not sent" in out.stdout
    assert all(not_sent(r) for r in inference(scripted))


def budget_effective(ip) -> int:
    with capture_output() as out:
        ip.run_line_magic("budget", "")
    return int(re.search(r"Budget: ([\d,]+) /", out.stdout).group(1).replace(",", ""))


def cli_effective(session: Path) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "soba_nb.cli", "budget", str(session), "--json"],
        capture_output=True, text=True, check=True, timeout=120,
    )
    return int(json.loads(done.stdout)["effectiveTokens"])


def test_the_budgets_fixed_part_grows_by_their_tokens(ip, nb_dir, scripted):
    before = budget_effective(ip)
    session = agent(ip).file
    cli_before = cli_effective(session)
    (nb_dir / AGENTS_FILE).write_text(RULES, encoding="utf-8")
    cli_after = cli_effective(session)  # the next request's, as the file is now
    ip.run_line_magic("soba", "--new")  # a session opened reads it
    after = budget_effective(ip)
    message = agent(ip).instructions.message
    cost = agent(ip).counter.count_message("user", message)
    assert after - before == cost == cli_after - cli_before


def test_a_small_window_is_not_stranded_by_a_4000_token_file(ip, nb_dir, scripted):
    (nb_dir / AGENTS_FILE).write_text(long_rules(4_000), encoding="utf-8")
    ip.run_line_magic("auto_compact", "off")
    with capture_output() as out:
        for index in range(8):
            scripted.script(text(f"Answer {index}. {LONG_ANSWER}"))
            ip.run_line_magic("soba", f"question {index}: describe the data")
    shown = [line for line in out.stdout.splitlines() if AGENTS_FILE in line]
    assert len(shown) == 1 and "at most 25% of this model's hard limit" in shown[0], out.stdout
    session = agent(ip)
    assert session.capsules(), "the hard limit compacted and the session went on"
    requests = inference(scripted)
    assert len(requests) == 8 and all(r.completed for r in requests)
    for request in requests:
        assert_sent_once_first(request, "- Rule 0001:")
    assert "failed" not in out.stdout.lower()


def test_a_refusal_names_the_instructions_when_the_fixed_part_is_beyond_the_window(ip, nb_dir, scripted, llm_server):
    tiny = {**SMALL_LIMITS, "model": {"contextWindow": 2200, "maxOutputTokens": 500}}
    write_soba_json(nb_dir, llm_server.url, tiny)
    (nb_dir / AGENTS_FILE).write_text(long_rules(4_000), encoding="utf-8")
    with capture_output() as out:
        ip.run_line_magic("soba", "--new first question")
    assert inference(scripted) == []  # nothing known to exceed the hard limit is sent
    refusal = [line for line in out.stdout.splitlines() if "Nothing fits" in line]
    assert refusal and "the system prompt, tools and AGENTS.md (" in refusal[0], out.stdout
    assert "%soba --no-instructions leaves it out" in refusal[0]


def doctor_line(folder: Path, capsys) -> str:
    from soba_nb.cli import main

    assert main(["doctor", str(folder)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"{AGENTS_FILE}  ")]
    assert len(lines) == 1
    return lines[0]


def test_doctor_names_the_file_its_tokens_and_whether_it_is_clipped(nb_dir, llm_server, capsys):
    assert doctor_line(nb_dir, capsys) == f"AGENTS.md  none (no AGENTS.md in the project folder {nb_dir})"
    (nb_dir / AGENTS_FILE).write_text(RULES, encoding="utf-8")
    tokens = TokenCounter.for_model("openai", "gpt-4o").count_text(RULES)
    assert doctor_line(nb_dir, capsys) == (
        f"AGENTS.md  AGENTS.md · {tokens} tokens · sent whole with every request "
        "(%soba --no-instructions leaves it out for a turn)"
    )
    write_soba_json(nb_dir, llm_server.url, BIG_WINDOW)
    (nb_dir / AGENTS_FILE).write_text(long_rules(5_000), encoding="utf-8")
    assert re.fullmatch(
        r"AGENTS\.md  AGENTS\.md · 5,\d{3} tokens · clipped: the first 3,9\d\d are sent with every request .*",
        doctor_line(nb_dir, capsys),
    )
