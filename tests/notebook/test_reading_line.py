"""The cell shows that a local model is reading a long prompt, and for how long (SPEC §17).

Rich output: the live status line "the model is reading 160 tokens · 2 s", updated while the
server reads and cleared by the answer. Plain output (terminal IPython): the same line when the
reading begins and every 30 s after, never a stream of seconds. Both fed by a real provider or
a real `%soba` turn against the loopback server with a 1 s idle limit.
"""

from __future__ import annotations

import io
import re
import time
from typing import Any

from IPython.utils.capture import capture_output
from llm_server import LLMServer, text

from soba_nb.agent.events import TextDelta, Waiting
from soba_nb.config import ModelSettings
from soba_nb.notebook.render import PLAIN_READING_EVERY_S, TurnRenderer
from soba_nb.providers.base import ChatMessage, ModelRequest
from soba_nb.providers.feed import WAITING
from soba_nb.providers.openai import OpenAIProvider
from soba_nb.providers.reading import reading_status

READ_S = 2.5
"""How long the loopback server 'reads' before its status line: past a 1 s idle limit."""
READING_LINE = re.compile(r"the model is reading ([\d,]+) tokens · (\d+) s")


class RecordingDisplay:
    """Stands in for `IPython.display.display`: every object shown or updated, as its
    mime bundle (what the frontend would get)."""

    def __init__(self) -> None:
        self.bundles: list[dict[str, str]] = []

    def __call__(self, obj: Any, display_id: bool = False) -> Any:
        self.bundles.append(obj._repr_mimebundle_())
        return self

    def update(self, obj: Any) -> None:
        self.bundles.append(obj._repr_mimebundle_())


def test_rich_output_shows_the_model_reading_the_prompt_and_for_how_long():
    display = RecordingDisplay()
    renderer = TurnRenderer(rich=True, display=display)
    request = ModelRequest(
        system="s", messages=[ChatMessage(role="user", content="hi")], max_output_tokens=16, operation_id="op_1",
        input_tokens=160,
    )  # fmt: skip
    with LLMServer() as server:
        server.script(text("Read.", delay_s=READ_S))
        settings = ModelSettings(base_url=server.url, api_key_env="SOBA_TEST_UNSET_KEY")
        started = time.monotonic()
        with OpenAIProvider(settings, idle_timeout_s=1.0) as provider:
            provider.complete(
                request,
                on_text=lambda piece: renderer.on_event(TextDelta(piece)),
                on_wait=lambda status: renderer.on_event(Waiting(status, time.monotonic() - started)),
            )
    plain = [bundle["text/plain"] for bundle in display.bundles]
    seconds = [int(match[2]) for line in plain if (match := READING_LINE.fullmatch(line)) and match[1] == "160"]
    assert seconds[0] == 0 and seconds[-1] >= READ_S - 1  # updated while it read, past the idle limit
    shown = [b for b in display.bundles if READING_LINE.fullmatch(b["text/plain"])]
    assert all("the model is reading 160 tokens" in b["text/html"] for b in shown)
    assert {"text/html": "", "text/plain": ""} in display.bundles  # cleared when the answer came
    assert plain[-1] == "Read."


def test_plain_output_prints_the_reading_line_when_it_begins_and_every_30_s():
    out = io.StringIO()
    renderer = TurnRenderer(rich=False, stream=out)
    for elapsed in (0.1, 0.6, 12.0, 29.0, 30.2, 45.0, 61.0):
        renderer.on_event(Waiting(reading_status(12_400), elapsed))
    renderer.on_event(TextDelta("Here."))
    renderer.on_event(Waiting(WAITING, 0.1))  # an ordinary wait prints nothing, as before
    assert out.getvalue().splitlines() == [
        "the model is reading 12,400 tokens · 0 s",
        "the model is reading 12,400 tokens · 30 s",
        "the model is reading 12,400 tokens · 61 s",
        "Here.",
    ]
    assert PLAIN_READING_EVERY_S == 30


def test_a_turn_with_a_local_model_reading_past_the_idle_limit_completes_and_says_so(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.idle_timeout_s = 1")
    scripted.script(text("I have read it all.", delay_s=READ_S))
    started = time.monotonic()
    with capture_output() as out:
        ip.run_line_magic("soba", "read this long notebook")
    took = time.monotonic() - started
    assert "I have read it all." in out.stdout and "failed" not in out.stdout
    match = READING_LINE.search(out.stdout)
    assert match is not None and int(match[1].replace(",", "")) > 40  # the turn's own count of its prompt
    assert took > READ_S and len(scripted.inference_requests()) == 1
