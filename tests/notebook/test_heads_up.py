"""SPEC §14: a heads-up before an automatic compaction.

With `auto` on, a `%soba` turn that ends past 85 % of the soft limit prints one line — how
close, that the next request may compact first (or will, when the trigger rules already
choose a compaction for the next preflight and its gates pass), `%compact FOCUS` to steer it,
`%auto_compact off` to avoid it — and the JupyterLab sidebar's snapshot carries the same line.
Not when auto is off, below 85 %, or when a compaction during the turn brought it below; once
per turn.

The decision (`soba_nb.compaction.heads_up`) is tested on its own; the magic through a real
`InteractiveShell` against the loopback LLM server, reading what the server was sent to check
that "will" and "may" tell the truth about the next request. The sidebar's part is the comm
message it receives (`snapshot.headsUp`); the panel showing it is tested in JupyterLab below
(skipped without the browser or the built labextension).
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import SMALL_LIMITS, TEST_KEY_ENV, TEST_KEY_VALUE, ScriptedModel, write_soba_json
from IPython.utils.capture import capture_output
from llm_server import LLMServer, text, tool_calls

from soba_nb.compaction.heads_up import HEADS_UP_RATIO, HeadsUp, heads_up
from soba_nb.compaction.triggers import LoopGuard, Thresholds, Trigger
from soba_nb.transcript.entries import CheckpointEntry

# -- the decision ---------------------------------------------------------------------------

WORKED = Thresholds(
    hard_limit=48_808,
    soft_limit=39_046,
    auto=True,
    compact_on_turn_complete=True,
    compact_on_milestone=True,
    min_tokens_for_auto_compact=32_000,
    min_reclaimable_tokens=12_000,
    min_savings_ratio=0.25,
    keep_recent_tokens=20_000,
)
"""SPEC §2's worked example with the default compaction settings."""
TURN = CheckpointEntry(kind="turn", intent=True)
"""What a finished turn records with `compactOnTurnComplete` (the intent)."""
STEER_AND_AVOID = "%compact FOCUS now to steer what it keeps, or %auto_compact off to avoid it"


def decide_at(
    effective: int,
    t: Thresholds = WORKED,
    intents: tuple[CheckpointEntry, ...] = (),
    guard: LoopGuard | None = None,
) -> HeadsUp | None:
    return heads_up(effective=effective, thresholds=t, intents=intents, guard=guard or LoopGuard())


def test_past_85_percent_the_line_says_how_close_and_how_to_steer_or_avoid():
    found = decide_at(36_200)
    assert found is not None and not found.certain
    assert found.line() == (
        "soba: context at 36,200 / 39,046 tokens (93% of the auto-compact threshold): "
        f"the next request may compact first — {STEER_AND_AVOID}"
    )


def test_below_85_percent_or_with_auto_off_there_is_none():
    threshold = HEADS_UP_RATIO * WORKED.soft_limit  # 33,189.1
    assert decide_at(int(threshold)) is None
    assert decide_at(int(threshold) + 1) is not None
    off = Thresholds(**{**_fields(WORKED), "auto": False})
    assert decide_at(38_000, off, (TURN,)) is None
    assert decide_at(50_000, off) is None  # even past the hard limit: auto off, no heads-up


def test_a_turn_intent_whose_gates_pass_makes_it_will():
    found = decide_at(36_200, intents=(TURN,))
    assert found is not None and found.trigger is Trigger.TURN_COMPLETE
    assert "the next request will compact first (turn_complete) — " + STEER_AND_AVOID in found.line()


def test_past_the_soft_limit_it_will_when_the_gates_pass_and_may_when_they_do_not():
    found = decide_at(40_000)
    assert found is not None and found.trigger is Trigger.AUTO_THRESHOLD
    assert found.line().startswith("soba: context at 40,000 / 39,046 tokens (102% of the auto-compact threshold)")
    # keepRecentTokens so large that the pre-generation ROI fails: no claim that it will.
    greedy = Thresholds(**{**_fields(WORKED), "keep_recent_tokens": 30_000})
    skipped = decide_at(40_000, greedy, (TURN,))
    assert skipped is not None and skipped.trigger is None
    assert "the next request may compact first" in skipped.line()


def test_a_paused_loop_guard_means_may():
    guard = LoopGuard(failures=3, tokens_at_last_attempt=39_500)
    found = decide_at(40_000, guard=guard)
    assert found is not None and found.trigger is None


def test_a_capsule_just_appended_does_not_stop_the_next_preflight():
    """The next preflight follows a new user message, so "a compaction just completed" no
    longer holds then: the heads-up judges that preflight, not this moment."""
    found = decide_at(40_000, guard=LoopGuard(just_completed=True))
    assert found is not None and found.trigger is Trigger.AUTO_THRESHOLD


def test_past_the_hard_limit_auto_off_is_not_offered_as_a_way_out():
    found = decide_at(49_000)
    assert found is not None and found.trigger is Trigger.HARD_LIMIT
    line = found.line()
    assert "past the hard limit (48,808), the next request will compact first whatever %auto_compact says" in line
    assert "to avoid it" not in line


def test_just_below_the_soft_limit_never_reads_100_percent():
    found = decide_at(39_045)
    assert found is not None and found.percent == 99


def _fields(t: Thresholds) -> dict[str, Any]:
    return {name: getattr(t, name) for name in t.__struct_fields__}


# -- the magic ------------------------------------------------------------------------------

WINDOW = {"contextWindow": 16_000, "maxOutputTokens": 4_000}
"""With SMALL_LIMITS' compaction settings: hardLimit 11,500, softLimit 9,200 (85 %: 7,820).
maxOutputTokens leaves room for long scripted answers (a stream far past it is cut)."""
SOFT_LIMIT = 9_200
NEAR = 8_300
"""Where a turn ends to be past 85 % of the soft limit (about 90 %), with room below it for a
tool call or two (a few hundred tokens each) before the soft limit itself."""
HEADS_UP = re.compile(
    rf"^soba: context at ([\d,]+) / {SOFT_LIMIT:,} tokens \((\d+)% of the auto-compact threshold\): "
    r"the next request (may|will) compact first.*$",
    re.MULTILINE,
)
SENTENCE = "The sales table has one row per order line, with its region and price. "
FRAMING = 20
"""What a short prompt and an answer's framing add besides the answer's text."""
FILL_TURNS = 4


def layer(**compaction: Any) -> dict[str, Any]:
    """The small window; the turns' own compactions only when a test asks for them."""
    settings = {**SMALL_LIMITS["compaction"], "compactOnTurnComplete": False, **compaction}
    return {"model": WINDOW, "compaction": settings}


@pytest.fixture(autouse=True)
def small_window(nb_dir: Path, llm_server: LLMServer) -> None:
    write_soba_json(nb_dir, llm_server.url, layer())


def magics(ip: Any) -> Any:
    return ip.magics_manager.registry["SobaMagics"]


def turn(ip: Any, scripted: ScriptedModel, *replies: Any, prompt: str = "go on") -> str:
    """One `%soba` turn with these scripted answers; what the cell printed."""
    scripted.script(*replies)
    with capture_output() as captured:
        ip.run_line_magic("soba", prompt)
    return captured.stdout


def operations(scripted: ScriptedModel) -> list[str]:
    return [r.operation for r in scripted.server.requests if r.operation]


def effective(ip: Any) -> int:
    return int(magics(ip).agent.compactor.measure().effective)


def answer_reaching(ip: Any, scripted: ScriptedModel, target: int) -> Any:
    """An answer long enough that the turn ends at about `target` tokens (a session is opened
    with a short turn first)."""
    if magics(ip).agent is None:
        turn(ip, scripted, text("Hello."), prompt="hello")
    agent = magics(ip).agent
    assert agent.compactor.thresholds.soft_limit == SOFT_LIMIT
    per_sentence = agent.counter.count_text(SENTENCE * 10) / 10
    return text(SENTENCE * round((target - effective(ip) - FRAMING) / per_sentence), chunks=2)


def near(ip: Any, scripted: ScriptedModel, target: int = NEAR, *, then: dict[str, Any] | None = None) -> str:
    """Turns that end the session at about `target` tokens, past 85 % of the soft limit, in
    steps of a few answers (so a compaction has turns before its kept window to replace);
    the last turn's output. `then`: soba.json's compaction settings for the last turn."""
    if magics(ip).agent is None:
        turn(ip, scripted, text("Hello."), prompt="hello")
    start = effective(ip)
    for step in range(1, FILL_TURNS):
        stop = start + (target - start) * step // FILL_TURNS
        turn(ip, scripted, answer_reaching(ip, scripted, stop), prompt=f"part {step}")
    if then is not None:
        agent = magics(ip).agent
        write_soba_json(agent.notebook_folder, agent.config.model.base_url, layer(**then))
    return turn(ip, scripted, answer_reaching(ip, scripted, target), prompt="tell me more")


def test_a_turn_ending_past_85_percent_prints_may_once_and_the_next_request_does_not_compact(
    ip, scripted: ScriptedModel
):
    first = turn(ip, scripted, answer_reaching(ip, scripted, 5_000), prompt="first")
    assert HEADS_UP.search(first) is None  # about 54 %: below 85 %
    # A turn of two requests (a tool call, then the answer): one line all the same.
    out = turn(
        ip, scripted, tool_calls(("python", {"code": "1 + 1"})), answer_reaching(ip, scripted, NEAR - 300),
        prompt="second",
    )  # fmt: skip
    found = HEADS_UP.findall(out)
    assert len(found) == 1, out
    tokens, percent, verb = found[0]
    now = effective(ip)
    assert int(tokens.replace(",", "")) == now
    assert HEADS_UP_RATIO * SOFT_LIMIT <= now < SOFT_LIMIT and int(percent) == round(100 * now / SOFT_LIMIT)
    assert verb == "may"  # no turn intent, below the soft limit: nothing is chosen yet
    assert out.rstrip().endswith(STEER_AND_AVOID)  # the turn's last line
    # It said "may", and indeed: the next request went out without a compaction first.
    before = len(operations(scripted))
    turn(ip, scripted, text("ok"), prompt="short")
    assert operations(scripted)[before:] == ["inference"]


def test_will_is_said_when_the_turn_intent_will_compact_and_then_it_does(ip, scripted: ScriptedModel):
    """With compactOnTurnComplete (the default; off while the session fills, so the filling
    turns do not compact) the finished turn records an intent whose gates pass, so the line
    says "will" — and the next request compacts first, after which that turn ends below 85 %
    with no line (a compaction brought it below)."""
    out = near(ip, scripted, then={"compactOnTurnComplete": True})
    [line] = [m.group(0) for m in HEADS_UP.finditer(out)]
    assert "the next request will compact first (turn_complete) — " + STEER_AND_AVOID in line
    before = len(operations(scripted))
    after = turn(ip, scripted, text("ok"), prompt="next")
    assert operations(scripted)[before:] == ["compaction", "inference"]
    assert "Compacted (turn_complete)" in after
    assert effective(ip) < HEADS_UP_RATIO * SOFT_LIMIT
    assert HEADS_UP.search(after) is None


def test_below_85_percent_nothing_is_printed(ip, scripted: ScriptedModel):
    for index, target in enumerate((2_000, 4_000, 7_300)):
        out = turn(ip, scripted, answer_reaching(ip, scripted, target), prompt=f"turn {index}")
        assert "auto-compact threshold" not in out
    assert 7_000 < effective(ip) < HEADS_UP_RATIO * SOFT_LIMIT


def test_with_auto_compact_off_nothing_is_printed(ip, scripted: ScriptedModel):
    with capture_output():
        ip.run_line_magic("auto_compact", "off")
    out = near(ip, scripted)
    assert effective(ip) >= HEADS_UP_RATIO * SOFT_LIMIT
    assert "auto-compact threshold" not in out


def test_rich_output_shows_the_line_with_its_plain_text(ip, scripted: ScriptedModel):
    ip.run_line_magic("config", "SobaMagics.display_mode = 'rich'")
    turn(ip, scripted, text("Hello."), prompt="hello")  # a session (its first turn: no line)
    reply = answer_reaching(ip, scripted, NEAR)
    scripted.script(reply)
    with capture_output() as captured:
        ip.run_line_magic("soba", "tell me more")
    plain = [o.data.get("text/plain", "") for o in captured.outputs]
    lines = [p for p in plain if HEADS_UP.fullmatch(p)]
    assert len(lines) == 1
    [view] = [o for o in captured.outputs if o.data.get("text/plain") == lines[0]]
    assert html.escape(lines[0]) in view.data["text/html"]


# -- the sidebar's message ------------------------------------------------------------------


def recorded_snapshots(ip: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    magics(ip).sidebar.send = lambda message: sent.append(message) or True
    return sent


def test_the_sidebar_snapshot_carries_the_same_line_after_the_turn_and_none_during_it(ip, scripted: ScriptedModel):
    sent = recorded_snapshots(ip)
    near(ip, scripted, 7_950)
    assert sent[-1]["headsUp"] is not None  # the session is past 85 % between turns
    del sent[:]
    slow = "import time\ntime.sleep(0.6)\n'done'"
    out = turn(
        ip, scripted,
        tool_calls(("python", {"code": slow})), tool_calls(("python", {"code": slow})), text("Both ran."),
        prompt="third",
    )  # fmt: skip
    assert operations(scripted).count("compaction") == 0
    snapshots = [m for m in sent if m["type"] == "snapshot"]
    [line] = [m.group(0) for m in HEADS_UP.finditer(out)]
    assert snapshots[-1]["headsUp"] == line  # the panel says what the cell said
    during = snapshots[1:-1]
    assert during, "the sidebar follows a turn while it runs"
    assert all(m["effective"] >= HEADS_UP_RATIO * SOFT_LIMIT for m in during)
    assert all(m["headsUp"] is None for m in during)  # worded for a turn's end, not said inside one

    # %auto_compact off avoids it: the panel's heads-up goes with it.
    with capture_output():
        ip.run_line_magic("auto_compact", "off")
    assert sent[-1]["type"] == "snapshot" and sent[-1]["headsUp"] is None
    with capture_output():
        ip.run_line_magic("auto_compact", "on")
    assert sent[-1]["headsUp"] == line
    # %compact steers it: done now, it is no longer near.
    with capture_output():
        ip.run_line_magic("compact", "keep the word counts")
    assert sent[-1]["type"] == "snapshot" and sent[-1]["headsUp"] is None


# -- the panel in JupyterLab ----------------------------------------------------------------

PANEL_NOTEBOOK = "near.ipynb"
PANEL_CELLS = (
    "%load_ext soba_nb",
    "%soba hello",
    "%soba tell me more",
)
BROWSER_START = 1_300
"""About where the session stands after the short first turn (system prompt, tools, hello)."""
SENTENCE_TOKENS = 16
"""`SENTENCE`'s tokens (o200k_base, the test model's)."""
ROLE = "[data-soba-role='compaction-heads-up']"
VIEWPORT: Any = {"width": 1440, "height": 900}


@pytest.mark.timeout(150)
def test_the_jupyterlab_panel_shows_the_heads_up(tmp_path: Path, llm_server: LLMServer) -> None:
    from jupyter_support import (
        EXPOSE_APP,
        LABEXTENSION_BUILD,
        SOBA_LABEXTENSION,
        UI_TIMEOUT_MS,
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

    require_browser()
    if not installed_data_dirs(SOBA_LABEXTENSION):
        pytest.skip(f"{SOBA_LABEXTENSION} is not built and installed ({LABEXTENSION_BUILD})")
    from playwright.sync_api import expect

    scripted = ScriptedModel(llm_server)
    scripted.script(text("Hello."), text(SENTENCE * ((NEAR - BROWSER_START) // SENTENCE_TOKENS), chunks=2))
    root = tmp_path / "root"
    root.mkdir()
    write_soba_json(root, llm_server.url, layer())
    write_code_notebook(root / PANEL_NOTEBOOK, PANEL_CELLS)
    jupyter = tmp_path / "jupyter"
    env = isolated_env(jupyter, {TEST_KEY_ENV: TEST_KEY_VALUE})
    with jupyter_server("jupyterlab", jupyter, root, env, [EXPOSE_APP]) as server, browser_page(VIEWPORT) as page:
        page.goto(server.url(f"/lab/tree/{PANEL_NOTEBOOK}"))
        wait_for_kernel_idle(page)
        page.locator(".jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id='soba-budget-panel']").click()
        panel = page.locator("#soba-budget-panel")
        panel.wait_for(state="visible")
        run_all_cells(page)
        output = cell(page, 2).locator(".jp-OutputArea")
        expect(output).to_contain_text("auto-compact threshold", timeout=UI_TIMEOUT_MS)
        [line] = [m.group(0) for m in HEADS_UP.finditer(output.inner_text())]
        heads_up_node = panel.locator(ROLE)
        expect(heads_up_node).to_have_text(line)  # the same words as the cell
        expect(heads_up_node).to_have_class(re.compile(r"soba-Budget-headsUp"))

        # Auto-compact off (the panel's switch): no compaction is near any more.
        panel.locator(".soba-Budget-autoToggle").click()
        expect(panel.locator(".soba-Budget-auto .soba-Budget-value")).to_have_text("off")
        expect(heads_up_node).to_have_count(0)
