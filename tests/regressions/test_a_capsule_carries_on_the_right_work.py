"""A capsule that passed every rule still told the next model to redo a finished request,
dropped the figures the work produced and listed `Unknown` as a modified file (issue 38).

A data scientist's session through a real `InteractiveShell` and the loopback server: a CSV
loaded with pandas, a `KeyError` fixed with `/fix`, a cleaning pass that prints its figures, a
plot, decisions stated by the user, then `%compact` and a follow-up question. What is checked is
what the model is SENT after the compaction (the request body the server received), read as a
model reads it, for both capsule paths: the model's (a summary that follows the prompt) and the
deterministic fallback. The bodies are written to `CAPTURE_REQUESTS_DIR` when it is set, to be read
by a person.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import write_soba_json
from llm_server import text, tool_calls

from soba_nb.compaction.capsule import SECTION_HEADINGS, parse_capsule
from soba_nb.compaction.requests import split_goal
from soba_nb.transcript.entries import CapsuleEntry, MessageEntry, ToolCallEntry, ToolResultEntry
from soba_nb.transcript.store import Transcript

LIMITS = {
    "model": {"contextWindow": 16000, "maxOutputTokens": 1000},
    "compaction": {"keepRecentTokens": 150, "safetyReserveTokens": 1000, "minTokensForAutoCompact": 8000},
}

MAKE_DATA = """\
import numpy as np, pandas as pd
rng = np.random.default_rng(7)
n = 1736
raw = pd.DataFrame({
    "order_id": np.r_[np.arange(1722), np.arange(100, 114)],
    "region": rng.choice(["North", "South", "East", "West", "N/A"], n),
    "amount": np.round(rng.gamma(2.0, 60.0, n), 2),
})
raw.loc[rng.choice(np.arange(200, 1700), 41, replace=False), "amount"] *= -1
raw.to_csv("sales.csv", index=False)
df = pd.read_csv("sales.csv")
"""
FAILING_CELL = 'df.groupby("Region")["amount"].sum()'
CLEANING = """\
clean = df.drop_duplicates("order_id").copy()
clean["region"] = clean["region"].replace("N/A", "Unknown")
refunds = clean[clean.amount < 0]
revenue = clean[clean.amount >= 0]
print("duplicates dropped:", len(df) - len(clean))
print("refunds:", len(refunds))
print("outlier cut-off:", round(revenue.amount.quantile(0.99), 2))
"""
PLOT = """\
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
revenue.groupby("region")["amount"].sum().plot.bar(ax=ax)
fig.savefig("revenue_by_region.png")
print(revenue.groupby("region")["amount"].sum().round(2).to_dict())
"""
DECISION = "Keep refunds out of revenue: finance books them separately. Now plot revenue by region."
FOLLOW_UP = "Which region brings the most revenue, and by how much over the next one?"

OBEDIENT_SUMMARY = {
    # A summary that does what the prompt asks: goal and constraints (not the requests:
    # soba adds them), the work with its figures, real files only.
    "Goal and constraints": "Clean the sales data and report revenue by region.\n\n"
    "- Refunds are kept out of revenue (finance books them separately).",
    "Work done": "- /fix: the column is `region`, not `Region`; the corrected cell groups by `region`.\n"
    "- Cleaning: 14 duplicate orders dropped, 41 refunds set apart, outlier cut-off 416.43.\n"
    "- Revenue by region plotted and saved.",
    "Decisions": "- Refunds out of revenue: finance books them separately (the user).",
    "Files modified": "- revenue_by_region.png",
    "Verification": "- cleaning pass printed duplicates dropped: 14, refunds: 41",
    "Artifacts": "- revenue_by_region.png",
}


def obedient_summary() -> str:
    return "\n\n".join(f"## {h}\n\n{OBEDIENT_SUMMARY.get(h, '(none)')}" for h in SECTION_HEADINGS) + "\n"


def cell(ip, source: str):
    """A cell as a kernel runs it: its events fire and it gets an execution count."""
    return ip.run_cell(source, store_history=True)


def run_session(ip, scripted, capsys) -> dict[str, str]:
    """The session up to `%compact` and the follow-up; the figures its code really printed."""
    ip.run_line_magic("auto_compact", "off")  # the user compacts when they choose
    assert cell(ip, MAKE_DATA).success
    assert not cell(ip, FAILING_CELL).success  # KeyError: 'Region'

    scripted.script(
        tool_calls(("python", {"code": "print(df.columns.tolist())"}), content="Checking the column names."),
        text("The column is `region` (lower case). Corrected cell: `df.groupby(\"region\")[\"amount\"].sum()`."),
    )
    cell(ip, "%soba /fix")
    scripted.script(
        tool_calls(("python", {"code": CLEANING}), content="Dropping duplicates and counting refunds."),
        text("Cleaned: 14 duplicate orders dropped, 41 refunds set apart; the cut-off for outliers is printed above."),
    )
    cell(ip, "%soba Clean the data: drop duplicate orders and count the refunds.")
    scripted.script(
        tool_calls(("python", {"code": PLOT}), content="Plotting revenue by region."),
        text("Saved revenue_by_region.png; revenue by region is printed above."),
    )
    cell(ip, f"%soba {DECISION}")
    printed = capsys.readouterr().out
    ns = ip.user_ns
    figures = {
        "duplicates": str(len(ns["df"]) - len(ns["clean"])),
        "refunds": str(len(ns["refunds"])),
        "cutoff": str(round(ns["revenue"].amount.quantile(0.99), 2)),
    }
    assert figures["duplicates"] == "14" and figures["refunds"] == "41", printed
    OBEDIENT_SUMMARY["Work done"] = OBEDIENT_SUMMARY["Work done"].replace("416.43", figures["cutoff"])
    return figures


def next_request_after_compact(ip, scripted, nb_dir: Path, name: str) -> dict:
    cell(ip, "%compact")
    scripted.script(text("West, by a wide margin."))
    cell(ip, f"%soba {FOLLOW_UP}")
    body = scripted.inference_requests()[-1].body
    capture = os.environ.get("CAPTURE_REQUESTS_DIR")
    if capture:
        Path(capture, f"{name}.json").write_text(json.dumps(body, indent=1, ensure_ascii=False))
    return body


def capsule_message(body: dict) -> str:
    [capsule] = [m["content"] for m in body["messages"] if isinstance(m.get("content"), str) and "Context Capsule" in m["content"]]
    return capsule


def section(capsule_text: str, heading: str) -> str:
    at = capsule_text.index(f"## {heading}\n")
    rest = capsule_text[at + len(heading) + 4 :]
    end = rest.find("\n## ")
    return rest if end < 0 else rest[:end]


@pytest.mark.parametrize("path", ["model", "fallback"])
def test_the_next_model_reads_the_requests_the_results_and_no_invention(path, ip, nb_dir, scripted, llm_server, capsys):
    write_soba_json(nb_dir, llm_server.url, LIMITS)
    figures = run_session(ip, scripted, capsys)
    scripted.summary = text(obedient_summary()) if path == "model" else text("Error: the model is overloaded")
    body = next_request_after_compact(ip, scripted, nb_dir, path)
    capsule = capsule_message(body)
    user_texts = [m["content"] for m in body["messages"] if m["role"] == "user" and isinstance(m["content"], str)]

    # The current request is the newest user message, after the capsule; nothing earlier is
    # presented as the one to work on.
    assert user_texts[-1].endswith(FOLLOW_UP)
    assert "newest user message after it" in capsule
    requests, _ = split_goal(section(capsule, "Goal and constraints"))
    quoted = [(r.status, r.text) for r in requests.items]
    assert ("done", "/fix") in quoted  # as the user typed it, never soba's template
    assert ("done", "Clean the data: drop duplicate orders and count the refunds.") in quoted
    assert all(status == "done" for status, _ in quoted), quoted
    assert "Latest user request" not in capsule
    assert "Fix the notebook cell" not in capsule and "add_cell" not in section(capsule, "Goal and constraints")
    assert "Traceback" not in capsule

    # Results are state: the figures the work printed reach the model.
    for name, figure in figures.items():
        assert figure in capsule, (name, figure)

    # Nothing invented: `Unknown` is a value, not a file; no id the model cannot find.
    modified = section(capsule, "Files modified")
    assert "Unknown" not in modified
    assert "revenue_by_region.png" in modified or "revenue_by_region.png" in json.dumps(body["messages"][2:])
    for call_id in re.findall(r"python call ([0-9a-f]{8})", capsule):
        assert sum(call_id in json.dumps(m) for m in body["messages"]) > 1, call_id

    # Kernel state knows data: the columns of the frames, not the figure or its axes.
    kernel = section(capsule, "Kernel state")
    assert "region" in kernel and "amount" in kernel
    assert not re.search(r"^- (fig|ax):", kernel, re.MULTILINE)

    # Empty sections say (none) and nothing else.
    for heading in SECTION_HEADINGS:
        body_text = section(capsule, heading).strip()
        assert "(none)" not in body_text or body_text == "(none)", heading


def test_a_request_the_capsule_replaced_mid_turn_is_the_one_in_progress(ip, nb_dir, scripted, llm_server, capsys):
    """A long tool loop compacts inside the turn: the request being worked on is inside the
    replaced part; it is quoted whole and marked in progress, the earlier ones done."""
    write_soba_json(nb_dir, llm_server.url, LIMITS)
    run_session(ip, scripted, capsys)
    agent = ip.magics_manager.registry["SobaMagics"].agent
    request = "Now break revenue down by month for each region and tell me which month peaked."
    agent.transcript.append(MessageEntry(role="user", content=request))
    for step in range(4):  # the turn's tool loop, long enough for the cut to pass its request
        agent.transcript.append(MessageEntry(role="assistant", content=f"Step {step}."))
        agent.transcript.append(ToolCallEntry(call_id="call_0", name="python", arguments=json.dumps({"code": f"step_{step} = {step}"})))
        agent.transcript.append(ToolResultEntry(call_id="call_0", name="python", content="ok " * 60))
    result = agent.compactor.compact()
    assert result.entry is not None, result.reason
    capsule = parse_capsule(result.entry.content)
    requests, _ = split_goal(capsule.goal_and_constraints)
    assert requests.items[0].status == "in progress" and requests.items[0].text == request
    assert all(r.status == "done" for r in requests.items[1:])
    # What the next request of the turn carries: the request, whole, as the one in progress.
    sent = agent.compactor.request_for_sending()
    text_sent = "\n".join(m.content for m in sent.messages if isinstance(m.content, str))
    assert f"1. in progress:\n\n```text\n{request}\n```" in text_sent
    assert "if none follows, the request it marks in progress" in text_sent
    assert isinstance([e for e in Transcript.load(agent.file).path() if isinstance(e, CapsuleEntry)][-1], CapsuleEntry)
