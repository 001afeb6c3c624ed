"""A turn never waits longer than its limits, and a cancel is prompt, through the magics.

Found under attack: a server that stalled took 484 s to fail a turn, an endless stream 600 s.
"""

from __future__ import annotations

import threading
import time

from IPython.utils.capture import capture_output
from llm_server import pings, text


def test_a_stalling_server_fails_the_turn_at_the_idle_limit(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.idle_timeout_s = 1")
    scripted.script(text("late", delay_s=30), text("late", delay_s=30))
    started = time.monotonic()
    with capture_output() as out:
        ip.run_line_magic("soba", "hello?")
    took = time.monotonic() - started
    assert "no data from the server for 1 s" in out.stdout and "failed" in out.stdout
    assert took < 5
    scripted.script(text("Back."))
    with capture_output() as out:
        ip.run_line_magic("soba", "and now?")
    assert "Back." in out.stdout


def test_the_turn_has_one_total_deadline(ip, scripted):
    ip.run_line_magic("config", "SobaMagics.turn_timeout_s = 2")
    scripted.script(pings(0.05), pings(0.05), pings(0.05))
    started = time.monotonic()
    with capture_output() as out:
        ip.run_line_magic("soba", "anything?")
    assert time.monotonic() - started < 2 + 2
    assert "deadline of 2 s" in out.stdout or "waited 2 s" in out.stdout


def test_cancel_from_another_thread_ends_a_stalled_wait_within_a_second(ip, scripted):
    scripted.script(text("late", delay_s=30))
    magics = ip.magics_manager.registry["SobaMagics"]
    done = threading.Event()
    result: list[object] = []

    def turn() -> None:
        result.append(magics.run_prompt("slow one"))
        done.set()

    threading.Thread(target=turn, daemon=True).start()
    assert scripted.server.wait_until(lambda: len(scripted.inference_requests()) >= 1, timeout_s=5)
    cancelled_at = time.monotonic()
    with capture_output():
        ip.run_line_magic("soba", "--cancel")
    assert done.wait(timeout=5)
    assert time.monotonic() - cancelled_at < 1.5
    assert result[0].status == "cancelled"  # type: ignore[attr-defined]
