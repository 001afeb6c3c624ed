"""An answer cut at `maxOutputTokens`, said to the user and to the model (SPEC §17).

A server stops an answer at the request's `max_tokens` with finish `length`, or goes on past
it until soba stops the stream (`ModelResponse.stopped_at_tokens`, counted in tokens). Either
way the cell says so in one line, and a tool call whose arguments were still arriving — a
`write_file` of a 70 KB file, say — is never run on half its arguments nor dropped silently:
it is recorded with a result that tells the model why it did not run and what to do instead,
and the turn goes on so the model can make smaller calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from soba_nb.messages import ToolCall
from soba_nb.providers.base import ModelResponse
from soba_nb.providers.waits import LENGTH_FINISH

LIMIT_SETTING = "model.maxOutputTokens"
CUT_SUMMARY = "arguments cut off at the output limit"
"""What a cut call's receipt says of its arguments."""


KEPT_HEAD_CHARS = 400
"""Of a cut call's arguments, this much is kept in the transcript and model input: the call
is shown for what it was, not replayed whole in every later request (70 KB is 17,000 tokens)."""


@dataclass(frozen=True)
class CutAnswer:
    """What an answer cut at its limit means for the turn."""

    notices: tuple[str, ...] = ()
    """One line each for the cell."""
    results: dict[str, str] = field(default_factory=dict)
    """The result each cut call gets instead of running (by call id)."""

    def recorded(self, response: ModelResponse) -> ModelResponse:
        """`response` as the transcript keeps it: each cut call's arguments as a small JSON
        object saying they were cut, with their head."""
        if not self.results:
            return response
        calls = [
            ToolCall(
                id=call.id,
                name=call.name,
                arguments=json.dumps(
                    {"cut_off_after_chars": len(call.arguments), "head": call.arguments[:KEPT_HEAD_CHARS]},
                    ensure_ascii=False,
                ),
            )
            if call.id in self.results
            else call
            for call in response.tool_calls
        ]
        return response.model_copy(update={"tool_calls": calls})


def cut_answer(response: ModelResponse, max_output_tokens: int) -> CutAnswer:
    """The notices and the results of the cut calls of `response`; nothing for an answer that
    ended on its own."""
    if response.finish_reason != LENGTH_FINISH:
        return CutAnswer()
    limit = f"{LIMIT_SETTING} ({max_output_tokens:,} tokens)"
    if response.stopped_at_tokens is not None:
        notices = [
            f"the server streamed on past {limit}: soba stopped the answer there "
            f"(about {response.stopped_at_tokens:,} tokens)"
        ]
    else:
        notices = [f"the answer reached {limit} and was cut there"]
    results: dict[str, str] = {}
    for call in response.tool_calls:
        if _whole(call):
            continue
        chars = len(call.arguments)
        results[call.id] = (
            f"[not run: this call's arguments were cut off at {limit} after {chars:,} characters. "
            "Make smaller calls: build long content with code in the python tool (a loop that writes "
            "the file), or write it in parts (write_file, then edit_file replacing its last line with "
            "that line and the next part).]"
        )
        notices.append(
            f"{call.name or 'a tool call'} was not run: its arguments passed {limit} and were cut off after "
            f"{chars:,} characters; the model is told to make smaller calls"
        )
    return CutAnswer(tuple(notices), results)


def _whole(call: ToolCall) -> bool:
    """The call's arguments arrived whole: a JSON object (what every tool takes)."""
    try:
        return isinstance(json.loads(call.arguments), dict)
    except (ValueError, RecursionError):
        return False
