"""A local model that reads a long prompt for more than a minute is not a stall at the default
idle limit of 60 s (issue 41 item 4, SPEC §17), against a real llama.cpp server on one thread.

Issue 41's "Done when": a llama.cpp server started with one thread and a long prompt (first
byte after more than 60 s) that completes, through a real `%soba` turn and with the idle limit
left at its default (`DEFAULT_IDLE_TIMEOUT_S`; the sibling test lowers it to 6 s).

The embedded model is too quick for that on its own: one thread reads its whole window of
8,192 tokens in about a minute on an idle machine, and a prompt must take longer than 60 s to
read but less than its allowance (1 s per 40 prompt tokens: under 205 s for a full window).
So the server reads 2 tokens at a time (`n_batch`), which makes reading slower (some 70
tokens a second, a laptop's pace for a 7B model) and its pace more even over the window, and the test first times a short prompt on it, then sizes the turn's
prompt to be read in about 80 s. A machine too fast or too loaded for that fails with its
figures, not a skip. The server's log says how long it read (llama.cpp's "prompt eval time"):
its first token, and so the first byte of the answer, cannot come sooner.
"""

from __future__ import annotations

import json
import math
import re
import time

import httpx
import pytest
from IPython.utils.capture import capture_output
from llama_server import MODEL_ALIAS, llama_cpp_server, require_llama_cpp

from soba_nb.providers.reading import LOCAL_READING_TOKENS_PER_S
from soba_nb.providers.waits import DEFAULT_IDLE_TIMEOUT_S

pytestmark = pytest.mark.timeout(600)
N_CTX = 8192
N_BATCH = 2
TARGET_READ_S = 85.0
SHORTEST_EXPECTED_S = 70.0
"""Below this expected read the first byte would not come clearly after the idle limit."""
ALLOWANCE_MARGIN = 1.5
"""The allowance must be at least this many times the expected read."""
CALIBRATION_SENTENCES = 100
"""About 1,100 tokens: read in 10–20 s here."""
QUADRATIC_TOKENS = 9_000
"""The pace's shape on this model at `N_BATCH`: reading T tokens takes c·(T + T²/9,000) s, the
T² part being attention to what was read before (fitted here from this test's own short and long
reads: 8,100–8,300 in three runs, 17,000 in a fourth, the short read's noise under load)."""
SERVER_OVERHEAD_TOKENS = 300
"""What the server reads besides the request: soba's system prompt in the chat template."""
OUR_OVERHEAD_TOKENS = 1200
"""What soba counts besides the request (1,181 in a clean-clone CI run): its system prompt and
the tool definitions, which this server's chat template does not render."""
OUR_TOKENS_PER_SERVER_TOKEN = 1.07
"""soba's count (o200k) of the request's sentences against SmolLM2's (1.065 in that run: 6,505 of
ours for 6,111 of the server's). With the older 1,800 and 0.9, a quick machine sized the prompt at
the longest and soba counted 7,686, over its hardLimit: the turn was refused, not read."""
LONGEST_OUR_TOKENS = 7400
"""What fits: soba's hardLimit is 8,192 - 32 - 512 = 7,648 of its tokens."""
PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
READING_LINE = re.compile(r"the model is reading ([\d,]+) tokens · (\d+) s")
COLOURS = ("red", "blue", "green", "amber", "grey", "white", "black", "golden")
ANIMALS = ("fox", "heron", "otter", "badger", "falcon", "hare", "wolf", "crane", "moth")
PLACES = ("river", "market", "harbour", "orchard", "station", "meadow", "library", "bridge", "quarry", "garden", "chapel")


def sentences(count: int) -> str:
    """English text that soba's tokenizer and the model's count alike (digits would not)."""
    return "\n".join(
        f"The {COLOURS[n % len(COLOURS)]} {ANIMALS[n % len(ANIMALS)]} walked to the {PLACES[n % len(PLACES)]} and back."
        for n in range(count)
    )


def reads(log_text: str) -> list[tuple[float, int]]:
    """Each prompt the server read: (seconds, tokens), from its log."""
    return [(float(ms) / 1000, int(tokens)) for ms, tokens in PROMPT_EVAL.findall(log_text)]


def read_s(pace: float, tokens: float) -> float:
    return pace * (tokens + tokens * tokens / QUADRATIC_TOKENS)


def tokens_read_in(pace: float, seconds: float) -> float:
    """The inverse of `read_s`: the prompt read in `seconds` at `pace`."""
    q = QUADRATIC_TOKENS
    return q / 2 * (math.sqrt(1 + 4 * seconds / (pace * q)) - 1)


def our_tokens(server_tokens: float) -> float:
    """soba's count of a prompt the server reads as `server_tokens`: the allowance's tokens."""
    return OUR_OVERHEAD_TOKENS + OUR_TOKENS_PER_SERVER_TOKEN * (server_tokens - SERVER_OVERHEAD_TOKENS)


def test_a_prompt_read_for_over_a_minute_completes_at_the_default_idle_limit(ip, nb_dir, tmp_path, figures):
    require_llama_cpp()
    log = tmp_path / "llama.log"
    with llama_cpp_server(N_CTX, log, n_threads=1, n_batch=N_BATCH) as url:
        # The pace of this server on this machine now: a short prompt, no prefix shared with soba's.
        calibration = {"model": MODEL_ALIAS, "prompt": sentences(CALIBRATION_SENTENCES), "max_tokens": 1}
        httpx.post(f"{url}/completions", json=calibration, timeout=120).raise_for_status()
        short_s, short_tokens = reads(log.read_text(errors="replace"))[-1]
        pace = short_s / (short_tokens + short_tokens**2 / QUADRATIC_TOKENS)
        per_sentence = short_tokens / CALIBRATION_SENTENCES
        longest = SERVER_OVERHEAD_TOKENS + (LONGEST_OUR_TOKENS - OUR_OVERHEAD_TOKENS) / OUR_TOKENS_PER_SERVER_TOKEN
        prompt_tokens = min(tokens_read_in(pace, TARGET_READ_S), longest)
        expected_s = read_s(pace, prompt_tokens)
        allowance_s = our_tokens(prompt_tokens) / LOCAL_READING_TOKENS_PER_S
        calibrated = (
            f"{short_tokens:,} tokens read in {short_s:.1f} s; {prompt_tokens:,.0f} tokens would take "
            f"{expected_s:.0f} s against an allowance of {allowance_s:.0f} s"
        )
        assert expected_s >= SHORTEST_EXPECTED_S, f"this machine reads too fast to pass 60 s clearly: {calibrated}"
        assert allowance_s >= ALLOWANCE_MARGIN * expected_s, f"this machine reads too slowly for the allowance: {calibrated}"

        count = round((prompt_tokens - SERVER_OVERHEAD_TOKENS) / per_sentence)
        request = f"Here are some notes:\n{sentences(count)}\nReply with the single word OK."
        config = {"model": {"provider": "openai", "name": MODEL_ALIAS, "baseUrl": url, "apiKeyEnv": "",
                            "contextWindow": N_CTX, "maxOutputTokens": 32}}  # fmt: skip
        (nb_dir / "soba.json").write_text(json.dumps(config))
        started = time.monotonic()
        with capture_output() as out:
            ip.run_line_magic("soba", request)
        took = time.monotonic() - started
    turn_reads = reads(log.read_text(errors="replace"))[1:]
    shown = [(int(tokens.replace(",", "")), int(elapsed)) for tokens, elapsed in READING_LINE.findall(out.stdout)]
    first_read_s, first_read_tokens = turn_reads[0] if turn_reads else (0.0, 0)
    figures.add(
        "local model reading past 60 s",
        f"llama.cpp on 1 thread, batches of {N_BATCH}: {calibrated}; read {first_read_tokens:,} tokens in "
        f"{first_read_s:.1f} s (allowance {shown[0][0] / LOCAL_READING_TOKENS_PER_S if shown else 0:.0f} s) · turn {took:.1f} s",
    )
    assert "failed" not in out.stdout, out.stdout[-600:]
    answer = out.stdout.rpartition(" s\n")[2].partition("completed · ")  # after the last reading line
    assert answer[0].strip() and answer[1], out.stdout[-600:]  # the model's answer, then the turn completed
    assert first_read_s > DEFAULT_IDLE_TIMEOUT_S + 5, f"the server read for {first_read_s:.1f} s only ({calibrated})"
    assert took > first_read_s
    assert shown, out.stdout[-600:]  # the cell said the model was reading…
    assert max(elapsed for _, elapsed in shown) >= DEFAULT_IDLE_TIMEOUT_S  # …and still said so past 60 s
