"""Issue 39, read as the model reads it (SPEC §15): a data-science session in a real
InteractiveShell under the inline backend, against the loopback server as a vision model.

The user reads a CSV, describes it, draws a pie chart and runs a `groupby` on a misspelt
column; then `%soba /fix` (the model checks with `%time` — IPython syntax — and proposes the
corrected cell) and `%soba why does my pie chart look wrong?`. Every request body is read as
sent: the environment line, the data-work guidance, the cells block (printed text and `Out[n]`
apart, the plot named and sent), the failed cell once, no install prefix, the frame's
columns, what the IPython-syntax call returned, and the sizes. With `CAPTURE_REQUESTS_DIR`
set, the bodies are written there to be read (docs/notebook.md quotes one).
"""

from __future__ import annotations

import base64
import json
import os
import platform
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import write_soba_json
from llm_server import text, tool_calls

from soba_nb.agent.prompt import SYSTEM_PROMPT
from soba_nb.transcript.entries import UsageEntry

ISSUE_FIX_TOKENS = 2269
"""The first /fix request of the issue's captured session (a CSV, describe(), a failing groupby)."""
CELLS = [
    "import pandas as pd\nsales = pd.read_csv('sales.csv')",
    "sales.describe()",
    "import matplotlib.pyplot as plt\nprint('fastest: West')\n"
    "ax = plt.figure(figsize=(4, 3), dpi=50).gca()\n"
    "sales.groupby('region')['amount'].sum().plot.pie(ax=ax)",
    "sales.groupby('regon')['amount'].sum()",
]
FIXED = "sales.groupby('region')['amount'].sum()"


@pytest.fixture
def inline(ip):
    from matplotlib_inline import backend_inline

    ip.enable_gui = lambda gui=None: None
    backend_inline.configure_inline_support.current_backend = "unset"
    ip.run_line_magic("matplotlib", "inline")
    return ip


def write_sales(folder: Path) -> None:
    rows = ["region,amount,day"] + [
        f"{('West', 'East', 'North')[n % 3]},{(n * 37) % 500 + 0.5},2026-01-{n % 28 + 1:02d}" for n in range(300)
    ]
    (folder / "sales.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")


def user_texts(body: dict) -> list[str]:
    texts = []
    for message in body["messages"]:
        if message["role"] != "user":
            continue
        content = message["content"]
        parts = [content] if isinstance(content, str) else [p["text"] for p in content if p["type"] == "text"]
        texts.extend(parts)
    return texts


def images(body: dict) -> list[bytes]:
    return [
        base64.b64decode(part["image_url"]["url"].partition(",")[2])
        for message in body["messages"]
        if message["role"] == "user" and isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image_url"
    ]


def tool_results(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def test_a_data_science_session_reads_as_a_strong_model_needs_it(inline, nb_dir, scripted, llm_server):
    write_soba_json(nb_dir, llm_server.url, {"model": {"name": "gpt-4o"}})
    write_sales(nb_dir)
    for source in CELLS:
        inline.run_cell(source, store_history=True)
    scripted.script(
        tool_calls(("python", {"code": f"%time {FIXED}"}), content="The column is `region`; checking the fix."),
        tool_calls(("add_cell", {"source": FIXED})),
        text("`regon` is a typo for `region`; the corrected cell is below."),
    )
    inline.run_cell("%soba /fix", store_history=True)
    scripted.script(text("The wedges are unlabelled percentages; add autopct and a title."))
    inline.run_cell("%soba why does my pie chart look wrong?", store_history=True)

    bodies = [request.body for request in scripted.inference_requests()]
    capture = os.environ.get("CAPTURE_REQUESTS_DIR")
    if capture:
        for number, body in enumerate(bodies, 1):
            Path(capture, f"what_the_model_reads_{number}.json").write_text(json.dumps(body, indent=1, ensure_ascii=False))
    assert len(bodies) == 4
    fix_first, fix_second, fix_third, question = bodies

    # The system prompt: data-work guidance and where the code runs, the same in every request.
    system = fix_first["messages"][0]["content"]
    assert system.startswith(SYSTEM_PROMPT)
    environment = system.split("\n")[-1]
    assert environment.startswith("Environment: notebook analysis.ipynb · Python " + platform.python_version())
    assert f"pandas {'.'.join(version('pandas').split('.')[:2])}" in environment
    assert all(body["messages"][0]["content"] == system for body in bodies)
    assert "checkpoint` tool when" not in system

    # The cells block: printed text and Out[n] apart, the user's plot named and sent.
    [block] = [t for t in user_texts(fix_first) if t.startswith("Notebook cells run since the last request")]
    assert "printed:\nfastest: West\nOut[3]:\n<Axes: >\n[displayed image/png " in block
    assert "Out[2]:\n" in block and "count" in block  # describe()'s frame
    [pie] = images(fix_first)
    assert pie.startswith(b"\x89PNG")
    assert images(question) == [pie]  # still the newest image when the user asks about it

    # /fix: the failed cell once, no install prefix, the frame it names.
    for body in (fix_first, fix_second, fix_third):
        sent = json.dumps(body)
        assert sent.count("sales.groupby('regon')") == 1
        assert sent.count("KeyError: 'regon'") == 1
        assert "site-packages" not in sent and "dist-packages" not in sent
    [request] = [t for t in user_texts(fix_first) if t.startswith("Fix the notebook cell In [4] above")]
    assert "sales: DataFrame 300 × 3 — columns: region (str), amount (float64), day (str)" in request

    # The python tool took IPython syntax: %time ran and reported.
    [timed] = tool_results(fix_second)
    assert "Wall time" in timed and "SyntaxError" not in timed
    assert "East" in timed and "West" in timed

    # Sizes: what soba counted for each request as it left.
    sent_tokens = [e.sent_tokens for e in magics(inline).agent.transcript.entries if isinstance(e, UsageEntry) and e.operation == "inference"]
    assert sent_tokens and sent_tokens[0] is not None
    assert sent_tokens[0] < ISSUE_FIX_TOKENS, sent_tokens
    print("sent tokens per request:", sent_tokens)
    assert "proposed a code cell (1 line), not run" in tool_results(fix_third)[-1]


def magics(ip):
    return ip.magics_manager.registry["SobaMagics"]
