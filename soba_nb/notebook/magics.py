"""The IPython magics (SPEC §9): `%soba`, `%%soba`, `%compact`, `%budget`, `%capsule`,
`%auto_compact`, `%rewind`.

One `SobaMagics` instance per shell holds the session, created lazily on first use from
the notebook's location (`soba_nb.notebook.location`) and the layered configuration, and
resumed from the latest transcript in `<notebook-stem>.soba/` after a kernel restart.
Settings are traitlets, so `%config SobaMagics.max_steps = 10` works like any IPython
setting. Arguments go through `IPython.core.magic_arguments`; a bad argument is a
one-line `UsageError`, never a traceback.

Cancelling: interrupt the kernel (Jupyter's ■ button, `I I`, the sidebar's Cancel, or
Ctrl-C in a terminal). That is the primary cancel: while a cell runs the kernel processes no
comm or widget messages, so only an interrupt (sent by the server, not over a comm) reaches
a turn running in that cell. `%soba --cancel` stops a turn running in another thread.
The sidebar's other buttons arrive over the `soba_nb.control` comm (`controls`).
"""

# IPython's magic decorators and magic_arguments are untyped.
# mypy: allow-untyped-calls, allow-untyped-decorators

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments
from traitlets import Bool, CaselessStrEnum, Float, Int, Unicode
from traitlets.config import Configurable

from soba_nb.agent.code_export import CodeExportError, export_code
from soba_nb.agent.fix_request import FIX_REQUEST as FIX_REQUEST  # re-exported (benchmarks)
from soba_nb.agent.fix_request import fix_request
from soba_nb.agent.loop import (
    DEFAULT_MAX_STEPS,
    DEFAULT_TURN_TIMEOUT_S,
    Prompt,
    TurnResult,
    run_turn,
)
from soba_nb.agent.rebuild import rebuild as rebuild_variables
from soba_nb.agent.session import AgentSession, RewindError
from soba_nb.agent.skills import SkillError
from soba_nb.capsule_files.memory import mirror, should_mirror
from soba_nb.compaction.outcomes import Outcome
from soba_nb.notebook import controls, input_transform, warm_up
from soba_nb.notebook.approval_prompt import InputApprover
from soba_nb.notebook.arguments import PROMPT_VALUE_CHARS as PROMPT_VALUE_CHARS  # re-exported
from soba_nb.notebook.arguments import (
    error_line,
    parse,
    split_options,
    substitute_variables,
    unquote_prompt,
)
from soba_nb.notebook.capsule_commands import CAPSULE_ERRORS, CapsuleMagics
from soba_nb.notebook.cell_edit import ProposedEdit
from soba_nb.notebook.cells import RecordedCell
from soba_nb.notebook.checkpoints import KINDS as CHECKPOINT_KINDS
from soba_nb.notebook.checkpoints import checkpoint_ids, checkpoint_lines, resume_line
from soba_nb.notebook.conversation import ConversationFeed, both
from soba_nb.notebook.displays import ShellDisplays
from soba_nb.notebook.holder import SESSION_ERRORS as SESSION_ERRORS  # re-exported
from soba_nb.notebook.holder import SessionHolder, one_line_errors
from soba_nb.notebook.monitor import BudgetView, SidebarPublisher, snapshot_of
from soba_nb.notebook.render import TurnRenderer, ipython_display
from soba_nb.notebook.rewind_files import rewind_with_files
from soba_nb.paths import shown
from soba_nb.providers.errors import ProviderError
from soba_nb.providers.http import DEFAULT_IDLE_TIMEOUT_S
from soba_nb.transcript.entries import ApprovalMode, CapsuleEntry

REGISTRY_KEY = "SobaMagics"
SLASH_COMMANDS = {
    "budget": "budget",
    "compact": "compact",
    "auto-compact": "auto_compact",
    "capsule": "capsule",
    "rewind": "rewind",
    "checkpoint": "checkpoint",
    "rebuild": "rebuild",
    "fix": "fix",
    "code": "code",
}
"""`%soba /NAME …` → the line magic that does the same (or this class's method: `SLASH_ONLY`)."""
SLASH_ONLY = frozenset({"rebuild", "fix", "code"})
"""Slash commands with no magic of their own."""
_FIX_CELL = re.compile(r"^--cell(?:=|\s+)(?P<count>[0-9]+)(?:\s+(?P<rest>.*))?$", re.DOTALL | re.ASCII)
"""`/fix --cell N [instructions]`."""
_SLASH = re.compile(r"^/(?P<name>[a-z][a-z-]*)(?:\s+(?P<rest>.*))?$", re.DOTALL)


@magics_class
class SobaMagics(Magics, Configurable):
    """The soba magics. Settings: `%config SobaMagics`."""

    model = Unicode("", help="Model name for %soba; empty means the configuration's model.").tag(config=True)
    max_steps = Int(DEFAULT_MAX_STEPS, min=1, help="Model requests per turn before the turn stops.").tag(config=True)
    auto_compact = Bool(
        None, allow_none=True, help="Soft compaction triggers on/off; None means the configuration's `auto`."
    ).tag(config=True)
    session = Unicode("", help="Transcript file to use; empty means the notebook's latest session.").tag(config=True)
    idle_timeout_s = Float(
        DEFAULT_IDLE_TIMEOUT_S, min=1, help="Longest silence from the model server (before and within an answer), seconds."
    ).tag(config=True)
    turn_timeout_s = Float(
        DEFAULT_TURN_TIMEOUT_S, min=1, help="All the waiting on the model one turn may do, seconds."
    ).tag(config=True)
    display_mode = CaselessStrEnum(
        ("auto", "rich", "plain"), "auto", help="auto: rich output in a kernel with a frontend, else plain text."
    ).tag(config=True)

    def __init__(self, shell: Any, holder: SessionHolder | None = None):
        # Magics.__init__ reads `shell.config` (parent=shell), so `%config` values set
        # before loading apply, and adds the instance to `shell.configurables`.
        super().__init__(shell=shell)
        self.holder = holder or SessionHolder(shell, self)
        """The session, shared with `%capsule` and the sidebar's controls."""
        self.last_result: TurnResult | None = None
        self.observe(self._session_changed, names=["session"])

    # -- session -------------------------------------------------------------------------

    @property
    def agent(self) -> AgentSession | None:
        """The open session, if any."""
        return self.holder.agent

    @property
    def sidebar(self) -> SidebarPublisher:
        return self.holder.sidebar

    @property
    def _cancel(self) -> bool | None:
        """Whether an operation runs (None when none does)."""
        return True if self.holder.running else None

    def _session_changed(self, change: Any) -> None:
        self.close()

    def get_session(self, *, new: bool = False, session_file: str | None = None) -> AgentSession:
        """The session, opened on first use; configuration re-read (soba.json, traits) each call."""
        return self.holder.get_session(new=new, session_file=session_file)

    def close(self) -> None:
        """Close the session (releases the transcript's writer lock)."""
        self.holder.close()

    @property
    def rich(self) -> bool:
        return self.holder.rich

    def refresh_monitor(self) -> None:
        self.holder.refresh_monitor()

    # -- %soba ---------------------------------------------------------------------------

    @line_cell_magic
    @no_var_expand  # our own {name} substitution (clipped reprs); IPython's would print whole values
    @magic_arguments()
    @argument("--model", metavar="NAME", help="Use this model from now on (as %%config SobaMagics.model).")
    @argument("--session", metavar="PATH", help="Continue (or start) the transcript file PATH.")
    @argument("--new", action="store_true", help="Start a new session instead of resuming the latest.")
    @argument("--cancel", action="store_true", help="Cancel a turn running in another thread.")
    @argument("--skill", metavar="NAME", action="append", default=[], help="Activate a skill (repeatable).")
    @argument(
        "--approve", metavar="MODE", choices=("never", "edits", "all"),
        help="Ask before calls run, for this turn: never, edits (shell and file writes) or all (python too).",
    )
    @argument("--no-instructions", action="store_true", help="Leave the project's AGENTS.md out of this turn's requests.")
    @argument("--no-mcp", action="store_true", help="Leave the MCP servers' tools out of this turn's requests.")
    @argument("prompt", nargs="*", help="What to ask (or /budget, /compact, /auto-compact, /capsule, /rewind).")
    def soba(self, line: str, cell: str | None = None) -> None:
        """Run one agent turn; the answer streams into the cell output.

        `%soba PROMPT` or `%%soba` with the prompt as the cell body. Options come first;
        everything after them is the prompt, verbatim (`--` ends the options). A prompt may
        name notebook variables as `{name}`: a name defined in the user namespace is replaced
        by its repr, clipped to 2,000 characters; anything else (`{}`,
        `{"a": 1}`, `{undefined}`, `{{name}}`) stays as typed.

        Slash commands do what the magics do: `/budget`, `/compact [focus]`,
        `/auto-compact on|off`, `/capsule ...`, `/rewind TARGET`.

        To cancel a running turn, interrupt the kernel (■ / `I I` / the sidebar's Cancel /
        Ctrl-C).
        """
        options, prompt = split_options(line, frozenset({"--model", "--session", "--skill", "--approve"}))
        prompt = unquote_prompt(prompt)
        args = parse(self.soba, options)
        if cell is not None:
            prompt = f"{prompt}\n{cell}".strip() if prompt else cell.strip()
        if args.cancel:
            self._cancel_running()
            return
        previous = self.model
        if args.model:
            self.model = args.model
        try:
            agent = self.get_session(new=args.new, session_file=args.session)
        except UsageError:
            self.model = previous  # a model the configuration refused is not kept for the next turns
            raise
        for name in args.skill:
            try:
                with one_line_errors("%soba --skill"):
                    skill = agent.activate_skill(name)
            except SkillError as exc:
                raise UsageError(error_line(exc)) from None
            print(f"skill {skill.name} active")
        if not prompt:
            if not (args.new or args.session or args.model or args.skill):
                raise UsageError("%soba: give a prompt, e.g. %soba summarise df (or use %%soba)")
            print(f"session {agent.session_id} ({shown(agent.file)})")
            return
        slash = _SLASH.match(prompt)
        if slash is not None:
            self._slash(slash.group("name"), slash.group("rest") or "")
            return
        prompt = substitute_variables(prompt, self.holder.user_ns)
        self.run_prompt(prompt, approval=args.approve, mcp=not args.no_mcp, instructions=not args.no_instructions)

    def run_prompt(
        self, prompt: Prompt, *, approval: ApprovalMode | None = None, typed: str | None = None, mcp: bool = True,
        instructions: bool = True,
    ) -> TurnResult:
        """One turn of the current session, rendered; safe to call from another thread.
        `approval`: this turn's approval mode (`--approve`; default `agent.approval`);
        `instructions`: the project's `AGENTS.md` is sent (`--no-instructions`: not);
        `typed`: what the user typed, when `prompt` is soba's expansion of it (`/fix`); `prompt`
        may be a function of the cells block appended ahead of it (`loop.Prompt`)."""
        agent = self.get_session()
        renderer = self.holder.renderer()
        if self.holder.first_turn_here(agent):
            renderer.print_line(resume_line(agent.transcript, agent.session_id))
        self.refresh_monitor()  # the panel shows this session's figures from the start of its first turn
        feed = ConversationFeed(typed or (prompt if isinstance(prompt, str) else ""))
        result: TurnResult | None = None
        with self.holder.cancellable() as cancel, self.sidebar.turn():  # no heads-up while it runs
            feed.start()
            try:
                result = run_turn(
                    agent,
                    prompt,
                    on_event=self.holder.live(both(renderer.on_event, feed.on_event)),
                    cancel=cancel,
                    max_steps=self.max_steps,
                    turn_timeout_s=self.turn_timeout_s,
                    cells=self.holder.cells_since_turn(),
                    notebook=self.holder.notebook_access(),
                    displays=ShellDisplays(self.shell),
                    transform=self.holder.shell.transform_cell,
                    approval=approval,
                    approver=InputApprover(renderer, also_show=feed.approval),
                    typed=typed,
                    mcp=mcp,  # False: %soba --no-mcp
                    instructions=instructions,  # False: %soba --no-instructions
                )
            except KeyboardInterrupt:
                result = TurnResult("cancelled", message="interrupted; the next %soba works")
            except ProviderError as exc:
                result = TurnResult("failed", message=error_line(exc))
            finally:
                feed.end(result)
        renderer.finish(result)
        for proposal in self.holder.place_proposed():
            if isinstance(proposal, ProposedEdit):
                renderer.show_edit(proposal.heading(), proposal.diff())
            else:
                renderer.show_cell(*proposal)
        self._turn_end_figures(agent, renderer)
        self.last_result = result
        return result

    def _turn_end_figures(self, agent: AgentSession, renderer: TurnRenderer) -> None:
        """The figures as a turn ends, to the sidebar; and, once per turn, the heads-up line
        when an automatic compaction is near (SPEC §14: auto on, past 85 % of the soft limit)."""
        snapshot = snapshot_of(agent)
        if snapshot.heads_up is not None:
            renderer.show(snapshot.heads_up.line(), "warning")
        self.sidebar.refresh(snapshot)

    def _cancel_running(self) -> None:
        if not self.holder.cancel_running():
            print("nothing is running")
            return
        print("cancel requested: the running turn stops at its next check")

    def _slash(self, name: str, rest: str) -> None:
        if name not in SLASH_COMMANDS:
            known = ", ".join(f"/{known}" for known in SLASH_COMMANDS)
            raise UsageError(f"%soba: unknown command /{name}; known: {known}")
        shell: Any = self.shell
        magic: Callable[[str], Any] | None = None if name in SLASH_ONLY else shell.find_line_magic(SLASH_COMMANDS[name])
        if magic is None:
            magic = getattr(self, SLASH_COMMANDS[name])
        magic(rest)

    # -- %compact, %budget, %auto_compact, %rewind ---------------------------------------

    @line_magic
    @no_var_expand
    def compact(self, line: str) -> None:
        """%compact [focus instructions] — compact the context now (trigger `user`).

        The focus text (everything after the magic, verbatim) is added to the summary
        request. With nothing safely compactable before the kept window, prints
        "skipped: <reason>". Interrupt the kernel to cancel (no capsule is appended).
        """
        agent = self.get_session()
        agent.ensure_summarizer()
        renderer = self.holder.renderer()
        agent.compactor.listeners.append(renderer.on_event)
        try:
            with self.holder.cancellable() as cancel, one_line_errors("%compact"):
                result = agent.compactor.compact(focus=line.strip() or None, cancel=cancel)
        except KeyboardInterrupt:
            renderer.show("cancelled: interrupted; no capsule was appended")
            return
        finally:
            agent.compactor.listeners.remove(renderer.on_event)
        renderer.finish(None)
        if result.outcome is Outcome.SKIPPED:
            renderer.show(
                'to hand the session over as it is, %capsule create "TITLE" writes a capsule file without compacting',
                "muted",
            )
        self._mirror(agent, result.entry, renderer)
        self.refresh_monitor()

    def _mirror(self, agent: AgentSession, entry: CapsuleEntry | None, renderer: TurnRenderer) -> None:
        """An explicit `%compact` with a full, valid capsule is kept in project memory (SPEC §8)."""
        if entry is None or not should_mirror(entry, explicit_compact=True):
            return
        try:
            path = mirror(entry, agent.project_root, notebook=agent.notebook, session_id=agent.session_id)
        except CAPSULE_ERRORS as exc:
            renderer.show(f"warning: not mirrored to project memory: {error_line(exc)}", "warning")
            return
        renderer.show(f"mirrored to project memory: {shown(path)}")

    @line_magic
    @magic_arguments()
    def budget(self, line: str) -> None:
        """%budget — effective tokens vs hardLimit and softLimit, measurement source, auto
        on/off and the last compaction, as of now: the output is a snapshot that later
        magics leave as it is (the JupyterLab sidebar is the live view). HTML with its
        text in a notebook, text elsewhere."""
        parse(self.budget, line)
        agent = self.get_session()
        agent.refresh_limits(ask_server=True)
        snapshot = snapshot_of(agent)
        self.sidebar.refresh(snapshot)
        if not self.rich:
            print(snapshot.text())
            return
        ipython_display(BudgetView(snapshot))

    @line_magic("auto_compact")
    @magic_arguments(name="auto_compact")
    @argument("state", nargs="?", choices=("on", "off"), help="on or off; omit to show the setting.")
    def auto_compact_magic(self, line: str) -> None:
        """%auto_compact on|off — soft compaction triggers on or off (hard_limit and
        context_overflow always apply)."""
        args = parse(self.auto_compact_magic, line)
        if args.state is not None:
            self.auto_compact = args.state == "on"
        with one_line_errors("%auto_compact"):
            agent = self.get_session()
        limits = agent.limits
        if limits.auto:
            what = "auto compaction on: soba compacts before the window fills, at the end of a turn and at milestones"
        else:
            what = "auto compaction off: only the hard limit and a context overflow compact now"
        where = "set with %auto_compact, kept in this session" if limits.auto_source != "config" else "from compaction.auto"
        print(f"{what} ({where})")
        self.refresh_monitor()

    @line_magic
    @magic_arguments()
    @argument("target", nargs="?", help="A checkpoint id (ck_…, Tab completes) or an entry id; omit to list them.")
    @argument("--files", action="store_true", help="Also restore the files the agent wrote or edited after the target.")
    @argument("--force", action="store_true", help="With --files: restore files changed since by someone else too.")
    def rewind(self, line: str) -> None:
        """%rewind [CHECKPOINT_OR_ENTRY] [--files [--force]] — move the leaf back; later work
        branches from there. The files the agent changed after the target are listed, and with
        `--files` restored (a file someone else changed since is left alone unless `--force`).
        Without a target, lists the recent checkpoints with their notes and times."""
        args = parse(self.rewind, line)
        agent = self.get_session()
        if args.target is None:
            lines = checkpoint_lines(agent.transcript)
            print("\n".join(lines) if lines else "no checkpoints yet: every finished turn records one")
            if lines:
                print("%rewind CHECKPOINT returns there (Tab completes the id)")
            return
        if args.force and not args.files:
            raise UsageError("%rewind: --force goes with --files")
        try:
            with one_line_errors("%rewind"):
                lines = rewind_with_files(agent, args.target, files=args.files, force=args.force)
        except RewindError as exc:
            raise UsageError(error_line(exc)) from None
        print("\n".join(lines))
        self.refresh_monitor()

    @line_magic
    @no_var_expand
    def checkpoint(self, line: str) -> None:
        """%checkpoint [milestone|plan_pivot] NOTE — record a checkpoint you can `%rewind` to.

        Without a kind it is a `user` checkpoint (a bookmark); `milestone` and `plan_pivot`
        are the kinds the agent records, and also ask for a compaction at the next turn.
        """
        kind, _, rest = line.strip().partition(" ")
        if kind not in CHECKPOINT_KINDS:
            kind, rest = "user", line.strip()
        note = rest.strip()
        if not note:
            raise UsageError("%checkpoint: give a note, e.g. %checkpoint before feature work")
        agent = self.get_session()
        with one_line_errors("%checkpoint"):
            entry = agent.compactor.record_checkpoint(kind, note)
        after = " (the next turn compacts first)" if entry.intent and agent.limits.auto else ""
        print(f"checkpoint {entry.checkpoint_id} ({kind}) · {note}{after}")
        self.refresh_monitor()

    def rebuild(self, line: str) -> None:
        """`%soba /rebuild` — re-run the recorded code that built the variables a kernel
        restart lost, in order, with receipts; stops at the first error."""
        if line.strip():
            raise UsageError("%soba /rebuild takes no arguments")
        agent = self.get_session()
        self.holder.record_sources()  # the cells run since the last turn can be re-run too
        renderer = self.holder.renderer()
        with self.holder.cancellable() as cancel, one_line_errors("%soba /rebuild"):
            try:
                result = rebuild_variables(agent, renderer.on_event, cancel, self.holder.shell.transform_cell)
            except KeyboardInterrupt:
                renderer.show("cancelled: interrupted; the variables rebuilt so far stay", "info")
                return
        if result.calls_run == 0:
            renderer.show(result.message)
        renderer.finish(None)
        self.refresh_monitor()

    def fix(self, line: str) -> None:
        """`%soba /fix [--cell N] [instructions]` — a turn about the latest cell that raised, or
        the recorded cell In [N] (the sidebar's Fix button): its source and traceback go to the
        model once (in the cells block or in the request: `fix_request`), with the data it
        names, and the model proposes the corrected source on that cell (`edit_cell`)."""
        cell, instructions = self._cell_to_fix(line.strip())
        if cell is None:
            print("nothing to fix: no cell has raised since %load_ext soba_nb in this kernel")
            return
        request = fix_request(cell.record(), self.holder.user_ns, instructions)
        self.run_prompt(request.prompt, typed=f"/fix {line.strip()}".rstrip())

    def _cell_to_fix(self, line: str) -> tuple[RecordedCell | None, str]:
        """The cell `/fix` is about and the user's instructions; a `--cell N` that names no
        recorded cell, or one that did not raise, is one line of error."""
        recorder = self.holder.recorder
        if not line.startswith("--cell"):
            return recorder.latest_error(), line
        named = _FIX_CELL.match(line)
        if named is None:
            raise UsageError("%soba /fix --cell: give the number of a cell that failed, e.g. /fix --cell 4")
        count = int(named.group("count"))
        found = recorder.by_count(count, count)
        if not found:
            raise UsageError(
                f"%soba /fix --cell {count}: no cell In [{count}] was recorded in this kernel "
                "(only cells run after %load_ext soba_nb are)"
            )
        if found[-1].error is None:
            raise UsageError(f"%soba /fix --cell {count}: In [{count}] ran without an error; ask about it with %soba")
        return found[-1], named.group("rest") or ""

    def code(self, line: str) -> None:
        """`%soba /code [OUT] [--force]` — the session's code (your cells that ran, the agent's
        successful python calls) in order: printed, or written to OUT (`.ipynb`: a notebook)."""
        try:
            words = shlex.split(line)  # a quoted OUT may hold spaces
        except ValueError as exc:
            raise UsageError(f"%soba /code: {exc}") from None
        force = "--force" in words
        rest = [word for word in words if word != "--force"]
        if len(rest) > 1:
            raise UsageError("%soba /code: give at most one OUT path (and --force)")
        agent = self.get_session()
        self.holder.record_sources()  # the export ends with the cells run since the last turn
        out = Path(rest[0]).expanduser() if rest else None
        try:
            export = export_code(agent.transcript, out, title=f"soba session {agent.session_id}", force=force, base=Path.cwd())
        except CodeExportError as exc:
            raise UsageError(f"%soba /code: {exc}") from None
        if export.written is None:
            print(export.text, end="")
        else:
            print(export.receipt(shown(export.written)))

    def complete_checkpoint_ids(self, _shell: Any, event: Any) -> list[str]:
        """Tab after `%rewind`: the session's checkpoint ids, newest first."""
        if self.agent is None:
            return []
        prefix = getattr(event, "symbol", "") or ""
        return [cid for cid in checkpoint_ids(self.agent.transcript) if cid.startswith(prefix)]


def register(shell: Any) -> SobaMagics:
    """Register the magics once per shell; a second call returns the existing instance."""
    existing = shell.magics_manager.registry.get(REGISTRY_KEY)
    if isinstance(existing, SobaMagics):
        return existing
    magics = SobaMagics(shell)
    shell.register_magics(magics)
    shell.register_magics(CapsuleMagics(shell, magics.holder))
    input_transform.install(shell)
    magics.holder.recorder.register()
    controls.register(magics.holder)
    shell.set_hook("complete_command", magics.complete_checkpoint_ids, str_key="%rewind")
    if magics not in shell.configurables:  # `%config SobaMagics.…` looks here
        shell.configurables.append(magics)
    warm_up.start(shell.user_ns)
    return magics


def unregister(shell: Any) -> None:
    """Remove the magics, their `%config` entry and the session."""
    magics = shell.magics_manager.registry.pop(REGISTRY_KEY, None)
    input_transform.uninstall(shell)
    if not isinstance(magics, SobaMagics):
        return
    controls.unregister(magics.holder)
    magics.holder.recorder.unregister()
    capsule = shell.magics_manager.registry.pop(CapsuleMagics.__name__, None)
    for owner in (magics, capsule):
        for kind, names in (owner.magics.items() if owner is not None else ()):
            table = shell.magics_manager.magics[kind]
            for name in names:
                table.pop(name, None)
    if magics in shell.configurables:
        shell.configurables.remove(magics)
    magics.close()
