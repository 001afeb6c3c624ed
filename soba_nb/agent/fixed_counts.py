"""What an empty conversation costs — the system prompt, the tool schemas, the reply's priming
(`compaction.model_input.fixed_tokens`) — counted ahead for each counter that counts with an
encoding, and kept as data in `fixed_counts.json` beside this file.

A session opened without its counts (a transcript copied alone, `soba-nb budget` of an
artifact) counted these 5 KB again every time: 2.5 ms of a 13 ms `soba-nb budget` at 1,000
entries, or the encoder's whole load for text that is not plain. They are constants of
this version: `session_counter` primes each counter with the counts of its kind, keyed by
content (`model_input.fixed_key`), so a prompt or schema that differs from what was counted
finds no count and is counted. tests/agent/test_fixed_counts.py fails when the file is out of
date; `python -m soba_nb.agent.fixed_counts --write` writes it again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from soba_nb.agent.prompt import SHARED_PROMPT
from soba_nb.agent.tool_schemas import COMPACT_TOOL_SCHEMAS, TOOL_SCHEMAS
from soba_nb.compaction.model_input import fixed_key, fixed_tokens
from soba_nb.tokens import TokenCounter

COUNTS_FILE = Path(__file__).with_name("fixed_counts.json")

MODELS = (("openai", "gpt-4o"), ("openai", "gpt-4"), ("anthropic", "claude"))
"""One model of each kind of counter: o200k_base, cl100k_base, o200k_base times the fallback factor."""

_KNOWN: dict[str, dict[str, int]] | None = None


def kind(counter: TokenCounter) -> str:
    """What the counts depend on: the encoding and its factor (not the images' rule)."""
    return f"{counter.choice.encoding} x{counter.choice.factor:g}"


def prime(counter: TokenCounter) -> TokenCounter:
    """`counter`, knowing what an empty conversation costs when this version counted it for its kind."""
    global _KNOWN
    if _KNOWN is None:
        try:
            _KNOWN = json.loads(COUNTS_FILE.read_bytes())
        except (OSError, ValueError):  # a broken install: every count is made
            _KNOWN = {}
    known = _KNOWN.get(kind(counter)) if isinstance(_KNOWN, dict) else None
    if isinstance(known, dict):
        counter.prime(known)
    return counter


def counted() -> dict[str, dict[str, int]]:
    """The counts, made now: what `fixed_counts.json` holds."""
    counts: dict[str, dict[str, int]] = {}
    for provider, model in MODELS:
        counter = TokenCounter.for_model(provider, model)
        counts[kind(counter)] = {
            fixed_key(system, tools): fixed_tokens(system, tools, counter)
            for system in (SHARED_PROMPT,)
            for tools in (TOOL_SCHEMAS, COMPACT_TOOL_SCHEMAS, ())
        }
    return counts


def main(argv: list[str]) -> int:
    text = json.dumps(counted(), indent=2, sort_keys=True) + "\n"
    if argv == ["--write"]:
        COUNTS_FILE.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
