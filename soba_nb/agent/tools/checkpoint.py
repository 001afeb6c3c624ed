"""The `checkpoint(kind, note)` tool: the agent marks a milestone or a change of plan.

The session records the checkpoint and the pending compaction intent (SPEC §6) through the
`record_checkpoint` callback of the tool context; the tool reports the checkpoint id.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from soba_nb.agent.tools.base import CLIPPED, ToolArguments, ToolContext, ToolError, ToolOutcome

NAME = "checkpoint"
DESCRIPTION = (
    "Optional (soba records every turn itself): mark a milestone or a change of plan." + CLIPPED
)


class CheckpointArguments(ToolArguments):
    kind: Literal["milestone", "plan_pivot"]
    note: str = Field(description="What was reached, or why the plan changed.")


def summarize(arguments: CheckpointArguments) -> str:
    return f"checkpoint {arguments.kind}: {arguments.note.strip()}"


def run(arguments: CheckpointArguments, ctx: ToolContext) -> ToolOutcome:
    if ctx.record_checkpoint is None:
        raise ToolError("checkpoint: this session cannot record checkpoints")
    try:
        checkpoint_id = ctx.record_checkpoint(arguments.kind, arguments.note)
    except Exception as error:
        raise ToolError(f"checkpoint: could not record the checkpoint: {error}") from error
    return ToolOutcome(f"recorded {arguments.kind} checkpoint {checkpoint_id}")
