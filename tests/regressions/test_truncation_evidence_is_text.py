"""Issue 41 item 1 (SPEC §17 "Usage evidence and images"): the silent-truncation evidence
compares the growth of text, never image estimates; one figure under half of the messages' text
is a cut prompt at once.

Found: a vision session against a server that counts text only (many do, or count images their
own way) made soba conclude "its counts have stopped growing … it cut the prompt silently",
lower the window from 24,000 to 2,042 and refuse the turn. And Ollama's `num_ctx` cut of a long
first request (21,000 tokens reported as 8,000) passed without a word since the evidence asked
for two steps. Each case against the loopback server, counting in its own way.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import pytest
from conftest import write_soba_json
from disagreeing import DisagreeingModel
from IPython.utils.capture import capture_output
from llm_server import RecordedRequest, Reply, text, tool_calls
from PIL import Image

from soba_nb.images import ImageRule, image_tokens
from soba_nb.tokens import get_encoding
from soba_nb.transcript.entries import UsageEntry, WindowEntry

WINDOW = 24_000
SHOW_TWO_IMAGES = (
    "import io\nfrom IPython.display import Image, display\nfrom PIL import Image as P\n"
    "for color in ('red', 'blue'):\n"
    "    out = io.BytesIO(); P.new('RGB', (1024, 1024), color).save(out, format='PNG')\n"
    "    display(Image(data=out.getvalue()))\n"
)
"""Two 1024×1024 images a turn: 765 tokens each by OpenAI's tiles, far more than the text."""


class ImageCounting(DisagreeingModel):
    """A server counting the text of every message and tool its own way (o200k) and images by
    `rule`: `None` counts none (many local servers), `TILES` as OpenAI does."""

    def __init__(self, server: Any, rule: ImageRule | None):
        super().__init__(server, window=WINDOW)
        self.rule = rule

    def count(self, request: RecordedRequest) -> int:
        encoding = get_encoding("o200k_base")
        body = request.body if isinstance(request.body, dict) else {}
        tokens = len(encoding.encode(str(body.get("tools") or "")))
        for message in body.get("messages") or []:
            content = message.get("content")
            parts = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
            for part in parts:
                if part.get("type") == "text":
                    tokens += len(encoding.encode(part["text"]))
                elif part.get("type") == "image_url" and self.rule is not None:
                    data = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
                    tokens += image_tokens(self.rule, *Image.open(io.BytesIO(data)).size)
            for call in message.get("tool_calls") or []:
                tokens += len(encoding.encode(str(call)))
        return tokens


def agent(ip: Any) -> Any:
    return ip.magics_manager.registry["SobaMagics"].agent


def truncation_windows(ip: Any) -> list[WindowEntry]:
    return [e for e in agent(ip).transcript.entries if isinstance(e, WindowEntry) and e.source == "truncation"]


@pytest.mark.parametrize("rule", [None, ImageRule.TILES], ids=["server counts no images", "server counts OpenAI tiles"])
def test_images_are_never_taken_for_a_cut_prompt(ip, nb_dir, llm_server, rule):
    soba_json = write_soba_json(nb_dir, llm_server.url, {"model": {"contextWindow": WINDOW, "maxOutputTokens": 1000}})
    config = json.loads(soba_json.read_text(encoding="utf-8"))
    soba_json.write_text(json.dumps({**config, "notebook": {"maxImagesPerRequest": 16}}), encoding="utf-8")
    model = ImageCounting(llm_server, rule)
    outputs = []
    for index in range(5):
        model.script(tool_calls(("python", {"code": SHOW_TWO_IMAGES})), text(f"Plots {index} look fine."))
        with capture_output() as out:
            ip.run_line_magic("soba", f"draw the plots for region {index}")
        outputs.append(out.stdout + out.stderr)
    assert not any("cut the prompt" in out or "failed" in out for out in outputs), outputs
    assert truncation_windows(ip) == [] and agent(ip).limits.context_window == WINDOW
    usages = [e for e in agent(ip).transcript.entries if isinstance(e, UsageEntry) and e.operation == "inference"]
    with_images = [u for u in usages if u.sent_image_tokens]
    # The requests carried up to 10 images of 765 tokens each, recorded apart from their text.
    assert with_images and max(u.sent_image_tokens for u in with_images) >= 5 * 765
    images_sent = max(len(r.images()) for r in llm_server.requests)
    assert images_sent >= 8
    if rule is None:  # the server's counts stay far below what we sent: images are its business
        assert min(u.input_tokens / u.sent_tokens for u in with_images[-3:]) < 0.6


def test_ollamas_cut_of_a_long_first_request_is_caught_on_its_first_figure(ip, nb_dir, llm_server):
    """About 24,000 tokens sent, 8,000 reported (num_ctx): under half of the messages' text alone, a
    cut prompt at once; the window is learned and the next turn fits it."""
    write_soba_json(nb_dir, llm_server.url, {"model": {"contextWindow": 40_000, "maxOutputTokens": 1000}})
    model = DisagreeingModel(llm_server, window=8000, kind="ollama")  # Ollama: cuts, reports what it kept
    notes = "\n".join(f"row {n}: sensor {n % 17} read {n * 7 % 101} degrees at minute {n}" for n in range(1400))
    model.script(text("The readings look stable."))
    with capture_output() as out:
        ip.run_line_magic("soba", f"Summarise these readings:\n{notes}")
    shown = out.stdout + out.stderr
    [first] = [e for e in agent(ip).transcript.entries if isinstance(e, UsageEntry)]
    assert first.sent_tokens > 20_000 and first.input_tokens == 8000 and first.truncated
    assert "the server counted 8,000 input tokens where about" in shown
    assert "less than half of the messages' text alone: it cut the prompt silently" in shown
    [window] = truncation_windows(ip)
    assert window.context_window == 8000 and agent(ip).limits.context_window == 8000
    model.script(text("Still stable."))
    with capture_output() as out:
        ip.run_line_magic("soba", "and now?")
    assert "Still stable." in out.stdout, out.stdout + out.stderr
    assert model.judged[-1][1] <= 8000  # the next request fit the window it really has


def test_a_short_request_is_never_judged_by_one_figure(ip, nb_dir, llm_server):
    """Under `TRUNCATION_MIN_TOKENS` of messages' text, a low figure (a gateway's count, another
    tokenizer) is evidence, not a cut."""
    write_soba_json(nb_dir, llm_server.url, {"model": {"contextWindow": WINDOW, "maxOutputTokens": 1000}})
    model = DisagreeingModel(llm_server, window=WINDOW, factor=0.3)
    model.script(text("Hi."))
    with capture_output() as out:
        ip.run_line_magic("soba", "hello")
    assert "cut the prompt" not in out.stdout + out.stderr and truncation_windows(ip) == []


def test_a_cut_at_once_below_the_fixed_part_is_not_taken_as_a_window(ip, nb_dir, scripted):
    """SPEC §16's absurd limits under the same evidence rule: a figure under half of the text
    that is also less than the system prompt and tools take is no window (a count, but not one
    a session can live in): said once, not learned."""
    write_soba_json(nb_dir, scripted.server.url, {"model": {"contextWindow": WINDOW, "maxOutputTokens": 1000}})
    notes = "\n".join(f"row {n}: value {n * 13 % 97}" for n in range(900))
    scripted.script(Reply(text="Done.", input_tokens=700))
    with capture_output() as out:
        ip.run_line_magic("soba", f"Summarise:\n{notes}")
    shown = out.stdout + out.stderr
    assert truncation_windows(ip) == [] and agent(ip).limits.context_window == WINDOW
    assert "the server counted 700 input tokens where about" in shown
    assert "a cut prompt, at a size less than the system prompt and tools take: not taken as the window" in shown
