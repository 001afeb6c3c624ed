"""SPEC §18: talking to soba in JupyterLab's sidebar — a real JupyterLab 4, Debian's chromium
driven by Playwright, a real kernel, and the loopback LLM server scripted (and slow where a
turn must be running).

- The prompt box: a request typed there and sent with Enter runs as a turn in the notebook's
  kernel (soba loaded quietly if the notebook had not); the server receives it; the panel shows
  the user's message, the streamed answer and the receipts; the notebook's cells are not
  touched; the transcript next to the notebook holds the turn.
- Steer: while a turn's `python` call sleeps, a message sent with `steer` reaches the model in
  the next request, after the call's result, as a user message; the call was not interrupted;
  the transcript marks it `steer: true`.
- Queue: Enter while the turn runs queues the request (`queue-item`); it runs after the turn.
- Fix: a failed cell gets `fix-cell`; clicking it runs `/fix --cell N`; the model's `edit_cell`
  shows as a diff on that cell; `accept-edit` replaces the cell's source (not run), and the
  decision is an entry the next request carries.

One server for the module (temporary root, random token, its own Jupyter folders); every
server, kernel and browser is stopped. Skipped, with the reason, without chromium, Playwright
or the built labextension. Screenshots of each state go into the test's temporary folder (and,
with SOBA_SCREENSHOTS=DIR, into DIR: docs/notebook.md shows them).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_KEY_ENV, TEST_KEY_VALUE, ScriptedModel, write_soba_json
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
from llm_server import LLMServer, RecordedRequest, text, tool_calls

VIEWPORT: Any = {"width": 1400, "height": 900}
LAYER: dict[str, Any] = {"model": {"contextWindow": 32_000, "maxOutputTokens": 1_000}}
PAGE = "/lab/workspaces/{stem}/tree/{file}"


@dataclass(frozen=True)
class Served:
    server: JupyterServer
    model: ScriptedModel


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    require_browser()
    if not installed_data_dirs(SOBA_LABEXTENSION):
        pytest.skip(f"{SOBA_LABEXTENSION} is not built and installed ({LABEXTENSION_BUILD})")
    tmp = tmp_path_factory.mktemp("conversation")
    root = tmp / "root"
    root.mkdir()
    with LLMServer() as llm:
        write_soba_json(root, llm.url, LAYER)
        env = isolated_env(tmp / "jupyter", {TEST_KEY_ENV: TEST_KEY_VALUE})
        with jupyter_server("jupyterlab", tmp / "jupyter", root, env, [EXPOSE_APP]) as server:
            yield Served(server, ScriptedModel(llm))


def open_notebook(page: Any, served: Served, name: str, sources: tuple[str, ...]) -> Path:
    path = served.server.root / name
    write_code_notebook(path, sources)
    page.goto(served.server.url(PAGE.format(file=name, stem=Path(name).stem)))
    wait_for_kernel_idle(page)
    page.evaluate(KERNEL_READY, name)
    page.keyboard.press("Control+Alt+s")  # soba: ask in the sidebar
    page.locator("[data-soba-role='prompt']").wait_for()
    return path


KERNEL_READY = """
async (path) => {
  // The notebook's kernel is attached and ready (the idle indicator can come first).
  const app = window.jupyterapp;
  const panel = [...app.shell.widgets('main')].find(w => w.context?.path === path);
  await panel.sessionContext.ready;
  while (!panel.sessionContext.session?.kernel) {
    await new Promise(resolve => setTimeout(resolve, 100));
  }
}
"""


def screenshot(page: Any, tmp_path: Path, name: str) -> None:
    for folder in filter(None, (tmp_path, os.environ.get("SOBA_SCREENSHOTS"))):
        page.screenshot(path=str(Path(folder) / f"{name}.png"))


def user_texts(request: RecordedRequest) -> list[str]:
    """The user messages' text of a Chat Completions request."""
    found = []
    for message in request.body.get("messages", []):
        if message["role"] != "user":
            continue
        content = message["content"]
        found.append(content if isinstance(content, str) else " ".join(p.get("text", "") for p in content))
    return found


PLOT = (
    "import io\nfrom PIL import Image\nfrom IPython.display import Image as Shown, display\n"
    "buffer = io.BytesIO()\nImage.new('RGB', (40, 30), 'red').save(buffer, 'PNG')\n"
    "display(Shown(buffer.getvalue()))\nprint(sum(range(10)))"
)
"""A call that displays a 40×30 image and prints 45."""


def check_image_loaded(image: Any) -> None:
    from playwright.sync_api import expect

    expect(image).to_have_count(1)
    image.scroll_into_view_if_needed()
    expect(image).to_have_js_property("naturalWidth", 40)


def transcript_entries(notebook: Path) -> list[dict[str, Any]]:
    folder = notebook.with_suffix(".soba")
    files = sorted(folder.glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
    files = [f for f in files if f.name != "flight.jsonl"]
    assert files, f"no transcript in {folder}"
    return [json.loads(line) for line in files[-1].read_text(encoding="utf-8").splitlines()]


def saved_sources(page: Any, path: Path) -> list[str]:
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    deadline = time.monotonic() + 10
    while True:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        sources = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells]
        if time.monotonic() > deadline or cells:
            return sources
        time.sleep(0.2)


@pytest.mark.timeout(180)
def test_a_request_typed_in_the_sidebar_runs_as_a_turn_in_the_notebooks_kernel(served: Served, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    served.model.inference.clear()
    served.model.script(
        tool_calls(("python", {"code": PLOT})),
        text("The **sum** is 45 <img src=x onerror=alert(1)>.", chunks=4, chunk_delay_s=0.2),
    )
    before = len(served.model.inference_requests())
    with browser_page(VIEWPORT) as page:
        path = open_notebook(page, served, "typed.ipynb", ("x = 1",))
        prompt = page.locator("[data-soba-role='prompt']")
        prompt.fill("what is the sum of 0..9?")
        prompt.press("Enter")

        messages = page.locator("[data-soba-role='message']")
        expect(messages.and_(page.locator("[data-soba-author='user']"))).to_have_text("what is the sum of 0..9?")
        answer = page.locator("[data-soba-role='message'][data-soba-author='assistant']")
        expect(answer).to_contain_text("The sum is 45", timeout=UI_TIMEOUT_MS)
        expect(answer.locator("strong")).to_have_text("sum")  # Markdown, rendered
        expect(answer.locator("img")).to_have_count(0)  # no handler runs, no URL is fetched
        expect(answer).to_contain_text("[image not loaded: x]")
        receipt = page.locator("[data-soba-role='receipt']")
        expect(receipt).to_contain_text("python")
        expect(receipt).to_contain_text("45")
        check_image_loaded(receipt.locator("img"))  # the plot the call displayed, from this server
        screenshot(page, tmp_path, "sidebar-conversation")

        requests = served.model.inference_requests()[before:]
        assert len(requests) == 2
        assert user_texts(requests[0])[-1].endswith("what is the sum of 0..9?")
        assert saved_sources(page, path) == ["x = 1"]  # the notebook is not touched

        # A reload: the conversation comes back from the transcript.
        page.reload()
        wait_for_kernel_idle(page)
        page.keyboard.press("Control+Alt+s")
        expect(messages.and_(page.locator("[data-soba-author='user']"))).to_have_text("what is the sum of 0..9?")
        expect(answer).to_contain_text("The sum is 45")
        expect(answer.locator("img")).to_have_count(0)
        check_image_loaded(page.locator("[data-soba-role='receipt'] img"))
    entries = transcript_entries(path)
    users = [e for e in entries if e["type"] == "message" and e["role"] == "user"]
    assert users and users[-1]["content"].endswith("what is the sum of 0..9?")
    assert any(e["type"] == "tool_call" and e["name"] == "python" for e in entries)


@pytest.mark.timeout(240)
def test_steer_reaches_the_running_turn_at_its_next_tool_boundary_and_a_queued_request_runs_after(
    served: Served, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    served.model.inference.clear()
    served.model.script(
        tool_calls(("python", {"code": "import time\ntime.sleep(6)\nprint('slept')"})),
        text("Done: I used the median, as you asked."),
        text("The second request's answer."),
    )
    before = len(served.model.inference_requests())
    with browser_page(VIEWPORT) as page:
        path = open_notebook(page, served, "steer.ipynb", ("import time",))
        prompt = page.locator("[data-soba-role='prompt']")
        prompt.fill("compute the average of the sensor readings")
        prompt.press("Enter")
        receipt = page.locator("[data-soba-role='receipt']")
        expect(receipt).to_contain_text("running")

        prompt.fill("use the median instead")
        page.locator("[data-soba-role='steer']").click()
        prompt.fill("then plot the readings")
        prompt.press("Enter")
        queued = page.locator("[data-soba-role='queue-item']")
        expect(queued).to_have_count(1)
        expect(queued.locator("textarea")).to_have_value("then plot the readings")
        screenshot(page, tmp_path, "sidebar-steer-and-queue")

        expect(page.locator("[data-soba-role='message'][data-soba-steer='true']")).to_have_text(
            re.compile("use the median instead"), timeout=UI_TIMEOUT_MS
        )
        answers = page.locator("[data-soba-role='message'][data-soba-author='assistant']")
        expect(answers.last).to_contain_text("The second request's answer.", timeout=UI_TIMEOUT_MS)
        expect(queued).to_have_count(0)

    requests = served.model.inference_requests()[before:]
    assert len(requests) == 3
    second = requests[1].body["messages"]
    tool_index = max(i for i, m in enumerate(second) if m["role"] == "tool")
    assert "slept" in second[tool_index]["content"]  # the call ran to its end
    after_tool = [m for m in second[tool_index + 1 :] if m["role"] == "user"]
    assert after_tool and "use the median instead" in after_tool[-1]["content"]
    assert user_texts(requests[2])[-1].endswith("then plot the readings")
    entries = transcript_entries(path)
    steered = [e for e in entries if e["type"] == "message" and e.get("steer") is True]
    assert [e["content"] for e in steered] == ["use the median instead"]


FAILING = "sales = {'amount': [3, 4]}\nrevenue = sum(sales['revenue'])"
FIXED = "sales = {'amount': [3, 4]}\nrevenue = sum(sales['amount'])"


@pytest.mark.timeout(240)
def test_fix_on_a_failed_cell_proposes_an_edit_the_user_accepts(served: Served, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    served.model.inference.clear()
    before = len(served.model.inference_requests())
    with browser_page(VIEWPORT) as page:
        path = open_notebook(page, served, "fix.ipynb", ("%load_ext soba_nb", FAILING, "print('after')"))
        run_all_cells(page)
        fix = cell(page, 1).locator("[data-soba-role='fix-cell']")
        expect(fix).to_be_visible(timeout=UI_TIMEOUT_MS)
        count = int(fix.get_attribute("data-soba-count") or "0")
        served.model.script(
            tool_calls(("edit_cell", {"execution_count": count, "source": FIXED})),
            text("The column is `amount`: I proposed the corrected cell above."),
            text("ok"),
        )
        fix.click()
        diff = cell(page, 1).locator("[data-soba-role='edit-diff']")
        expect(diff).to_be_visible(timeout=UI_TIMEOUT_MS)
        expect(diff).to_contain_text("- revenue = sum(sales['revenue'])")
        expect(diff).to_contain_text("+ revenue = sum(sales['amount'])")
        screenshot(page, tmp_path, "fix-cell-edit-diff")
        wait_for_kernel_idle(page)
        cell(page, 1).locator("[data-soba-role='accept-edit']").click()
        expect(diff).to_have_count(0, timeout=UI_TIMEOUT_MS)
        sources = saved_sources(page, path)
        assert sources == ["%load_ext soba_nb", FIXED, "print('after')"]
        # The decision is an entry the next request carries.
        prompt = page.locator("[data-soba-role='prompt']")
        prompt.fill("thanks")
        prompt.press("Enter")
        expect(page.locator("[data-soba-role='message'][data-soba-author='assistant']").last).to_have_text(
            "ok", timeout=UI_TIMEOUT_MS
        )
    requests = served.model.inference_requests()[before:]
    assert f"In [{count}]" in " ".join(user_texts(requests[0]))
    assert any("accepted" in t and f"In [{count}]" in t for t in user_texts(requests[-1]))
    entries = transcript_entries(path)
    decisions = [e for e in entries if e["type"] == "message" and e.get("edit")]
    assert [d["edit"]["decision"] for d in decisions] == ["accepted"]


@pytest.mark.timeout(180)
def test_notebook_7_has_the_same_conversation_in_its_right_panel(served: Served, tmp_path: Path) -> None:
    pytest.importorskip("notebook", minversion="7", reason="Notebook 7 is missing (pip install 'notebook>=7')")
    from playwright.sync_api import expect

    root = served.server.root
    name = "seven.ipynb"
    write_code_notebook(root / name, ("y = 2",))
    served.model.inference.clear()
    served.model.script(text("Hello from Notebook 7's right panel."))
    before = len(served.model.inference_requests())
    jupyter = tmp_path / "jupyter7"
    env = isolated_env(jupyter, {TEST_KEY_ENV: TEST_KEY_VALUE})
    with jupyter_server("notebook", jupyter, root, env) as server, browser_page(VIEWPORT) as page:
        page.goto(server.url(f"/notebooks/{name}"))
        wait_for_kernel_idle(page)
        panel = page.locator("#soba-budget-panel")
        expect(panel).to_be_hidden()  # closed until the user opens it
        page.keyboard.press("Control+Alt+s")
        expect(panel).to_be_visible()
        prompt = panel.locator("[data-soba-role='prompt']")
        expect(prompt).to_be_focused()
        page.keyboard.type("say hello")
        page.keyboard.press("Enter")
        answer = panel.locator("[data-soba-role='message'][data-soba-author='assistant']")
        expect(answer).to_have_text("Hello from Notebook 7's right panel.", timeout=UI_TIMEOUT_MS)
        screenshot(page, tmp_path, "notebook7-right-panel")
    requests = served.model.inference_requests()[before:]
    assert len(requests) == 1 and user_texts(requests[0])[-1].endswith("say hello")


HIDING = 'print("plot the sales data")\n_ = """\n````\n<!--\n"""\nopen("PWNED3.txt", "w").close()'
"""Code that once hid its last line in a Markdown approval question (issue 40)."""


@pytest.mark.timeout(180)
def test_an_approval_question_is_answered_in_the_panel_and_shows_the_whole_call(served: Served, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    folder = served.server.root / "approve"
    folder.mkdir(exist_ok=True)
    config = json.loads((served.server.root / "soba.json").read_text())
    (folder / "soba.json").write_text(json.dumps({**config, "agent": {"approval": "all"}}))
    served.model.inference.clear()
    served.model.script(tool_calls(("python", {"code": HIDING})), text("Not run, as you said."))
    before = len(served.model.inference_requests())
    with browser_page(VIEWPORT) as page:
        open_notebook(page, served, "approve/ask.ipynb", ("z = 3",))
        prompt = page.locator("[data-soba-role='prompt']")
        prompt.fill("plot the sales data")
        prompt.press("Enter")
        question = page.locator("[data-soba-role='approval']")
        expect(question).to_be_visible(timeout=UI_TIMEOUT_MS)
        shown = page.locator("[data-soba-role='approval-call']").last
        expect(shown).to_be_visible()
        assert 'open("PWNED3.txt", "w").close()' in shown.inner_text()  # the whole call, as the browser shows it
        screenshot(page, tmp_path, "sidebar-approval")
        question.locator("[data-soba-role='decline']").click()
        expect(question).to_be_hidden()
        answer = page.locator("[data-soba-role='message'][data-soba-author='assistant']")
        expect(answer).to_have_text("Not run, as you said.", timeout=UI_TIMEOUT_MS)
        receipt = page.locator("[data-soba-role='receipt']").last
        expect(receipt).to_have_attribute("data-status", "declined")
        expect(receipt).to_contain_text("· declined")
    assert not (folder / "PWNED3.txt").exists()
    requests = served.model.inference_requests()[before:]
    result = [m for m in requests[1].body["messages"] if m["role"] == "tool"][-1]
    assert "declined" in result["content"]


@pytest.mark.timeout(180)
def test_with_two_notebooks_open_the_panel_follows_the_active_one(served: Served, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    served.model.inference.clear()
    served.model.script(text("Answer in first."), text("Answer in second."))
    with browser_page(VIEWPORT) as page:
        first = open_notebook(page, served, "first.ipynb", ("a = 1",))
        second = served.server.root / "second.ipynb"
        write_code_notebook(second, ("b = 2",))
        prompt = page.locator("[data-soba-role='prompt']")
        users = page.locator("[data-soba-role='message'][data-soba-author='user']")
        answers = page.locator("[data-soba-role='message'][data-soba-author='assistant']")
        prompt.fill("question for first")
        prompt.press("Enter")
        expect(answers).to_have_text(["Answer in first."], timeout=UI_TIMEOUT_MS)

        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:open', {path: 'second.ipynb'})")
        expect(page.locator(".soba-Budget-notebook")).to_have_text("second.ipynb")
        expect(users).to_have_count(0)  # the second notebook's conversation: empty so far
        prompt.fill("question for second")
        prompt.press("Enter")
        expect(answers).to_have_text(["Answer in second."], timeout=UI_TIMEOUT_MS)

        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:open', {path: 'first.ipynb'})")
        expect(page.locator(".soba-Budget-notebook")).to_have_text("first.ipynb")
        expect(users).to_have_text(["question for first"])
        expect(answers).to_have_text(["Answer in first."])
    # Each turn ran in its own notebook's kernel and session.
    for notebook, asked in ((first, "question for first"), (second, "question for second")):
        contents = [e["content"] for e in transcript_entries(notebook) if e["type"] == "message" and e["role"] == "user"]
        assert contents == [asked]
