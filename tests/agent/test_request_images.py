"""Images as context (SPEC §10), through the magics of a real InteractiveShell: a real
matplotlib figure under the inline backend, drawn by the agent's `python` call, shows in the
cell, is kept as an artifact, listed in the `tool_result`, and reaches the loopback server
in each wire format's own shape — newest first within `notebook.maxImagesPerRequest`, resized
when large, never for a model that takes none, never again after a compaction."""

from __future__ import annotations

import io
import json
import os
import stat

import pytest
from conftest import SMALL_LIMITS, write_soba_json
from IPython.utils.capture import capture_output
from llm_server import text, tool_calls
from PIL import Image

from soba_nb.images import MAX_SENT_EDGE, ImageRule, image_tokens
from soba_nb.transcript.entries import CapsuleEntry, ToolResultEntry

PLOT = "import matplotlib.pyplot as plt\nplt.figure(figsize=(4, 3), dpi=50)\nplt.plot([1, 3, 2])\nplt.title('revenue')"


def magics(ip):
    return ip.magics_manager.registry["SobaMagics"]


def results(ip) -> list[ToolResultEntry]:
    return [e for e in magics(ip).agent.transcript.path() if isinstance(e, ToolResultEntry)]


def configure(nb_dir, scripted, **model) -> None:
    layer = {**SMALL_LIMITS, "model": {**SMALL_LIMITS.get("model", {}), **model}}
    write_soba_json(nb_dir, scripted.server.url if model.get("provider") != "anthropic" else scripted.server.anthropic_url, layer)


def png(width: int, height: int, color: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture
def inline(ip):
    """`%matplotlib inline`, as in a kernel (a bare shell has no GUI loop to enable; inline needs none)."""
    from matplotlib_inline import backend_inline

    ip.enable_gui = lambda gui=None: None
    # It registers the figure formats once per process (one kernel, one shell); each test's
    # shell is new.
    import matplotlib.pyplot as plt

    backend_inline.configure_inline_support.current_backend = "unset"
    ip.run_line_magic("matplotlib", "inline")
    plt.close("all")  # pyplot's figures live in the process: another test's would show here too
    yield ip
    plt.close("all")


def test_a_plot_is_shown_kept_listed_and_sent_to_a_model_that_sees(inline, nb_dir, scripted):
    ip = inline
    scripted.script(tool_calls(("python", {"code": PLOT})), text("The line peaks in the middle."), text("ok"))
    with capture_output() as shown:
        ip.run_line_magic("soba", "plot the revenue and tell me what you see")
    assert any("Figure" in str(output.data.get("text/plain")) for output in shown.outputs)  # shown in the cell
    [result] = results(ip)
    [artifact] = result.artifacts
    kept = nb_dir / artifact.path
    size = Image.open(kept).size  # (the inline backend crops the 200×150 figure to its drawing)
    assert artifact.mime == "image/png" and (artifact.width, artifact.height) == size and 100 < size[0] <= 200
    assert artifact.path == f"analysis.soba/artifacts/{artifact.sha256}.png"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert f"{artifact.path} · {size[0]}×{size[1]} PNG" in result.content
    on_disk = [json.loads(line) for line in magics(ip).agent.file.read_text().splitlines()]
    assert [e["artifacts"] for e in on_disk if e["type"] == "tool_result"] == [
        [{"path": artifact.path, "mime": "image/png", "sha256": artifact.sha256, "width": size[0], "height": size[1]}]
    ]
    answer = scripted.inference_requests()[1]  # the request after the call
    [image] = answer.images()
    assert image.shape == "image_url" and image.data == kept.read_bytes()
    messages = answer["messages"]
    assert messages[-1]["role"] == "user" and messages[-2]["role"] == "tool"  # right after the results
    # The plot counts in the budget: by OpenAI's tile rule (under 512×512: one tile).
    assert magics(ip).agent.counter.count_image(*size) == image_tokens(ImageRule.TILES, *size) == 255
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []  # flushed and closed with the call, as the cell would


def test_anthropic_gets_image_blocks_inside_the_tool_result(inline, nb_dir, scripted):
    configure(nb_dir, scripted, provider="anthropic", name="claude-sonnet-4-5")
    scripted.script(tool_calls(("python", {"code": PLOT})), text("Seen."))
    inline.run_line_magic("soba", "plot it")
    request = scripted.inference_requests()[1]
    assert request.wire == "anthropic"
    [image] = request.images()
    assert image.shape == "tool_result" and image.mime == "image/png"
    assert magics(inline).agent.counter.images is ImageRule.AREA


def test_responses_get_input_image_items(inline, nb_dir, scripted):
    configure(nb_dir, scripted, api="responses", name="gpt-4.1")
    scripted.script(tool_calls(("python", {"code": PLOT})), text("Seen."))
    inline.run_line_magic("soba", "plot it")
    request = scripted.inference_requests()[1]
    assert request.wire == "responses"
    [image] = request.images()
    assert image.shape == "input_image"
    kinds = [item.get("type") for item in request["input"]]
    assert kinds[-2:] == ["function_call_output", "message"]


def test_a_model_without_vision_gets_a_line_naming_the_image(inline, nb_dir, scripted):
    configure(nb_dir, scripted, name="gpt-3.5-turbo")
    scripted.script(tool_calls(("python", {"code": PLOT})), text("I cannot see it."))
    inline.run_line_magic("soba", "plot it")
    request = scripted.inference_requests()[1]
    assert request.images() == []
    [result] = results(inline)
    tool_message = next(m for m in request["messages"] if m["role"] == "tool")
    artifact = result.artifacts[0]
    assert f"{artifact.path} · {artifact.width}×{artifact.height} PNG" in tool_message["content"]
    assert magics(inline).agent.counter.count_image(200, 150) == 0
    # `model.vision: true` says otherwise: the model is sent the image.
    configure(nb_dir, scripted, name="my-local-vlm", vision=True)
    scripted.script(tool_calls(("python", {"code": PLOT})), text("Seen."))
    inline.run_line_magic("soba", "--new plot it again")
    assert len(scripted.inference_requests()[-1].images()) == 1


def test_a_model_switched_in_soba_json_counts_and_sees_as_the_new_model(inline, nb_dir, scripted):
    """The session's counter follows soba.json: a switch to a model that takes images (or
    counts with another tokenizer) reopens the session on its transcript, as a restart would,
    and the next request carries the image; switching back stops it. No turn is lost."""
    configure(nb_dir, scripted, name="gpt-3.5-turbo")
    scripted.script(tool_calls(("python", {"code": PLOT})), text("I cannot see it."))
    inline.run_line_magic("soba", "plot it")
    agent = magics(inline).agent
    file, before = agent.file, agent.counter.key
    assert scripted.inference_requests()[-1].images() == [] and "images" not in before
    configure(nb_dir, scripted, name="my-local-vlm", vision=True)
    scripted.script(tool_calls(("python", {"code": PLOT})), text("Seen."))
    inline.run_line_magic("soba", "plot it again")
    agent = magics(inline).agent
    assert agent.file == file and agent.counter.key == "o200k_base x1.15 images:tiles" != before
    assert len(scripted.inference_requests()[-1].images()) >= 1
    assert [e.content for e in agent.transcript.path() if getattr(e, "role", None) == "user"] == ["plot it", "plot it again"]
    configure(nb_dir, scripted, name="gpt-3.5-turbo")
    scripted.script(text("Back to text."))
    inline.run_line_magic("soba", "and now?")
    assert scripted.inference_requests()[-1].images() == [] and magics(inline).agent.counter.key == before


def test_only_the_newest_images_are_sent_and_a_large_one_is_resized(ip, nb_dir, scripted):
    configure(nb_dir, scripted, name="gpt-4o")
    layer = json.loads((nb_dir / "soba.json").read_text())
    layer["notebook"] = {"maxImagesPerRequest": 2}
    (nb_dir / "soba.json").write_text(json.dumps(layer))
    ip.user_ns["png"] = png
    shows = [
        "from IPython.display import Image, display\ndisplay(Image(png(64, 64, 'red')))",
        "from IPython.display import Image\nImage(png(64, 32, 'green'))",  # a last expression is shown too
        "from IPython.display import Image, display\ndisplay(Image(png(5000, 4000, 'blue')))",  # 20 megapixels
    ]
    scripted.script(*(tool_calls(("python", {"code": code})) for code in shows), text("Three images."))
    ip.run_line_magic("soba", "show me three images")
    assert [r.artifacts[0].width for r in results(ip)] == [64, 64, 5000]
    last = scripted.inference_requests()[-1]
    sent = last.images()
    assert len(sent) == 2  # the newest two, in order; the oldest is named in its result's text only
    sizes = [Image.open(io.BytesIO(image.data)).size for image in sent]
    assert sizes[0] == (64, 32) and max(sizes[1]) <= MAX_SENT_EDGE and sizes[1][0] / sizes[1][1] == pytest.approx(1.25, rel=0.01)
    first_result = next(m for m in last["messages"] if m["role"] == "tool")
    assert "64×64 PNG" in first_result["content"]


def test_images_summarized_are_named_in_the_capsule_and_never_resent(inline, nb_dir, scripted):
    scripted.script(tool_calls(("python", {"code": PLOT})), text("A plot."), text("words " * 700), text("more " * 700))
    inline.run_line_magic("soba", "plot it")
    inline.run_line_magic("soba", "tell me at length")
    inline.run_line_magic("soba", "and more")
    [result] = results(inline)
    inline.run_line_magic("compact", "")
    capsule = next(e for e in reversed(magics(inline).agent.transcript.path()) if isinstance(e, CapsuleEntry))
    artifacts_section = capsule.content.split("## Artifacts", 1)[1]
    assert result.artifacts[0].path in artifacts_section
    scripted.script(text("Fine."))
    inline.run_line_magic("soba", "and now?")
    assert scripted.inference_requests()[-1].images() == []


def test_a_link_planted_for_the_artifacts_folder_is_not_written_through(inline, nb_dir, scripted, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = nb_dir / "analysis.soba"
    folder.mkdir()
    os.symlink(outside, folder / "artifacts")
    scripted.script(tool_calls(("python", {"code": PLOT})), text("Done."))
    inline.run_line_magic("soba", "plot it")
    [result] = results(inline)
    assert not result.artifacts and "not kept: cannot write" in result.content
    assert list(outside.iterdir()) == []
    assert not result.is_error  # the call itself stands
