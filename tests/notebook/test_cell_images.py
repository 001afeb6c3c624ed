"""The user's own plots (SPEC §15, §10), through a real InteractiveShell under the inline
backend and the loopback server: a cell that prints a line and draws a pie chart reaches the
model as a cells block with its printed text and its `Out[n]` labelled apart and the image
named (`[displayed image/png W×H]`), and — for a model that takes images — the PNG itself, in
each wire format's own shape; newest first with the agent's own images under
`notebook.maxImagesPerRequest`; counted in the budget; named in the capsule after a compaction
and never sent again; an old transcript line with only `output` reads and renders as it did."""

from __future__ import annotations

import base64
import io
import json

import pytest
from conftest import write_soba_json
from llm_server import RecordedRequest, text, tool_calls
from PIL import Image

from soba_nb.compaction.cells_context import render_cells
from soba_nb.compaction.model_input import entry_tokens
from soba_nb.images import ImageRule, image_tokens
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CellsEntry,
    ToolResultEntry,
    UsageEntry,
    entry_from_json,
)

PIE = (
    "import matplotlib.pyplot as plt\n"
    "print('fastest: West')\n"
    "ax = plt.figure(figsize=(4, 3), dpi=50).gca()\n"
    "ax.pie([3, 2, 1], labels=['West', 'East', 'North'])\n"
    "ax"
)
AGENT_PLOT = "import matplotlib.pyplot as plt\nplt.figure(figsize=(3, 3), dpi=40)\nplt.plot([1, 3, 2])"
QUESTION = "why does my plot look wrong?"


def magics(ip):
    return ip.magics_manager.registry["SobaMagics"]


def cells_entries(ip) -> list[CellsEntry]:
    return [e for e in magics(ip).agent.transcript.path() if isinstance(e, CellsEntry)]


def configure(nb_dir, scripted, notebook: dict | None = None, **model) -> None:
    url = scripted.server.anthropic_url if model.get("provider") == "anthropic" else scripted.server.url
    path = write_soba_json(nb_dir, url, {"model": model})  # the model's own window: no compaction on the way
    if notebook is not None:
        layer = json.loads(path.read_text())
        layer["notebook"] = notebook
        path.write_text(json.dumps(layer))


@pytest.fixture
def inline(ip):
    """`%matplotlib inline`, as in a kernel (a bare shell has no GUI loop to enable)."""
    from matplotlib_inline import backend_inline

    ip.enable_gui = lambda gui=None: None
    backend_inline.configure_inline_support.current_backend = "unset"  # registered once per process
    ip.run_line_magic("matplotlib", "inline")
    return ip


def user_content(request: RecordedRequest) -> list[tuple[str, object]]:
    """Every part of the request's user messages, in order: ("text", str) or ("image", bytes),
    read from each wire format's own shape (Anthropic's images in a tool result left out)."""
    found: list[tuple[str, object]] = []
    key = "input" if request.wire == "responses" else "messages"
    for message in request.get(key) or []:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            found.append(("text", content))
            continue
        for part in content:
            kind = part.get("type")
            if kind in ("text", "input_text"):
                found.append(("text", part["text"]))
            elif kind == "image_url":
                found.append(("image", data_url_bytes(part["image_url"]["url"])))
            elif kind == "input_image":
                found.append(("image", data_url_bytes(part["image_url"])))
            elif kind == "image":
                assert part["source"]["type"] == "base64"
                found.append(("image", base64.b64decode(part["source"]["data"])))
    return found


def data_url_bytes(url: str) -> bytes:
    head, _, data = url.partition(",")
    assert head == "data:image/png;base64"
    return base64.b64decode(data)


def user_images(request: RecordedRequest) -> list[bytes]:
    return [data for kind, data in user_content(request) if kind == "image"]  # type: ignore[misc]


def user_text(request: RecordedRequest) -> str:
    return "\n".join(str(data) for kind, data in user_content(request) if kind == "text")


WIRES = {
    "chat_completions": {"name": "gpt-4o"},
    "anthropic": {"provider": "anthropic", "name": "claude-sonnet-4-5"},
    "responses": {"api": "responses", "name": "gpt-4.1"},
}


@pytest.mark.parametrize("wire", WIRES)
def test_the_users_pie_chart_is_named_and_sent_with_printed_and_out_apart(inline, nb_dir, scripted, wire):
    configure(nb_dir, scripted, **WIRES[wire])
    inline.run_cell(PIE, store_history=True)
    scripted.script(text("The labels overlap the wedges."))
    inline.run_line_magic("soba", QUESTION)

    [entry] = cells_entries(inline)
    [cell] = entry.cells
    [artifact] = cell.images
    kept = nb_dir / artifact.path
    width, height = Image.open(kept).size
    assert (artifact.mime, artifact.width, artifact.height) == ("image/png", width, height)
    assert artifact.path == f"analysis.soba/artifacts/{artifact.sha256}.png"
    assert (cell.printed, cell.output) == ("fastest: West", "<Axes: >")  # apart on disk too

    [request] = scripted.inference_requests()
    sent = user_text(request)
    assert f"printed:\nfastest: West\nOut[1]:\n<Axes: >\n[displayed image/png {width}×{height}]" in sent
    assert sent.index("[displayed image/png") < sent.index(QUESTION)
    [image] = user_images(request)
    assert image == kept.read_bytes()
    assert Image.open(io.BytesIO(image)).size == (width, height)
    # The image follows the block that names it, labelled with its cell.
    parts = user_content(request)
    at = next(i for i, (kind, _) in enumerate(parts) if kind == "image")
    assert parts[at - 1] == ("text", f"In [1]: displayed image/png ({width}×{height})")
    assert "[displayed image/png" in str(parts[at - 2][1])


def test_a_model_without_vision_gets_the_line_and_no_image(inline, nb_dir, scripted):
    configure(nb_dir, scripted, name="gpt-3.5-turbo")
    inline.run_cell(PIE, store_history=True)
    scripted.script(text("I cannot see it."))
    inline.run_line_magic("soba", QUESTION)
    [request] = scripted.inference_requests()
    [cell] = cells_entries(inline)[0].cells
    [artifact] = cell.images
    assert f"[displayed image/png {artifact.width}×{artifact.height}]" in user_text(request)
    assert user_images(request) == [] and request.images() == []
    assert all(isinstance(m["content"], str) for m in request["messages"])  # plain text, no parts


def test_only_the_newest_image_goes_over_the_users_and_the_agents(inline, nb_dir, scripted):
    """maxImagesPerRequest 1: the user's pie is sent until the agent's own plot is newer; the
    user's next plot, in the next turn's cells block, is newer again."""
    configure(nb_dir, scripted, notebook={"maxImagesPerRequest": 1})
    inline.run_cell(PIE, store_history=True)
    scripted.script(tool_calls(("python", {"code": AGENT_PLOT})), text("Redrawn."))
    inline.run_line_magic("soba", QUESTION)
    [cell] = cells_entries(inline)[0].cells
    users = (nb_dir / cell.images[0].path).read_bytes()
    results = [e for e in magics(inline).agent.transcript.path() if isinstance(e, ToolResultEntry)]
    assert not results[0].is_error, results[0].content
    [tool_result] = results
    agents = (nb_dir / tool_result.artifacts[0].path).read_bytes()
    first, second = scripted.inference_requests()
    assert [i.data for i in first.images()] == [users]
    assert [i.data for i in second.images()] == [agents]  # the newest; the pie is named only
    assert f"[displayed image/png {cell.images[0].width}×{cell.images[0].height}]" in user_text(second)

    inline.run_cell("plt.figure(figsize=(2, 2), dpi=30).gca().bar([1, 2], [3, 4])", store_history=True)
    scripted.script(text("Better."))
    inline.run_line_magic("soba", "and this one?")
    [newest] = cells_entries(inline)[-1].cells[0].images
    assert [i.data for i in scripted.inference_requests()[-1].images()] == [(nb_dir / newest.path).read_bytes()]


def test_with_room_for_all_they_go_in_the_order_of_the_conversation(inline, nb_dir, scripted):
    configure(nb_dir, scripted, notebook={"maxImagesPerRequest": 3})
    inline.run_cell(PIE, store_history=True)
    scripted.script(tool_calls(("python", {"code": AGENT_PLOT})), text("Redrawn."))
    inline.run_line_magic("soba", QUESTION)
    inline.run_cell("plt.figure(figsize=(2, 2), dpi=30).gca().bar([1, 2], [3, 4])", store_history=True)
    scripted.script(text("All three."))
    inline.run_line_magic("soba", "compare them")
    kept = all_images(magics(inline).agent)
    assert len(kept) == 3
    assert [i.data for i in scripted.inference_requests()[-1].images()] == [(nb_dir / a.path).read_bytes() for a in kept]


def test_the_budget_counts_the_users_image(inline, nb_dir, scripted):
    """The same cell and question cost the image's tokens more for a model that takes images —
    the image and the line naming it beside it (`In [1]: displayed image/png (W×H)`, text the
    request carries too) — in the request's count (`sentTokens`) and in the session's estimate."""
    inline.run_cell(PIE, store_history=True)
    figures = {}
    for vision in (True, False):
        configure(nb_dir, scripted, vision=vision)
        scripted.script(text("Seen."))
        inline.run_line_magic("soba", f"--new {QUESTION}")
        agent = magics(inline).agent
        [entry] = cells_entries(inline)
        [usage] = [e for e in agent.transcript.path() if isinstance(e, UsageEntry)]
        figures[vision] = (entry, usage.sent_tokens, agent.compactor.measure().estimated)
    entry = figures[True][0]
    [artifact] = entry.cells[0].images
    tokens = image_tokens(ImageRule.TILES, artifact.width, artifact.height)
    assert tokens == 255  # one 512-pixel tile
    counter = magics(inline).agent.counter
    assert entry_tokens(figures[False][0], counter) == counter.count_message("user", render_cells(entry))
    named = counter.count_text(f"In [1]: displayed image/png ({artifact.width}×{artifact.height})")
    assert figures[True][1] - figures[False][1] == tokens + named
    assert figures[True][2] - figures[False][2] == tokens + named


def test_an_old_cells_line_with_only_output_reads_and_renders_as_before():
    line = json.dumps(
        {
            "type": "cells", "id": "0a1b2c3d", "parentId": None, "timestamp": "2026-01-01T00:00:00.000Z",
            "cells": [{"executionCount": 11, "source": "df.plot.pie(y='sales')", "outcome": "ok", "error": None,
                       "output": "fastest: West\n<Axes: >\n[displayed: image/png]"}],
            "omitted": 0,
        }
    )  # fmt: skip
    entry = entry_from_json(line)
    assert isinstance(entry, CellsEntry)
    assert render_cells(entry) == (
        "Notebook cells run since the last request (newest last):\n\n"
        "In [11]:\n```python\ndf.plot.pie(y='sales')\n```\nOut[11]:\nfastest: West\n<Axes: >\n[displayed: image/png]"
    )
    counter = TokenCounter.for_model("openai", "gpt-4o")
    assert entry_tokens(entry, counter) == counter.count_message("user", render_cells(entry))


def test_an_image_that_cannot_be_kept_is_named_with_the_reason(inline, nb_dir, scripted):
    """A cell that only displays an image still says so; bytes that are no image are named
    with why they were not kept, and nothing is sent for them."""
    inline.run_cell(
        "from IPython.display import display\n"
        "import matplotlib.pyplot as plt\n"
        "display({'image/png': b'not a png at all', 'text/plain': 'broken'}, raw=True)\n"
        "plt.figure(figsize=(2, 2), dpi=30).gca().plot([1, 2])",
        store_history=True,
    )
    scripted.script(text("Seen."))
    inline.run_line_magic("soba", "what did I draw?")
    [cell] = cells_entries(inline)[0].cells
    [artifact] = cell.images
    assert cell.images_not_kept == ["image/png not kept: not a readable image (UnidentifiedImageError)"]
    [request] = scripted.inference_requests()
    sent = user_text(request)
    assert (
        f"[displayed image/png {artifact.width}×{artifact.height}]\n"
        "[displayed image/png not kept: not a readable image (UnidentifiedImageError)]"
    ) in sent
    assert len(user_images(request)) == 1


def test_a_cell_that_only_displays_a_plot_says_so(inline, nb_dir, scripted):
    inline.run_cell("import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 2), dpi=30).gca().plot([1, 2]);", store_history=True)
    scripted.script(text("A line."))
    inline.run_line_magic("soba", "what is this?")
    [cell] = cells_entries(inline)[0].cells
    [artifact] = cell.images
    assert cell.output is None and not cell.printed
    sent = user_text(scripted.inference_requests()[0])
    assert f"plot([1, 2]);\n```\n[displayed image/png {artifact.width}×{artifact.height}]" in sent
    assert "Out[1]" not in sent


def test_the_users_plot_is_named_in_the_capsule_and_never_sent_again(inline, nb_dir, scripted):
    inline.run_cell(PIE, store_history=True)
    scripted.script(text("A pie."), text("words " * 700), text("more " * 700))
    inline.run_line_magic("soba", QUESTION)
    inline.run_line_magic("soba", "tell me at length")
    inline.run_line_magic("soba", "and more")
    [artifact] = cells_entries(inline)[0].cells[0].images
    inline.run_line_magic("compact", "")
    agent = magics(inline).agent
    capsule = next(e for e in reversed(agent.transcript.path()) if isinstance(e, CapsuleEntry))
    artifacts_section = capsule.content.split("## Artifacts", 1)[1]
    assert f"{artifact.path} ({artifact.width}×{artifact.height} image displayed by the user's cell In [1])" in artifacts_section
    summaries = [r for r in scripted.server.requests if r.operation == "compaction"]
    assert summaries and all(r.images() == [] and "image_url" not in r.raw.decode() for r in summaries)
    scripted.script(text("Fine."))
    inline.run_line_magic("soba", "and now?")
    assert scripted.inference_requests()[-1].images() == []


def test_read_cells_names_the_users_plot(inline, nb_dir, scripted):
    inline.run_cell(PIE, store_history=True)
    scripted.script(tool_calls(("read_cells", {})), text("Seen."))
    inline.run_line_magic("soba", QUESTION)
    [artifact] = cells_entries(inline)[0].cells[0].images
    tool_message = next(m for m in scripted.inference_requests()[-1]["messages"] if m["role"] == "tool")
    assert f"printed:\nfastest: West\nOut[1]:\n<Axes: >\n[displayed image/png {artifact.width}×{artifact.height}]" in tool_message["content"]


def test_plots_rotating_out_of_the_request_are_no_sign_of_a_cut_prompt(inline, nb_dir, scripted):
    """The budget counts every image as if sent; the server counts only those sent. A request's
    own figure (`sentTokens`, compared with the server's to find a server that cuts prompts)
    leaves the others out: plots rotating out under maxImagesPerRequest 1 are no ceiling."""
    configure(nb_dir, scripted, notebook={"maxImagesPerRequest": 1})
    inline.run_cell(PIE, store_history=True)
    scripted.script(tool_calls(("python", {"code": AGENT_PLOT})), text("Redrawn."))
    inline.run_line_magic("soba", QUESTION)
    for size in (2, 3):
        inline.run_cell(f"plt.figure(figsize=({size}, 2), dpi=30).gca().bar([1, 2], [3, 4])", store_history=True)
        scripted.script(text("Better."))
        inline.run_line_magic("soba", "and this one?")
    agent = magics(inline).agent
    assert "truncated prompt" not in agent.limits.window_source and not any(getattr(e, "truncated", False) for e in agent.transcript.path())
    usages = [e for e in agent.transcript.path() if isinstance(e, UsageEntry)]
    assert len(usages) == 4 and all(len(r.images()) == 1 for r in scripted.inference_requests())
    # The last request named four images and carried one: its figure counts that one.
    tokens = [agent.counter.count_image(*Image.open(nb_dir / a.path).size) for a in all_images(agent)]
    assert len(tokens) == 4 and usages[-1].sent_tokens is not None
    assert agent.compactor.measure().estimated - usages[-1].sent_tokens >= sum(tokens[:3])
    scripted.script(text("Fine."))
    inline.run_line_magic("soba", "and now?")  # (it failed: a window learned from a "cut" prompt)
    assert scripted.inference_requests()[-1]["messages"][-1]["content"] == "and now?"


def all_images(agent) -> list:
    """Every image on the session's path, in order: the user's cells' and the calls'."""
    kept = []
    for entry in agent.transcript.path():
        if isinstance(entry, CellsEntry):
            kept += [image for cell in entry.cells for image in cell.images or ()]
        elif isinstance(entry, ToolResultEntry):
            kept += entry.artifacts or []
    return kept
