"""SPEC §9: the budget figures in a real browser, driven by the real magics.

A notebook loads the extension, shows `%budget`, runs three `%soba` turns against the
loopback LLM server (long text answers, then one `python` tool call), `%compact` (the
summary streams for ~2.4 s) and `%budget` again. Real servers — `jupyter lab` (JupyterLab 4)
and `jupyter notebook` (Notebook 7) — run it in a real kernel, and Debian's chromium, driven
by Playwright, runs all cells and reads the page:

- each `%budget` output (static HTML, in both frontends) is a snapshot of its moment: the
  last one shows the bar filled to effective / hardLimit with the soft threshold marked,
  `effective / hardLimit tokens`, softLimit, the measurement source, auto on and the last
  compaction `Compacted (user) · before → after tokens · reclaimed N% · ck_…` with its
  quality — limits from the configuration, the result line from the capsule on disk —
  while the first one still shows the figures from before the turns;
- during the barrier, the live line `Compacting context · NN%` (trigger `user`: no response
  follows) in the `%compact` output and (JupyterLab) in the sidebar: rising percentages,
  no more than 10 updates a second, at most 0.5 s apart (plus delivery slack), collapsing
  to the result line the cell shows;
- the answers as rendered Markdown and the tool call as a collapsed receipt;
- in JupyterLab only, the "soba budget" panel of the right sidebar (the labextension)
  with the same figures and result line; Notebook 7 has no such panel.

A second JupyterLab test clicks the panel's controls: Auto-compact (the snapshot's auto
flips; a `%budget` run afterwards says so, the earlier one still says on), Compact now (the
panel and the status bar follow the barrier; the transcript gains a capsule), Export
capsule… (the dialog's default `<notebook-stem>.capsule.md`; the file starts with `---` and
opens as rendered Markdown with the soba capsule icon) and Cancel while a slow `%soba`
streams (the cell ends with its cancelled line; the next cell runs).

With `SOBA_SCREENSHOT=path`, the JupyterLab test saves a screenshot there (the one in
docs/monitor.png): `SOBA_SCREENSHOT=docs/monitor.png pytest tests/notebook/test_monitor_browser.py -k lab`.

Each test starts and always stops its own server (temporary root folder, random token,
its own Jupyter config/data/runtime/settings folders; the installed labextensions stay
visible). Skipped, with the reason, without /usr/bin/chromium, Playwright, the built
labextension (JupyterLab) or Notebook 7.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from compaction_support import good_summary
from conftest import SMALL_LIMITS, TEST_KEY_ENV, TEST_KEY_VALUE, ScriptedModel, write_soba_json
from jupyter_support import (
    EXPOSE_APP,
    LABEXTENSION_BUILD,
    SOBA_LABEXTENSION,
    UI_TIMEOUT_MS,
    JupyterServer,
    browser_page,
    cell,
    installed_data_dirs,
    isolated_env,
    jupyter_server,
    require_browser,
    run_all_cells,
    wait_for_kernel_idle,
    write_code_notebook,
)
from llm_server import LLMServer, text, tool_calls

from soba_nb.config import load_config
from soba_nb.notebook.monitor import MAX_UPDATES_PER_S, capsule_line
from soba_nb.transcript.entries import CapsuleEntry
from soba_nb.transcript.store import Transcript

SCREENSHOT_ENV = "SOBA_SCREENSHOT"
VIEWPORT: Any = {"width": 1440, "height": 900}
SCREENSHOT_VIEWPORT: Any = {"width": 1280, "height": 720}
SETTLE_MS = 500
SCREENSHOT_CONTEXT_PX = 110

NOTEBOOK = "budget.ipynb"
LAYER: dict[str, Any] = {
    # hardLimit 5,000 as with SMALL_LIMITS, with room for the long table answers below (2,280
    # tokens): a stream past maxOutputTokens is stopped (SPEC §17), as a real server stops it.
    "model": {"contextWindow": 8500, "maxOutputTokens": 3000},
    # The notebook decides when to compact (`%compact`); the soft threshold stays on.
    "compaction": {**SMALL_LIMITS["compaction"], "compactOnTurnComplete": False},
}
"""hardLimit 5,000, softLimit 4,000 (SMALL_LIMITS); the turns stay below the soft limit."""

REGIONS = ("North", "South", "East", "West")
FIRST_ROWS, GAP_ROWS = 80, 55
"""Table rows in the two long answers: the first is compacted, the second (with the tool
turn) fills the kept window (keepRecentTokens 1,000); together they stay under softLimit."""
COLUMNS = (
    "- `date`: the day of the sale, one row per order line, January to June 2024;\n"
    "- `region`: North, South, East or West; a few rows leave it empty;\n"
    "- `product`: the article sold, as a catalogue code such as `A-113`;\n"
    "- `units`: how many were sold, an integer; bulk orders reach a few hundred;\n"
    "- `price`: the unit price in euros, two decimals; a handful look like typos.\n"
)


def half_up(value: float) -> int:
    """A percentage as the cell and the panel show it (the panel's `Math.round`)."""
    return math.floor(value + 0.5)


def _row(n: int, *, gaps: bool = False) -> str:
    """One made-up row of sales.csv as a Markdown table row (`gaps`: a value missing)."""
    region = "" if gaps and n % 3 == 0 else REGIONS[n % 4]
    units = "" if gaps and n % 3 != 0 else str(3 + (n * 5) % 40)
    return (
        f"| {2 + 37 * n} | 2024-{1 + n % 6:02d}-{1 + n % 28:02d} | {region} | A-{100 + 7 * n} "
        f"| {units} | {9.5 + (n * 1.25) % 30:.2f} |\n"
    )


TABLE_HEAD = "| row | date | region | product | units | price |\n|---:|---|---|---|---:|---:|\n"
ANSWERS = (
    "`sales.csv` has five columns, one row per order line:\n\n"
    + COLUMNS
    + "\nThe first rows:\n\n"
    + TABLE_HEAD
    + "".join(_row(n) for n in range(FIRST_ROWS)),
    "These rows lack `units` or `region`:\n\n"
    + TABLE_HEAD
    + "".join(_row(n, gaps=True) for n in range(GAP_ROWS))
    + "\nRows without `units` cannot count towards revenue: drop them rather than impute.",
)
TOOL_CODE = "units = [12, 7, 30]\nprint('total', sum(units))\nsum(units)"
FINAL_ANSWER = "The total is **49** units; the list is kept in `units`."
SUMMARY_CHUNKS, SUMMARY_CHUNK_DELAY_S = 6, 0.4
"""The summary streams for about 2.4 s (timeoutMs is 5 s): the live line can be seen."""
CELLS = (
    "%load_ext soba_nb",
    "%budget",
    "%soba What do the columns of sales.csv hold?",
    "%soba Which rows have missing values?",
    "%soba Put the units 12, 7 and 30 in a list and add them up",
    "%compact keep the totals",
    "%budget",
)
FIRST_BUDGET_CELL, FIRST_TURN_CELL, TOOL_TURN_CELL, COMPACT_CELL, BUDGET_CELL = 1, 2, 4, 5, 6
LIVE_REFRESH_S = 0.5
"""SPEC §9: the live line is refreshed at least this often during a barrier."""
LATENCY_SLACK_S = 0.25
"""Kernel → browser delivery and the page's 20 ms polling, on a loaded machine."""
LIVE_LINE = re.compile(r"^Compacting context · (\d+)%$")
"""The live line of `%compact` (trigger `user`): no response follows it."""
RESULT_LINE = re.compile(
    r"Compacted \(user\) · [\d,]+ → [\d,]+ tokens · reclaimed \d+% · ck_[0-9a-f]+"
)


# -- the notebook and its model -------------------------------------------------------------


def script_the_model(model: ScriptedModel) -> None:
    model.summary = text(good_summary(), chunks=SUMMARY_CHUNKS, chunk_delay_s=SUMMARY_CHUNK_DELAY_S)
    model.script(
        text(ANSWERS[0], chunks=4),
        text(ANSWERS[1], chunks=4),
        tool_calls(("python", {"code": TOOL_CODE})),
        text(FINAL_ANSWER, chunks=2),
    )


def write_notebook(root: Path, server_url: str) -> None:
    write_soba_json(root, server_url, LAYER)
    write_code_notebook(root / NOTEBOOK, CELLS)


@dataclass(frozen=True)
class Expected:
    """What the monitor should show, from the configuration and the transcript on disk."""

    hard_limit: int
    soft_limit: int
    result_line: str


def session_capsules(root: Path, notebook: str = NOTEBOOK) -> list[CapsuleEntry]:
    """The capsules on the current path of the notebook's one session, read from disk."""
    sessions = [
        p
        for p in (root / f"{Path(notebook).stem}.soba").glob("*.jsonl")
        if p.name != "flight.jsonl"
    ]
    assert len(sessions) == 1, f"expected one session next to the notebook, found {sessions}"
    return [e for e in Transcript.load(sessions[0]).path() if isinstance(e, CapsuleEntry)]


def expected_figures(root: Path, env: dict[str, str], notebook: str = NOTEBOOK) -> Expected:
    """`env`: the kernel's environment (its HOME, no SOBA_* variables) for the same config."""
    config = load_config(root, environ=env, user_config=Path(env["HOME"]) / ".soba" / "config.json")
    capsules = session_capsules(root, notebook)
    assert len(capsules) == 1, "one compaction appends one capsule"
    return Expected(config.hard_limit, config.soft_limit, capsule_line(capsules[0]))


# -- the fixtures ---------------------------------------------------------------------------


@pytest.fixture
def model(llm_server: LLMServer) -> ScriptedModel:
    scripted = ScriptedModel(llm_server)
    script_the_model(scripted)
    return scripted


@pytest.fixture
def root(tmp_path: Path, model: ScriptedModel) -> Path:
    folder = tmp_path / "root"
    folder.mkdir()
    write_notebook(folder, model.server.url)
    return folder


# -- the page -------------------------------------------------------------------------------

RECORDER = """
(compactCell) => {
  // Every 20 ms, note what the barrier line shows where the user can see it: the
  // %compact cell's output, the sidebar panel and the status bar (JupyterLab).
  const cells = () => document.querySelectorAll('.jp-Notebook .jp-Cell');
  const sources = {
    cell: () =>
      compactCell === null
        ? null
        : cells()[compactCell]?.querySelector('.jp-OutputArea-output')?.textContent,
    sidebar: () =>
      document.querySelector('#soba-budget-panel .soba-Budget-live')?.textContent ??
      document.querySelector('#soba-budget-panel .soba-Budget-result .soba-Budget-line')
        ?.textContent,
    status: () => document.querySelector('.soba-StatusItem')?.textContent
  };
  const seen = [];
  const last = {};
  const started = performance.now();
  window.sobaSeen = seen;
  setInterval(() => {
    for (const [source, read] of Object.entries(sources)) {
      const text = (read() ?? '').trim();
      if (text && text !== last[source]) {
        last[source] = text;
        seen.push({ source, text, t: (performance.now() - started) / 1000 });
      }
    }
  }, 20);
}
"""


@dataclass(frozen=True)
class Seen:
    source: str
    text: str
    t: float


@dataclass(frozen=True)
class BudgetOutput:
    """The parts of one `%budget` output (static HTML): the bar and the figure lines."""

    bar: Any
    fill: Any
    marker: Any
    figures: Any


def budget_output(page: Any, index: int) -> BudgetOutput:
    view = cell(page, index).locator(".soba-budget")
    return BudgetOutput(
        view.locator(".soba-bar"),
        view.locator(".soba-bar-fill"),
        view.locator(".soba-soft-marker"),
        view.locator(".soba-budget-figures"),
    )


def record_and_run_all(page: Any) -> None:
    """Once the kernel is idle, start the barrier-line recorder, then Run All Cells."""
    wait_for_kernel_idle(page)
    page.evaluate(RECORDER, COMPACT_CELL)
    run_all_cells(page)


def wait_for_the_run(page: Any, model: ScriptedModel, server: JupyterServer) -> Expected:
    """All cells ran (the last `%budget` shows the compaction); the figures to expect."""
    from playwright.sync_api import expect

    # The final `%budget` runs last: once it shows the last compaction, all ran.
    expect(budget_output(page, BUDGET_CELL).figures).to_contain_text(
        "Last compaction: Compacted", timeout=UI_TIMEOUT_MS
    )
    assert [r.operation for r in model.server.requests if r.operation] == ["inference"] * 4 + ["compaction"]
    return expected_figures(server.root, server.env)


def check_outputs(page: Any) -> None:
    """Answers as rendered Markdown, the tool call as a collapsed receipt, no errors."""
    from playwright.sync_api import expect

    first = cell(page, FIRST_TURN_CELL).locator(".jp-RenderedMarkdown")
    expect(first.locator("code").first).to_have_text("sales.csv")
    expect(first.locator("table tbody tr")).to_have_count(FIRST_ROWS)
    answer = cell(page, TOOL_TURN_CELL).locator(".jp-RenderedMarkdown")
    expect(answer).to_have_text("The total is 49 units; the list is kept in units.")
    expect(answer.locator("strong")).to_have_text("49")

    receipt = cell(page, TOOL_TURN_CELL).locator("details.soba-receipt")
    expect(receipt).to_have_count(1)
    expect(receipt.locator("summary")).to_have_text(
        re.compile(r"python: units = \[12, 7, 30\]… · ok · \d+\.\d s")
    )
    expect(receipt.locator("pre")).not_to_be_visible()
    receipt.locator("summary").click()
    expect(receipt.locator("pre")).to_have_text("stdout:\ntotal 49\nresult: 49")

    notebook = page.locator(".jp-Notebook")
    expect(notebook.locator(".jp-OutputArea-output[data-mime-type*='stderr']")).to_have_count(0)
    for marker in ("Traceback", "Error displaying widget", "failed:", "UsageError", "skipped:"):
        expect(notebook).not_to_contain_text(marker)


def budget_line(hard_limit: int, soft_limit: int, auto: str = "on") -> re.Pattern[str]:
    return re.compile(
        rf"Budget: ([\d,]+) / {hard_limit:,} tokens \((\d+)% of hardLimit\) · softLimit {soft_limit:,}"
        rf" · source (provider_usage|estimated) · auto {auto}"
    )


def check_bar(output: BudgetOutput, effective: int, expected: Expected) -> None:
    """Filled to effective / hardLimit, the soft threshold marked where it falls."""
    from playwright.sync_api import expect

    output.bar.scroll_into_view_if_needed()  # a windowed notebook may not lay it out otherwise
    expect(output.fill).to_be_visible()
    expect(output.marker).to_be_visible()
    expect(output.marker).to_have_attribute("title", f"softLimit {expected.soft_limit:,}")
    track, fill, marker = (
        output.bar.bounding_box(),
        output.fill.bounding_box(),
        output.marker.bounding_box(),
    )
    assert track and fill and marker
    assert fill["width"] == pytest.approx(track["width"] * effective / expected.hard_limit, abs=2)
    assert marker["x"] - track["x"] == pytest.approx(
        track["width"] * expected.soft_limit / expected.hard_limit, abs=2
    )


def check_budget_outputs(page: Any, expected: Expected) -> int:
    """The final `%budget`: bar with the soft threshold, figures, the last compaction; the
    first `%budget` still shows its own moment (before the turns). Returns the effective
    tokens the final one shows."""
    from playwright.sync_api import expect

    expect(cell(page, COMPACT_CELL).locator(".jp-OutputArea-output").first).to_have_text(
        expected.result_line
    )
    assert RESULT_LINE.fullmatch(expected.result_line), expected.result_line

    last = budget_output(page, BUDGET_CELL)
    line = budget_line(expected.hard_limit, expected.soft_limit)
    expect(last.figures).to_contain_text(line)
    expect(last.figures).to_contain_text(f"Last compaction: {expected.result_line} · quality full")
    expect(last.figures).to_contain_text("Model: openai/gpt-4o")
    shown = line.search(last.figures.text_content() or "")
    assert shown is not None
    effective = int(shown.group(1).replace(",", ""))
    assert int(shown.group(2)) == half_up(100 * effective / expected.hard_limit)
    assert effective < expected.soft_limit  # the notebook stays below the soft threshold
    check_bar(last, effective, expected)

    # The first `%budget` ran before the turns: later magics left it as it was.
    first = budget_output(page, FIRST_BUDGET_CELL)
    expect(first.figures).to_contain_text("Last compaction: none on this path")
    before = line.search(first.figures.text_content() or "")
    assert before is not None and int(before.group(1).replace(",", "")) != effective
    check_bar(first, int(before.group(1).replace(",", "")), expected)
    return effective


def seen_lines(page: Any) -> list[Seen]:
    return [Seen(**item) for item in page.evaluate("window.sobaSeen")]


def check_live_lines(seen: list[Seen], sources: tuple[str, ...], result_line: str) -> str:
    """Each source showed the live barrier line, its percent rising (at most
    MAX_UPDATES_PER_S changes a second), then the result line. Returns a summary line per
    source: the percents seen and the longest wait between two updates."""
    summary = []
    for source in sources:
        shown = [item for item in seen if item.source == source]
        live = [item for item in shown if LIVE_LINE.match(item.text)]
        assert live, f"{source}: no live line 'Compacting context · NN%' in {shown}"
        percents = [int(LIVE_LINE.match(item.text).group(1)) for item in live]  # type: ignore[union-attr]
        assert percents == sorted(percents) and len(set(percents)) >= 2, (source, percents)
        after = shown[shown.index(live[-1]) + 1 :]
        assert after and after[0].text == result_line, (source, after)
        times = [item.t for item in live]
        assert all(
            sum(1 for t in times if start <= t < start + 1) <= MAX_UPDATES_PER_S for start in times
        ), (source, times)
        longest = max(b - a for a, b in zip(times, [*times[1:], after[0].t], strict=True))
        assert longest <= LIVE_REFRESH_S + LATENCY_SLACK_S, (source, times, after[0].t)
        summary.append(f"{source}: {percents} % → result, longest wait {longest:.2f} s")
    return "\n".join(summary)


def open_soba_panel(page: Any) -> Any:
    """Click the "soba budget" tab of JupyterLab's right sidebar."""
    page.locator(".jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id='soba-budget-panel']").click()
    panel = page.locator("#soba-budget-panel")
    panel.wait_for(state="visible")
    return panel


def save_screenshot(page: Any, path: Path) -> None:
    """The tool turn, the compaction and the monitor, with the sidebar panel open."""
    page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").click()  # more room
    page.set_viewport_size(SCREENSHOT_VIEWPORT)
    # The tool turn near the top, under the end of the answer before it.
    cell(page, TOOL_TURN_CELL).evaluate(
        """(node, above) => {
          node.scrollIntoView({block: 'start'});
          node.closest('.jp-WindowedPanel-outer').scrollTop -= above;
        }""",
        SCREENSHOT_CONTEXT_PX,
    )
    page.wait_for_timeout(SETTLE_MS)  # let the scroll and the relayout finish
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path))


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_inline_monitor_and_sidebar_in_jupyterlab(
    tmp_path: Path, root: Path, model: ScriptedModel
) -> None:
    require_browser()
    if not installed_data_dirs(SOBA_LABEXTENSION):
        pytest.skip(f"{SOBA_LABEXTENSION} is not built and installed ({LABEXTENSION_BUILD})")
    from playwright.sync_api import expect

    jupyter = tmp_path / "jupyter"
    env = isolated_env(jupyter, {TEST_KEY_ENV: TEST_KEY_VALUE})
    with jupyter_server("jupyterlab", jupyter, root, env) as server, browser_page(VIEWPORT) as page:
        page.goto(server.url(f"/lab/tree/{NOTEBOOK}"))
        panel = open_soba_panel(page)
        expect(panel).to_contain_text("Run %budget or %soba in this notebook")
        record_and_run_all(page)
        expected = wait_for_the_run(page, model, server)
        check_outputs(page)
        effective = check_budget_outputs(page, expected)

        # The sidebar shows the same budget and result line.
        hard, soft = f"{expected.hard_limit:,}", f"{expected.soft_limit:,}"
        expect(panel.locator(".soba-Budget-notebook")).to_have_text(NOTEBOOK)
        expect(panel.locator(".soba-Budget-figures")).to_have_text(
            f"{effective:,} / {hard} tokens · {half_up(100 * effective / expected.hard_limit)}%"
        )
        expect(panel.locator(".soba-Budget-legend")).to_have_text(
            f"soft threshold {soft} · hard limit {hard}"
        )
        expect(panel.locator(".soba-Budget-source .soba-Budget-value")).to_have_text(
            re.compile(r"^(provider usage|estimated)$")
        )
        expect(panel.locator(".soba-Budget-auto .soba-Budget-value")).to_have_text("on")
        result = panel.locator(".soba-Budget-result")
        expect(result).to_contain_text(expected.result_line)
        expect(result).not_to_contain_text("fallback")
        expect(result).to_have_attribute("data-degraded", "false")
        expect(panel.locator(".soba-Budget-live")).to_have_count(0)
        # The conversation: the turns run in cells, and the compaction's result line once,
        # where it happened (SPEC §18).
        expect(panel.locator("[data-soba-role='message'][data-soba-author='user']").first).to_be_visible()
        expect(panel.locator(".soba-Chat-line", has_text=expected.result_line)).to_have_count(1)

        print(
            check_live_lines(seen_lines(page), ("cell", "sidebar"), expected.result_line)
        )

        screenshot = os.environ.get(SCREENSHOT_ENV)
        if screenshot:
            save_screenshot(page, Path(screenshot))


@pytest.mark.timeout(120)
def test_inline_monitor_in_notebook_7(tmp_path: Path, root: Path, model: ScriptedModel) -> None:
    require_browser()
    pytest.importorskip(
        "notebook", minversion="7", reason="Notebook 7 is missing (pip install 'notebook>=7')"
    )
    from playwright.sync_api import expect

    jupyter = tmp_path / "jupyter"
    env = isolated_env(jupyter, {TEST_KEY_ENV: TEST_KEY_VALUE})
    with jupyter_server("notebook", jupyter, root, env) as server, browser_page(VIEWPORT) as page:
        page.goto(server.url(f"/notebooks/{NOTEBOOK}"))
        record_and_run_all(page)
        expected = wait_for_the_run(page, model, server)
        check_outputs(page)
        check_budget_outputs(page, expected)
        print(check_live_lines(seen_lines(page), ("cell",), expected.result_line))
        # The soba panel sits in Notebook 7's right panel, closed until the user opens it: the
        # monitor shows inline here.
        expect(page.locator("#soba-budget-panel")).to_be_hidden()


# -- the sidebar's controls -----------------------------------------------------------------

CONTROLS_NOTEBOOK = "controls.ipynb"
CONTROL_CELLS = (
    *CELLS[:COMPACT_CELL],
    "%soba Tell me a long story",
    'print("kernel alive", 6 * 7)',
    "%budget",
)
SLOW_CELL, ALIVE_CELL, LATER_BUDGET_CELL = 5, 6, 7
STORY = "Once upon a time there was a notebook. " * 60
STORY_CHUNKS, STORY_CHUNK_DELAY_S = 120, 0.2
"""The story streams for ~24 s unless cancelled."""
CAPSULE_FILE = "controls.capsule.md"
CAPSULE_ICON = "[data-icon='soba-nb:capsule']"
STATUS_LINE = re.compile(r"^soba (\d+\.\d)k / (\d+\.\d)k$")
CONTROL_TIMEOUT_MS = 45_000

RUN_CELLS = """
async ([path, first, last]) => {
  // Select cells first..last of the notebook at `path` and run them (not waiting).
  const app = window.jupyterapp;
  const notebook = [...app.shell.widgets('main')].find(w => w.context?.path === path);
  app.shell.activateById(notebook.id);
  await notebook.sessionContext.ready;
  notebook.content.activeCellIndex = first;
  notebook.content.deselectAll();
  notebook.content.extendContiguousSelectionTo(last);
  void app.commands.execute('notebook:run-cell');
}
"""
COMMAND = "([id, args]) => window.jupyterapp.commands.execute(id, args)"


def run_cells(page: Any, first: int, last: int) -> None:
    page.evaluate(RUN_CELLS, [CONTROLS_NOTEBOOK, first, last])


def check_status_item(page: Any, panel: Any) -> None:
    """The status bar reads `soba 1.2k / 5.0k`: the panel's effective / hardLimit."""
    from playwright.sync_api import expect

    status = page.locator(".soba-StatusItem")
    expect(status).to_have_text(STATUS_LINE)
    expect(status).to_have_attribute("data-level", "ok")
    figures = re.match(r"([\d,]+) / ([\d,]+) tokens", panel.locator(".soba-Budget-figures").inner_text())
    shown = STATUS_LINE.match(status.inner_text())
    assert figures and shown
    effective, hard = (int(figures.group(n).replace(",", "")) for n in (1, 2))
    assert float(shown.group(1)) == pytest.approx(effective / 1000, abs=0.051)
    assert float(shown.group(2)) == pytest.approx(hard / 1000, abs=0.051)


def toggle_auto(page: Any, panel: Any) -> None:
    """Auto-compact: on → off; the `%budget` run afterwards says off, the earlier one on."""
    from playwright.sync_api import expect

    toggle = panel.locator(".soba-Budget-autoToggle")
    expect(toggle).to_have_text("Auto-compact: on")
    expect(toggle).to_have_attribute("aria-checked", "true")
    toggle.click()
    expect(panel.locator(".soba-Budget-answer")).to_contain_text("auto compaction off")
    expect(toggle).to_have_text("Auto-compact: off")
    expect(toggle).to_have_attribute("aria-checked", "false")
    expect(panel.locator(".soba-Budget-auto .soba-Budget-value")).to_have_text("off")

    run_cells(page, LATER_BUDGET_CELL, LATER_BUDGET_CELL)
    expect(budget_output(page, LATER_BUDGET_CELL).figures).to_contain_text("· auto off")
    expect(budget_output(page, FIRST_BUDGET_CELL).figures).to_contain_text("· auto on")


def compact_now(page: Any, panel: Any, root: Path) -> str:
    """Compact now: the panel and the status bar follow the barrier, then the panel shows
    the result line of the capsule the transcript gained. Returns that line."""
    from playwright.sync_api import expect

    assert session_capsules(root, CONTROLS_NOTEBOOK) == []
    page.evaluate(RECORDER, None)
    panel.locator(".soba-Budget-compact").click()
    answer = panel.locator(".soba-Budget-answer")
    expect(answer).to_contain_text("Compacted (user) · ", timeout=CONTROL_TIMEOUT_MS)
    expect(answer).to_have_attribute("data-ok", "true")
    [capsule] = session_capsules(root, CONTROLS_NOTEBOOK)
    line = capsule_line(capsule)
    assert answer.inner_text().splitlines()[0] == line
    expect(panel.locator(".soba-Budget-result .soba-Budget-line")).to_have_text(line)

    seen = seen_lines(page)
    print(check_live_lines(seen, ("sidebar",), line))
    status = [item.text for item in seen if item.source == "status"]
    assert any(re.fullmatch(r"soba compacting \d+%", text) for text in status), status
    return line


def export_and_open_capsule(page: Any, panel: Any, root: Path) -> None:
    """Export capsule…: the dialog offers `controls.capsule.md`; the file is written, and
    opens as rendered Markdown with the capsule icon (tab and file browser)."""
    from playwright.sync_api import expect

    panel.locator(".soba-Budget-export").click()
    field = page.locator(".jp-Dialog input")
    expect(field).to_have_value(CAPSULE_FILE)
    page.locator(".jp-Dialog .jp-mod-accept").click()
    expect(panel.locator(".soba-Budget-answer")).to_contain_text(
        f"to {CAPSULE_FILE}", timeout=CONTROL_TIMEOUT_MS
    )
    assert (root / CAPSULE_FILE).read_text(encoding="utf-8").startswith("---")

    page.evaluate(COMMAND, ["docmanager:open", {"path": CAPSULE_FILE}])
    tab = page.locator(".jp-MainAreaWidget-tab, .lm-DockPanel-tabBar .lm-TabBar-tab", has_text=CAPSULE_FILE)
    expect(tab.locator(CAPSULE_ICON).first).to_be_visible()
    viewer = page.locator(".jp-MarkdownViewer .jp-RenderedMarkdown")
    expect(viewer.locator("h2", has_text="Goal and constraints")).to_be_visible()
    page.evaluate(COMMAND, ["filebrowser:refresh", {}])
    listed = page.locator(".jp-DirListing-item", has_text=CAPSULE_FILE)
    expect(listed.locator(CAPSULE_ICON)).to_be_visible()


def cancel_a_slow_turn(page: Any, panel: Any) -> None:
    """Cancel while `%soba` streams: the cell ends cancelled and the kernel lives on."""
    from playwright.sync_api import expect

    run_cells(page, SLOW_CELL, SLOW_CELL)
    slow = cell(page, SLOW_CELL).locator(".jp-OutputArea")
    expect(slow).to_contain_text("Once upon a time")
    cancel = panel.locator(".soba-Budget-cancel")
    expect(cancel).to_be_enabled()
    cancel.click()
    expect(slow).to_contain_text("cancelled: interrupted while the answer streamed")
    expect(slow).not_to_contain_text("Traceback")
    run_cells(page, ALIVE_CELL, ALIVE_CELL)
    expect(cell(page, ALIVE_CELL).locator(".jp-OutputArea")).to_have_text("kernel alive 42")


@pytest.mark.timeout(120)
def test_sidebar_controls_in_jupyterlab(tmp_path: Path, root: Path, model: ScriptedModel) -> None:
    require_browser()
    if not installed_data_dirs(SOBA_LABEXTENSION):
        pytest.skip(f"{SOBA_LABEXTENSION} is not built and installed ({LABEXTENSION_BUILD})")
    from playwright.sync_api import expect

    write_code_notebook(root / CONTROLS_NOTEBOOK, CONTROL_CELLS)
    model.script(text(STORY, chunks=STORY_CHUNKS, chunk_delay_s=STORY_CHUNK_DELAY_S))
    jupyter = tmp_path / "jupyter"
    env = isolated_env(jupyter, {TEST_KEY_ENV: TEST_KEY_VALUE})
    with (
        jupyter_server("jupyterlab", jupyter, root, env, [EXPOSE_APP]) as server,
        browser_page(VIEWPORT) as page,
    ):
        page.goto(server.url(f"/lab/tree/{CONTROLS_NOTEBOOK}"))
        wait_for_kernel_idle(page)
        panel = open_soba_panel(page)
        run_cells(page, 0, TOOL_TURN_CELL)
        expect(cell(page, TOOL_TURN_CELL).locator(".jp-RenderedMarkdown")).to_contain_text(
            "The total is 49 units"
        )
        expect(panel.locator(".soba-Budget-notebook")).to_have_text(CONTROLS_NOTEBOOK)
        expect(panel.locator(".soba-Budget-auto .soba-Budget-value")).to_have_text("on")
        check_status_item(page, panel)

        toggle_auto(page, panel)
        compact_now(page, panel, server.root)
        export_and_open_capsule(page, panel, server.root)
        cancel_a_slow_turn(page, panel)
