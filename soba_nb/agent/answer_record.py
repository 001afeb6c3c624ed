"""What the turn loop records of an answer: the message, its calls and its usage figure, and
whether that figure may measure the budget (`usage_evidence`: a server that cuts prompts
silently, or a figure that is no count)."""

from __future__ import annotations

from collections.abc import Callable

from soba_nb.agent.cost import EMBEDDED_PROVIDER
from soba_nb.agent.events import AgentEvent, Notice
from soba_nb.agent.output_limit import CutAnswer
from soba_nb.agent.session import AgentSession
from soba_nb.agent.usage_evidence import cut_prompt, is_count, received_tokens
from soba_nb.compaction.model_input import ModelInput, fixed_tokens
from soba_nb.providers.base import ModelResponse
from soba_nb.transcript.entries import MessageEntry, ToolCallEntry
from soba_nb.transcript.estimated import estimated_usage

Emit = Callable[[AgentEvent], None]


def record_answer(
    session: AgentSession,
    response: ModelResponse,
    sent: int,
    *,
    truncated: bool,
    cut: CutAnswer,
    operation_id: str,
    sent_images: int,
) -> None:
    """The answer, its calls (cut ones shortened) and its usage (priced on what came)."""
    transcript = session.transcript
    transcript.append(MessageEntry(role="assistant", content=response.text))
    for call in cut.recorded(response).tool_calls:
        transcript.append(ToolCallEntry(call_id=call.id, name=call.name, arguments=call.arguments))
    if response.usage is not None:
        transcript.append(
            response.usage.entry(
                provider=response.provider,
                model=response.model,
                operation="inference",
                operation_id=operation_id,
                sent_tokens=sent,
                sent_image_tokens=sent_images,
                truncated=truncated,
            )
        )
    elif session.config.model.provider != EMBEDDED_PROVIDER:
        # The server sent no usage: priced from our own counts, marked so (SPEC §11, §16).
        # (The embedded model reports none and costs nothing.)
        transcript.append(
            estimated_usage(
                sent,
                received_tokens(response.text, response.tool_calls, session.counter),
                provider=response.provider,
                model=response.model,
                operation_id=operation_id,
            )
        )


def warn_once(session: AgentSession, emit: Emit, kind: str, text: str) -> None:
    """A warning about the server's figures, shown once per session (not at every turn)."""
    if session.first_time(f"usage: {kind}"):
        emit(Notice(text, "warning"))


def truncated(
    session: AgentSession, emit: Emit, response: ModelResponse, model_input: ModelInput, sent: int, sent_images: int
) -> bool:
    """Whether the usage figure must not measure the budget: it is no count of a request,
    or the server's counts stopped growing with what was sent — it cuts prompts silently
    at that ceiling (`usage_evidence`): warn, and learn the window it really uses."""
    usage = response.usage
    if usage is None:
        return False
    system_alone = fixed_tokens(model_input.system, (), session.counter)
    if not is_count(usage.input_tokens, system_alone):
        warn_once(
            session, emit, "not a count",
            f"the server counted {usage.input_tokens:,} input tokens where about {sent:,} were sent: "
            "not a count to trust (less than the system prompt alone); the budget keeps its own"
        )
        return True
    text = sent - sent_images  # images are the server's own business (SPEC §17)
    conversation = text - fixed_tokens(model_input.system, model_input.tools, session.counter)
    found = cut_prompt(session.transcript.path_view(), usage.input_tokens, text=text, messages_text=conversation)
    if found is None:
        return False  # another tokenizer, a gateway's own count: evidence, not a cut
    cut_at, how = found
    if not session.plausible_window(cut_at):
        warn_once(
            session, emit, "ceiling below the fixed part",
            f"the server counted {cut_at:,} input tokens where about {sent:,} were sent: a cut prompt, at a "
            "size less than the system prompt and tools take: not taken as the window; the budget keeps its own"
        )
        return True
    session.learn_window(cut_at, "truncation", f"the server's counts stopped growing at {cut_at:,} tokens")
    emit(
        Notice(
            f"the server counted {usage.input_tokens:,} input tokens where about {sent:,} were sent, {how}: it cut the prompt silently "
            "(Ollama does when num_ctx is smaller), so the answer may have missed part of the context. The window is now "
            f"{session.limits.context_window:,} for this session; give the server a larger context "
            "(Ollama: OLLAMA_CONTEXT_LENGTH or PARAMETER num_ctx) to use more",
            "warning",
        )
    )
    for note in session.notes_to_show():  # a window learned now may bring one
        emit(Notice(note, "warning"))
    return True
