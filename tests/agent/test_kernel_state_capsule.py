"""Issue 38 through a real InteractiveShell and the loopback model server: after `%compact`,
the request the model is sent next carries a Kernel state that names the table's columns,
leaves the figure and axes out and names no id the model cannot find, whether the capsule is
the model's or the fallback's."""

from __future__ import annotations

import json
import re

import pytest
from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

from soba_nb.transcript.entries import CapsuleEntry, ToolCallEntry

BUILD = (
    "import pandas as pd\n"
    "import matplotlib\n"
    "matplotlib.use('Agg')\n"
    "import matplotlib.pyplot as plt\n"
    "raw = pd.DataFrame({'order_id': [1, 2, 2, 3], 'region': ['N', 'N/A', 'N/A', 'S'], 'amount': [9.5, 12.0, 12.0, 3.0]})\n"
    "clean = raw.drop_duplicates().replace('N/A', 'Unknown')\n"
    "fig, ax = plt.subplots()\n"
    "ax.bar(clean['region'], clean['amount'])\n"
    "print(len(raw) - len(clean))\n"
)
LONG_ANSWER = "The amounts hold up across every region and month we checked. " * 40


def magics(ip):
    return ip.magics_manager.registry["SobaMagics"]


def run(ip, line: str) -> str:
    with capture_output() as cap:
        ip.run_line_magic("soba", line)
    return cap.stdout


def kernel_state_sent(body: dict) -> str:
    """The `## Kernel state` section of the capsule in a request body the server received."""
    contents = json.dumps(body["messages"], ensure_ascii=False)
    text_sent = "\n".join(m["content"] for m in body["messages"] if isinstance(m.get("content"), str))
    assert "## Kernel state" in text_sent, contents[:2000]
    section = text_sent.split("## Kernel state", 1)[1]
    return section.split("\n## ", 1)[0]


@pytest.mark.parametrize("summary", ["model", "fallback"])
def test_the_next_request_knows_the_columns_and_not_the_figure(ip, scripted, summary):
    scripted.script(tool_calls(("python", {"code": BUILD})), text("Dropped 1 duplicate; `clean` is ready and plotted."))
    run(ip, "clean the orders and plot the amounts by region")
    for index in range(4):
        scripted.script(text(f"Answer {index}. {LONG_ANSWER}"))
        run(ip, f"question {index}")
    if summary == "fallback":
        scripted.summary = text("")  # refused (empty): the deterministic capsule is used
    with capture_output():
        ip.run_line_magic("compact", "")
    capsules = [e for e in magics(ip).agent.transcript.entries if isinstance(e, CapsuleEntry)]
    assert capsules and capsules[-1].quality == ("full" if summary == "model" else "degraded")

    scripted.script(text("The region column."))
    run(ip, "which column did we clean?")
    kernel = kernel_state_sent(scripted.inference_requests()[-1].body)
    lines = [line for line in kernel.splitlines() if line.startswith("- ")]
    clean = next(line for line in lines if line.startswith("- clean: "))
    region = ip.user_ns["clean"]["region"].dtype
    assert clean.startswith(f"- clean: DataFrame 3×3 · columns: order_id int64, region {region}, amount float64")
    assert clean.endswith("· built by the agent")
    assert not any(re.match(r"- (fig|ax): ", line) for line in lines), kernel
    call_ids = {e.id for e in magics(ip).agent.transcript.entries if isinstance(e, ToolCallEntry)}
    assert not any(entry_id in kernel for entry_id in call_ids)
