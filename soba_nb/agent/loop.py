"""The agent turn loop.

user message → preflight → inference → tool calls → results → preflight → … until a
final answer or the step limit. The preflight runs before every inference, so a long tool
loop cannot run past the window. Every message, tool call, tool result and usage figure
becomes a transcript entry; secrets (key shapes, values of KEY/TOKEN/SECRET/PASSWORD
environment variables) are redacted by the store on the way to disk (`soba_nb.redact`). A context overflow gets one recovery compaction and one retry;
the same oversized request is never sent twice.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from msgspec import UNSET

from soba_nb.agent.answer_record import record_answer, truncated
from soba_nb.agent.approval import DECLINED, NO_INPUT, ApprovalGate, Approver, describe_call
from soba_nb.agent.artifacts import keep_images
from soba_nb.agent.cost import CostCapExceeded
from soba_nb.agent.events import AgentEvent, Notice, TextDelta, ToolFinished, ToolStarted, Waiting
from soba_nb.agent.mcp import is_mcp_tool
from soba_nb.agent.mcp.calls import summarize_call
from soba_nb.agent.output_limit import CUT_SUMMARY, cut_answer
from soba_nb.agent.rebuild import note_missing
from soba_nb.agent.receipts import result_preview
from soba_nb.agent.request_images import sent_image_tokens, unsent_image_tokens, with_images
from soba_nb.agent.session import AgentSession
from soba_nb.agent.steering import take_inbox
from soba_nb.agent.tools import ToolContext, run_tool, summarize_arguments
from soba_nb.agent.tools.base import DisplayCapture, NotebookAccess
from soba_nb.agent.vault import FileVault
from soba_nb.compaction.cells_context import fit_cells
from soba_nb.compaction.compactor import HardLimitExceeded
from soba_nb.compaction.model_input import ModelInput
from soba_nb.compaction.outcomes import CompactionResult, Outcome
from soba_nb.compaction.triggers import TurnState
from soba_nb.providers.base import ModelRequest, ModelResponse, ToolCall
from soba_nb.providers.errors import Cancelled, ContextOverflowError, ProviderError
from soba_nb.transcript.entries import (
    ApprovalEntry,
    ApprovalMode,
    CellRecord,
    CellsEntry,
    MessageEntry,
    ToolResultEntry,
)
from soba_nb.transcript.store import TranscriptWriteError

MAX_COUNT_RATIO = 4.0
"""Tokenizers differ by tens of percent, not by multiples: a server's count of a refused
request more than this many times ours is not a count of that request, and sizing the retry
on it would refuse every retry."""
DEFAULT_MAX_STEPS = 25
"""Inference requests per turn before the loop stops with a clear message."""
DEFAULT_TURN_TIMEOUT_S = 600.0
"""All the waiting on the model one turn may do, every request and retry together
(`%config SobaMagics.turn_timeout_s`); tools run on their own limits."""
CANCELLED_RESULT = "[cancelled: the turn was interrupted before this call ran]"


@dataclass
class TurnResult:
    """How a turn ended."""

    status: str
    """"completed", "cancelled", "failed" or "step_limit"."""
    answer: str = ""
    message: str = ""
    steps: int = 0
    compactions: list[CompactionResult] = field(default_factory=list)
    checkpoint_id: str | None = None
    """The `turn` checkpoint a completed turn recorded (`%rewind` returns there)."""


EventSink = Callable[[AgentEvent], None]
Prompt = str | Callable[[CellsEntry | None], str]
"""A turn's request: its text, or a function of the cells block appended ahead of it (None:
no block) — `/fix` names a failed cell the block carries and carries one it does not."""


def _noop(_: AgentEvent) -> None:
    return None


class TurnRunner:
    """Runs one turn of a session; `run(prompt)` returns a `TurnResult`."""

    def __init__(
        self,
        session: AgentSession,
        *,
        on_event: EventSink | None = None,
        cancel: threading.Event | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
        turn_timeout_s: float = DEFAULT_TURN_TIMEOUT_S,
    ):
        self.session = session
        self.turn_timeout_s = turn_timeout_s
        self._model_time_left = turn_timeout_s
        self.emit = on_event or _noop
        self.cancel = cancel or threading.Event()
        self.max_steps = max_steps
        self.turn = TurnState()
        self.result = TurnResult("completed")
        self._overflow_recovered = False
        self.notebook: NotebookAccess | None = None
        """The notebook tools' access (None outside a notebook: they say so)."""
        self.displays: DisplayCapture | None = None
        """How the `python` tool sees the images a call displays (None: it sees none)."""
        self.approvals: ApprovalGate | None = None
        """Which calls ask the user first, and how (None: none do)."""
        self.transform: Callable[[str], str] | None = None
        """The shell's input transformation the `python` tool runs code through (None: plain Python)."""
        self.deadline = time.monotonic() + turn_timeout_s
        """When the turn's time is up (set again as `run` starts): the `python` tool's default limit."""
        self._retry_ceiling: int | None = None
        """After an overflow that stated the limit: the most the retry may be on our scale."""
        self._operation_id = ""
        """The latest inference request's `X-Soba-Operation-Id` (its usage entry names it)."""
        self._unsent_images = 0
        """Tokens of the images the latest request named but did not carry (`unsent_image_tokens`)."""
        self._sent_images = 0  # our estimate of the images it carried
        self.mcp = True
        """The MCP servers' tools are offered this turn (`%soba --no-mcp`: not)."""
        self.instructions = True
        """The project's `AGENTS.md` is sent this turn (`%soba --no-instructions`: not)."""

    def run(self, prompt: Prompt, cells: Sequence[CellRecord] = (), typed: str | None = None) -> TurnResult:
        self.deadline = time.monotonic() + self.turn_timeout_s
        session = self.session
        session.ensure_summarizer()
        session.refresh_environment()
        session.refresh_limits(ask_server=True)
        said = session.refresh_instructions(send=self.instructions)  # read fresh: it may have been edited
        if said is not None and session.first_time(said):
            self.emit(Notice(said, "warning"))
        for line in session.use_mcp(self.mcp):  # a server that failed: one line, the turn goes on
            self.emit(Notice(line, "warning"))
        self._show_new_notes()
        listener = self.emit
        session.compactor.listeners.append(listener)
        try:
            if (missing := note_missing(session)) is not None:
                self.emit(Notice(missing, "warning"))
            block = fit_cells(cells, session.config.notebook.context_tokens, session.counter)
            if block is not None:
                session.transcript.append(block)
            text = prompt(block) if callable(prompt) else prompt
            take_inbox(session.layout.inbox, session.transcript, self.emit)  # sent while idle: before the request
            session.transcript.append(MessageEntry(role="user", content=text, typed=typed))
            return self._loop()
        except KeyboardInterrupt:
            self.cancel.set()
            return self._end("cancelled", "interrupted; the transcript is consistent and the next %soba works")
        except TranscriptWriteError as exc:  # a full disk, a deleted transcript: one line, nothing lost
            return self._end("failed", str(exc).splitlines()[0])
        finally:
            session.compactor.listeners.remove(listener)
            if not self.instructions:  # left out for this turn only: `%budget` sees the next request's
                session.refresh_instructions()

    def _show_new_notes(self) -> None:
        """The limits' notes this session has not shown yet (a window learned mid-turn may
        bring one); each is shown once per session."""
        for note in self.session.notes_to_show():
            self.emit(Notice(note, "warning"))

    def _loop(self) -> TurnResult:
        session = self.session
        while self.result.steps < self.max_steps:
            if self.result.steps:  # a tool boundary: what the user sent meanwhile goes with the results
                take_inbox(session.layout.inbox, session.transcript, self.emit)
            preflight = self.session.compactor.preflight(self.turn, self.cancel)
            if preflight is not None:
                self.result.compactions.append(preflight)
                if preflight.outcome is Outcome.CANCELLED:
                    return self._end("cancelled", "cancelled during compaction; no capsule was appended")
            if self.cancel.is_set():
                return self._end("cancelled", "cancelled")
            try:
                model_input = self.session.compactor.request_for_sending(self.cancel)
            except HardLimitExceeded as exc:
                return self._end("failed", f"{exc}. {self._advice()}")
            refusal = self._beyond_stated_limit(model_input)
            if refusal is not None:
                return self._end("failed", refusal)
            response = self._infer(model_input)
            if isinstance(response, TurnResult):
                return response
            if response is None:
                continue  # overflow recovered: retry once with the smaller input
            self.result.steps += 1
            sent = model_input.tokens - self._unsent_images  # what the server measured
            cut = cut_answer(response, self.session.limits.max_output_tokens)
            for line in cut.notices:
                self.emit(Notice(line, "warning"))
            figure_cut = truncated(session, self.emit, response, model_input, sent, self._sent_images)
            record_answer(
                session, response, sent, truncated=figure_cut, cut=cut,
                operation_id=self._operation_id, sent_images=self._sent_images,
            )
            response = cut.recorded(response)
            if not response.tool_calls:
                # A steer sent while the answer streamed: the answer is a boundary too, and
                # the model answers the steer before the turn ends (never left for later).
                taken = take_inbox(session.layout.inbox, session.transcript, self.emit)
                if any(entry.steer is True for entry in taken):
                    continue
                self.result.answer = response.text
                self.result.checkpoint_id = self.session.compactor.record_turn_complete().checkpoint_id
                return self._end("completed", "")
            if not self._run_tools(response, cut.results):
                return self._end("cancelled", "cancelled while tools ran; unfinished calls were recorded as cancelled")
        return self._end(
            "step_limit",
            f"stopped after {self.max_steps} model requests (the step limit); ask again to continue",
        )

    def _advice(self) -> str:
        """What fits, and what a user can do about a refused request."""
        limits = self.session.limits
        fixed, hard = self.session.compactor.tracker.fixed, limits.hard_limit
        window = f"the window is {limits.context_window:,} ({limits.window_source})"
        if fixed >= hard:  # no window, however small, ends in a traceback: it says so (SPEC §13)
            cure = (
                "lower those in soba.json, or give the model a larger window"
                if fixed < limits.context_window
                else "the model needs a larger window (set model.contextWindow when it has one)"
            )
            return (
                f"Nothing fits: the {self._fixed_parts()} alone take {fixed:,} tokens and hardLimit is "
                f"{hard:,} ({window}, less maxOutputTokens {limits.max_output_tokens:,} and safetyReserveTokens "
                f"{limits.safety_reserve_tokens:,}): {cure}"
            )
        return (
            f"About {hard - fixed:,} tokens of conversation fit beside the {self._fixed_parts()} ({fixed:,}). "
            "To continue: `%compact` with a focus, `%rewind` to an earlier checkpoint, or "
            f"`%soba --new`; {window}: if the model's real window is larger, set model.contextWindow in soba.json"
        )

    def _fixed_parts(self) -> str:
        """What the fixed part is made of: the project's `AGENTS.md` named when it is sent."""
        instructions = self.session.instructions
        if instructions is None:
            return "system prompt and tools"
        tokens = self.session.counter.count_message("user", instructions.message)
        return f"system prompt, tools and {instructions.path.name} ({tokens:,}; %soba --no-instructions leaves it out)"

    def _beyond_stated_limit(self, model_input: ModelInput) -> str | None:
        """The retry after an overflow must fit the limit the server stated (SPEC §6)."""
        if self._retry_ceiling is None:
            return None
        tokens = self.session.compactor.send_figure(model_input)
        if tokens <= self._retry_ceiling:
            return None
        return (
            f"request not sent: the retry after the overflow would still be {tokens:,} tokens, "
            f"more than the {self._retry_ceiling:,} that fit the limit the server stated. {self._advice()}"
        )

    def _infer(self, model_input: ModelInput) -> ModelResponse | TurnResult | None:
        for note in model_input.notes:
            self.emit(Notice(note, "warning"))
        compactor = self.session.compactor
        sent = compactor.send_figure(model_input)
        session = self.session
        messages = with_images(
            model_input.messages,
            base=session.notebook_folder,
            vision=session.sends_images,
            max_images=session.config.notebook.max_images_per_request,
        )
        self._unsent_images = unsent_image_tokens(model_input.messages, messages, session.counter)
        self._sent_images = sent_image_tokens(messages, session.counter)
        request = ModelRequest(
            system=model_input.system,
            messages=messages,
            tools=list(model_input.tools),
            max_output_tokens=self.session.limits.max_output_tokens,
            operation="inference",
            operation_id="op_" + uuid.uuid4().hex[:12],
            input_tokens=sent,
            near_window=sent >= compactor.thresholds.soft_limit,
            native=model_input.native,
        )
        streamed: list[str] = []

        def on_text(text: str) -> None:
            streamed.append(text)
            self.emit(TextDelta(text))

        if self._model_time_left <= 0:
            return self._end(
                "failed",
                f"the turn has waited {self.turn_timeout_s:g} s for the model in all (its limit, "
                "%config SobaMagics.turn_timeout_s); ask again to continue",
            )
        try:  # the spending cap, fail-closed like the hard limit (SPEC §11)
            session.check_spend(request)
        except CostCapExceeded as exc:
            return self._end("failed", str(exc))
        self._operation_id = request.operation_id
        started = time.monotonic()

        def on_wait(status: str) -> None:
            self.emit(Waiting(status, time.monotonic() - started))

        try:
            response = self.session.provider.complete(
                request, on_text=on_text, cancel=self.cancel, timeout_s=self._model_time_left, on_wait=on_wait
            )
        except ContextOverflowError as exc:
            return self._recover(exc, sent)
        except (Cancelled, KeyboardInterrupt):
            self.cancel.set()
            self._record_partial("".join(streamed))
            partly = "; the part that had arrived is kept" if streamed else ""
            return self._end("cancelled", f"interrupted while the answer streamed{partly}")
        except ProviderError as exc:
            return self._end("failed", f"{self.session.config.model.provider}: {exc}")
        finally:
            self._model_time_left -= time.monotonic() - started
        return response

    def _recover(self, exc: ContextOverflowError, refused_tokens: int) -> TurnResult | None:
        if self._overflow_recovered:
            return self._end(
                "failed",
                "the provider refused the input as too long again after one recovery compaction; "
                "not sending it again",
            )
        self._overflow_recovered = True
        self.emit(Notice(f"context overflow from the provider ({exc}); compacting once and retrying", "warning"))
        session = self.session
        # The server's count of the refused request against ours: the retry is sized on its scale.
        ratio = max(1.0, exc.requested / refused_tokens) if exc.requested and refused_tokens > 0 else 1.0
        if ratio > MAX_COUNT_RATIO:
            ratio = 1.0  # not a count of this request: sized on our own count
        # A limit that is no window (0, negative, below the system prompt): the server's words are
        # data, never a window nor the ground for a diagnosis of what fits (SPEC §12, §16).
        absurd = exc.absurd_limit or (exc.limit is not None and not session.plausible_window(exc.limit))
        if exc.limit is not None and absurd:
            self.emit(
                Notice(
                    f"the server stated a limit of {exc.limit:,} tokens, less than the system prompt and tools "
                    f"alone take ({session.compactor.tracker.fixed:,}): not taken as the window",
                    "warning",
                )
            )
        elif exc.limit is not None:
            session.learn_window(exc.limit, "overflow", f"the server's stated limit is {exc.limit:,} tokens")
            self._show_new_notes()
            self._retry_ceiling = max(int((exc.limit - session.limits.max_output_tokens) / ratio), 0)
        result = session.compactor.recover_overflow(refused_tokens, self._retry_ceiling, self.cancel)
        self.result.compactions.append(result)
        if result.outcome is not Outcome.COMPLETED and absurd:
            return self._end(
                "failed",
                f"request not sent again: {session.config.model.provider}: {exc} (a limit that is no window: "
                "not taken as one)",
            )
        if result.outcome is not Outcome.COMPLETED:
            return self._end(
                "failed",
                f"request not sent again: the provider refused it as too long, and the recovery compaction "
                f"ended {result.outcome.value}: {result.reason}. {self._advice()}",
            )
        return None

    def _record_partial(self, text: str) -> None:
        if text:
            content = text + "\n\n[answer interrupted]"
            self.session.transcript.append(MessageEntry(role="assistant", content=content))

    def _run_tools(self, response: ModelResponse, not_run: dict[str, str]) -> bool:
        """Run the calls in order; on cancel, record the rest as cancelled. False if cancelled.
        A call in `not_run` (its arguments cut at the output limit) gets that result instead."""
        ctx = ToolContext(
            project_root=self.session.project_root,
            namespace=self.session.namespace,
            record_checkpoint=self._checkpoint,
            cancel=self.cancel,
            notebook=self.notebook,
            displays=self.displays,
            keep_version=FileVault(self.session.layout.file_versions).keep,
            session_files=self.session.session_files(),
            transform=self.transform,
            turn_deadline=self.deadline,
        )
        transcript = self.session.transcript
        for index, call in enumerate(response.tool_calls):
            if self.cancel.is_set():
                self._cancel_rest(response, index)
                return False
            summary = CUT_SUMMARY if call.id in not_run else summarize_call(call.name, call.arguments, summarize_arguments)
            if call.id in not_run:
                transcript.append(ToolResultEntry(call_id=call.id, name=call.name, content=not_run[call.id], is_error=True))
                self.emit(ToolFinished(call.id, call.name, summary, True, 0, not_run[call.id]))
                continue
            started = time.monotonic()
            try:
                if not self._approved(call, summary):
                    continue
                self.emit(ToolStarted(call.id, call.name, summary))
                outcome = (
                    self.session.mcp.call(call.name, call.arguments, self.cancel)
                    if is_mcp_tool(call.name) and self.mcp
                    else run_tool(call.name, call.arguments, ctx)
                )
            except KeyboardInterrupt:
                self.cancel.set()
                transcript.append(
                    ToolResultEntry(call_id=call.id, name=call.name, content="[interrupted by the user]", is_error=True)
                )
                self._cancel_rest(response, index + 1)
                return False
            duration = int((time.monotonic() - started) * 1000)
            content, artifacts = outcome.content, None
            if outcome.images:
                kept = keep_images(outcome.images, *self.session.artifact_places())
                content = "\n".join((content, *kept.notes))
                artifacts = list(kept.artifacts) or None
            transcript.append(
                ToolResultEntry(
                    call_id=call.id, name=call.name, content=content,
                    is_error=outcome.is_error, duration_ms=duration,
                    artifacts=UNSET if artifacts is None else artifacts,
                    files=list(outcome.files) if outcome.files else UNSET,
                )
            )
            preview = result_preview(outcome.content)
            images = tuple(artifact.path for artifact in artifacts or ())
            self.emit(ToolFinished(call.id, call.name, summary, outcome.is_error, duration, preview, images))
        return True

    def _approved(self, call: ToolCall, summary: str) -> bool:
        """Ask the user first when the approval mode says so (SPEC §11); a declined call is
        answered for the model and the turn goes on. The answer is an `approval` entry."""
        gate = self.approvals
        if gate is None or not gate.needs(call.name):
            return True
        decision, reason = gate.decide(describe_call(call.name, call.arguments, self.session.project_root))
        transcript = self.session.transcript
        transcript.append(ApprovalEntry(call_id=call.id, decision=decision, mode=gate.mode))
        if decision in ("approved", "approved_all"):
            return True
        content = DECLINED if decision == "declined" else NO_INPUT
        transcript.append(ToolResultEntry(call_id=call.id, name=call.name, content=content, is_error=True))
        if decision == "no_input":
            self.emit(Notice(
                f"declined {call.name}: {reason}; approval mode '{gate.mode}' asks before it runs — "
                "%soba --approve never runs the calls of a turn without asking (or set agent.approval in soba.json)",
                "warning",
            ))
        self.emit(ToolFinished(call.id, call.name, summary, True, 0, content, declined=True))
        return False

    def _cancel_rest(self, response: ModelResponse, start: int) -> None:
        for call in response.tool_calls[start:]:
            self.session.transcript.append(
                ToolResultEntry(call_id=call.id, name=call.name, content=CANCELLED_RESULT, is_error=True)
            )

    def _checkpoint(self, kind: str, note: str) -> str:
        return self.session.compactor.record_checkpoint(kind, note).checkpoint_id

    def _end(self, status: str, message: str) -> TurnResult:
        self.result.status = status
        self.result.message = message
        if message:
            self.emit(Notice(message, "error" if status == "failed" else "info"))
        return self.result


def run_turn(
    session: AgentSession,
    prompt: Prompt,
    *,
    on_event: EventSink | None = None,
    cancel: threading.Event | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    turn_timeout_s: float = DEFAULT_TURN_TIMEOUT_S,
    cells: Sequence[CellRecord] = (),
    notebook: NotebookAccess | None = None,
    displays: DisplayCapture | None = None,
    approval: ApprovalMode | None = None,
    approver: Approver | None = None,
    typed: str | None = None,
    transform: Callable[[str], str] | None = None,
    mcp: bool = True,
    instructions: bool = True,
) -> TurnResult:
    """Run one agent turn to its end. `prompt`: the request, or a function of the cells block
    appended ahead of it (`Prompt`). `cells`: the notebook cells run since the previous turn
    (newest last), carried ahead of the request within `notebook.contextTokens`; `notebook`:
    what the notebook tools read and where their proposed cells go; `displays`: how the
    `python` tool sees the images a call displays; `approval`: this turn's approval mode
    (default: `agent.approval`), `approver`: who is asked; `typed`: what the user typed when
    `prompt` is soba's expansion of it (`/fix`), recorded beside it for capsules to quote;
    `transform`: the shell's input transformation, so the `python` tool takes IPython syntax;
    `mcp`: the MCP servers' tools are offered (False: `%soba --no-mcp`); `instructions`: the
    project's `AGENTS.md` is sent (False: `%soba --no-instructions`)."""
    runner = TurnRunner(session, on_event=on_event, cancel=cancel, max_steps=max_steps, turn_timeout_s=turn_timeout_s)
    runner.notebook = notebook
    runner.instructions = instructions
    runner.displays = displays
    runner.transform = transform
    runner.mcp = mcp
    mode = approval or session.config.agent.approval
    runner.approvals = None if mode == "never" else ApprovalGate(mode, approver)
    return runner.run(prompt, cells, typed)
