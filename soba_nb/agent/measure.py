"""What the preflight would measure of a transcript opened read-only (`soba-nb budget`,
`inspect`): the same counter, system prompt and tools as an open session, from what a
session keeps beside it (read, never written) — or, for a transcript copied without it, from
its last usage figure on. Nothing here binds a model or imports an HTTP client.
"""

from __future__ import annotations

from pathlib import Path

from soba_nb.agent.instructions import instructions_limit, read_instructions
from soba_nb.agent.limits import session_counter, session_limits, session_usage_ceiling
from soba_nb.agent.prompt import system_prompt
from soba_nb.agent.tool_schemas import TOOL_SCHEMAS, tool_schemas_for
from soba_nb.compaction.budget import BudgetTracker, Measurement
from soba_nb.compaction.budget_state import BudgetStateFile, states_to_offer
from soba_nb.compaction.instructions import with_instructions
from soba_nb.compaction.model_input import fixed_tokens
from soba_nb.config import SobaConfig
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.store import Transcript
from soba_nb.transcript.token_index import TokenIndex


def measure_recorded(
    transcript: Transcript,
    config: SobaConfig | None,
    counter: TokenCounter | None = None,
    *,
    project_root: Path | None = None,
) -> tuple[TokenCounter, Measurement]:
    """The counter and the measurement an open session would make of `transcript`'s path
    (its configuration's counter; `counter` when there is no configuration). The budget
    state and the counts beside the transcript are read, never written; without them the
    path is measured from its last usage figure on (the rest is counted if the measurement's
    `estimated` is read). `project_root`: the session's project folder, whose `AGENTS.md` the
    next request would carry as it is now (SPEC §19)."""
    if config is not None:
        counter = session_counter(config)
    assert counter is not None, "a counter or a configuration"
    saved = states_to_offer(BudgetStateFile(transcript.file), transcript.path_view(), counter)
    counter.backfill = TokenIndex.open(
        transcript.file, counter.key, writable=False, keys_of=transcript.own_ids
    ).read_counts
    recorded = transcript.config
    system = system_prompt(recorded.environment if recorded is not None else None)
    tools = TOOL_SCHEMAS
    if config is not None:
        hard_limit = session_limits(config, transcript, counter=counter).hard_limit
        tools = tool_schemas_for(hard_limit, fixed_tokens(system, TOOL_SCHEMAS, counter))
        if project_root is not None:
            found = read_instructions(project_root, counter, limit=instructions_limit(hard_limit)).instructions
            system = with_instructions(system, None if found is None else found.message)
    tracker = BudgetTracker(counter, fixed_tokens(system, tools, counter))
    if config is not None:
        tracker.distrust_usage_from(session_usage_ceiling(config, transcript, counter))
    tracker.offer(*saved)
    return counter, tracker.measure(transcript.path_view())
