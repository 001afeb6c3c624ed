"""The notebook's open session, shared by every soba magic and the sidebar's controls.

`%soba` and its friends (`SobaMagics`), `%capsule` (`CapsuleMagics`) and the sidebar's
buttons (`controls`) all reach the session through one `SessionHolder`, as jupysql's
sub-magics share their connection: none of them calls back into another. The holder opens
the session on first use (through `soba_nb.agent.assembly`), re-reads the configuration on
every use, knows the one operation that may run at a time (and cancels it), and keeps the
sidebar's figures fresh.
"""

# IPython's error and capture helpers are untyped.
# mypy: allow-untyped-calls

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import msgspec
from IPython.core.error import UsageError
from msgspec import UNSET

from soba_nb.agent.artifacts import keep_images
from soba_nb.agent.assembly import choose_layout, open_session, reconfigure
from soba_nb.agent.events import AgentEvent, ToolFinished, ToolStarted
from soba_nb.agent.limits import counts_differently
from soba_nb.agent.session import AgentSession, RewindError
from soba_nb.agent.skills import SkillError
from soba_nb.agent.tools.base import CellKind, DisplayedImage, NotebookAccess
from soba_nb.compaction.cells_context import FIRST_TURN_CELLS
from soba_nb.config import ConfigError, load_config
from soba_nb.layout import session_transcripts
from soba_nb.notebook.arguments import error_line
from soba_nb.notebook.cell_edit import (
    IN_THE_OUTPUT,
    ON_THE_CELL,
    ProposedEdit,
    announce_edit,
    running_call,
)
from soba_nb.notebook.cell_insert import announce as announce_cell
from soba_nb.notebook.cell_insert import new_turn_id
from soba_nb.notebook.cell_sources import SourceCursor
from soba_nb.notebook.cells import CellRecorder, RecordedCell
from soba_nb.notebook.location import locate
from soba_nb.notebook.monitor import SidebarPublisher, snapshot_of
from soba_nb.notebook.render import TurnRenderer
from soba_nb.notebook.unnamed import unnamed_line
from soba_nb.transcript.entries import Artifact, CellRecord
from soba_nb.transcript.store import TranscriptError, TranscriptLockedError, TranscriptWriteError

LIVE_REFRESH_S = 0.5
"""The sidebar's figures are sent at most this often during a turn."""
SESSION_ERRORS = (ConfigError, TranscriptError, TranscriptLockedError, SkillError, RewindError, OSError)
NAME_MAX_BYTES = 255
"""The longest file name most file systems take (ext4, xfs, tmpfs, APFS), when the folder
cannot say (`pathconf`)."""


class Settings(Protocol):
    """What the holder reads of the user's settings (`SobaMagics`' traits, `%config`)."""

    model: str
    session: str
    auto_compact: bool | None
    idle_timeout_s: float
    display_mode: str


class SessionHolder:
    """One notebook's session and the operation running on it."""

    def __init__(self, shell: Any, settings: Settings):
        self.shell = shell
        self.user_ns: dict[str, Any] = shell.user_ns
        """The notebook's namespace: the agent's python tool runs here."""
        self.settings = settings
        self.agent: AgentSession | None = None
        self.sidebar = SidebarPublisher()
        """The JupyterLab sidebar's feed (a no-op without a kernel)."""
        self.recorder = CellRecorder(shell)
        """The cells the user runs (registered with the magics)."""
        self.proposed: list[tuple[str, CellKind] | ProposedEdit] = []
        """Cells the agent proposed (`add_cell`) in the running turn, and the edits
        (`edit_cell`) no labextension took, in order."""
        self.turn_id = new_turn_id()
        """The running turn's id, as its `add_cell` and `edit_cell` messages name it."""
        self._cells_session: str | None = None
        """The session the cells were last taken for (a new one starts with the last few)."""
        self._sources = SourceCursor()
        """How far each session has recorded the cells' whole sources (`cell_sources`)."""
        self._announced: set[str] = set()
        """Sessions from before whose resumption this kernel has announced."""
        self._cancel: threading.Event | None = None
        self._guard = threading.Lock()
        self._told_unnamed = False
        """Whether this kernel has said its notebook's file is unknown (`unnamed_line`)."""

    # -- the session ---------------------------------------------------------------------

    def get_session(self, *, new: bool = False, session_file: str | None = None) -> AgentSession:
        """The session, opened on first use; configuration re-read (soba.json, settings) each call."""
        chosen = session_file or (None if new else self.settings.session)
        requested = _session_path(chosen) if chosen else None
        if requested is not None and self.agent is not None and requested == self.agent.file.resolve():
            requested = None
        if session_file and requested is not None and not new and not requested.exists():
            # A typo must not quietly start an empty session somewhere else.
            raise UsageError(f"%soba --session: {requested} does not exist; add --new to start a session there")
        if session_file and requested is not None and requested.is_dir():
            # A notebook's `.soba` folder holds its sessions. `soba-nb budget FOLDER` reads the
            # latest; a kernel appends to the one it resumes, so the user names it.
            sessions = session_transcripts(requested)
            latest = f"; its latest session is {sessions[-1]}" if sessions else ""
            raise UsageError(f"%soba --session: {requested} is a folder, not a session transcript (.jsonl){latest}")
        try:
            location = locate(self.user_ns, session_file=requested)
            if requested is None and not self._told_unnamed:
                self._told_unnamed = True
                line = unnamed_line(location, self.shell)
                if line:
                    print(line)
            folder = location.notebook.parent if location.notebook else Path.cwd()
            config = load_config(folder, self._overrides())
            if self.agent is not None and not new and requested is None and counts_differently(self.agent.counter, config):
                # Another tokenizer, factor or image rule (a model switched in soba.json): the
                # session is reopened on its transcript, as after a restart, so that every
                # count — and which images a request may carry — follows the new model.
                requested = self.agent.file
            if self.agent is None or new or requested is not None:
                self.close()
                self.agent = open_session(
                    config,
                    choose_layout(location.sessions_dir, session_file=requested, new=new),
                    project_root=location.project_root,
                    namespace=self.user_ns,
                    notebook=str(location.notebook) if location.notebook else None,
                )
            # `%auto_compact` / `%config SobaMagics.auto_compact`: kept in the transcript, so
            # the session keeps it after a restart (when the setting is None again).
            settings = self.settings
            reconfigure(self.agent, config, auto=settings.auto_compact, idle_timeout_s=settings.idle_timeout_s)
        except TranscriptError as exc:
            raise UsageError(error_line(exc) + _repair_hint(exc)) from None
        except SESSION_ERRORS as exc:
            raise UsageError(error_line(exc)) from None
        return self.agent

    def first_turn_here(self, agent: AgentSession) -> bool:
        """True once per session in this kernel: the first turn on a session from before
        says so (`checkpoints.resume_line`)."""
        if not agent.resumed or agent.session_id in self._announced:
            return False
        self._announced.add(agent.session_id)
        return True

    def notebook_access(self, turn: str | None = None) -> NotebookAccess:
        """What the notebook tools read and where their proposed cells and edits go, for one
        turn (`turn`: its id, when the caller has one)."""
        self.proposed = []
        self.turn_id = turn or new_turn_id()
        agent = self.agent
        notebook = Path(agent.notebook) if agent is not None and agent.notebook else None
        return NotebookAccess(
            cells=self._cells_by_count,
            propose=self._propose,
            notebook=notebook,
            recorded=self._recorded_counts,
            edit=self._propose_edit,
        )

    def _recorded_counts(self) -> list[int]:
        return [cell.execution_count for cell in self.recorder.cells if cell.execution_count is not None]

    def _propose_edit(self, count: int, source: str) -> str:
        """Send the edit of In [count] to the labextension; else keep it for the output and
        the next cell (`place_proposed`). How it reaches the user, in one line."""
        cell = self.recorder.by_count(count, count)[-1]
        call = running_call(self.agent.transcript) if self.agent is not None else None
        edit = ProposedEdit(count, cell.source, source, call=call, cell_id=cell.cell_id)
        # Without the call's id no decision could name it: the labextension is not asked.
        if call is not None and announce_edit(edit, self.turn_id):
            return ON_THE_CELL
        self.proposed.append(edit)
        return IN_THE_OUTPUT

    def _cells_by_count(self, first: int | None, last: int | None) -> list[CellRecord]:
        return self._records(self.recorder.by_count(first, last))

    def _records(self, cells: Sequence[RecordedCell]) -> list[CellRecord]:
        """What the model is told of `cells`: each redacted (`RecordedCell.record`), its images
        kept as artifacts in the session folder, as the agent's own are (SPEC §15), or named
        with the reason they were not."""
        agent = self.agent
        records = [cell.record() for cell in cells]
        if agent is None:
            return records
        places = agent.artifact_places()
        return [with_artifacts(record, cell, places) for record, cell in zip(records, cells, strict=True)]

    def _propose(self, source: str, kind: CellKind) -> str:
        self.proposed.append((source, kind))
        index = sum(1 for proposal in self.proposed if not isinstance(proposal, ProposedEdit)) - 1
        # The labextension inserts it now (in order, with its kind); `place_proposed` still
        # sends the last one as `set_next_input` for every other frontend.
        if announce_cell(self.shell, source, kind, index=index, turn=self.turn_id):
            return "it is put below this cell now, for the user to read and run"
        return "it goes below this cell when the turn ends, for the user to read and run"

    def place_proposed(self) -> list[tuple[str, CellKind] | ProposedEdit]:
        """Put the turn's last proposal below the running one (IPython's `set_next_input`:
        JupyterLab, Notebook 7 and VS Code insert it, a terminal pre-fills the next prompt) — a
        cell, or the new source of an edit no labextension took; returns every proposal, for
        the cell output to show."""
        proposed, self.proposed = self.proposed, []
        if proposed:
            last = proposed[-1]
            source, kind = (last.new, "code") if isinstance(last, ProposedEdit) else last
            text = source if kind == "code" else _as_markdown_cell(source)
            # A shell without a next input (a script): the output shows the cell all the same.
            with contextlib.suppress(Exception):
                self.shell.set_next_input(text, replace=False)
        return proposed

    def cells_since_turn(self) -> list[CellRecord]:
        """The cells run since the previous turn (the last few at a session's first turn in
        this kernel, `%soba --new` included), for the model; their whole sources go to the
        transcript first (`record_sources`)."""
        self.record_sources()
        session = self.agent.session_id if self.agent is not None else None
        start, self._cells_session = session != self._cells_session, session
        return self._records(self.recorder.since_turn(first=FIRST_TURN_CELLS, session_start=start))

    def record_sources(self) -> None:
        """Append the whole sources of the cells the session has not recorded yet (a
        `cell_sources` entry): before a turn, `/code` and `/rebuild`. A transcript that cannot
        be written is left to the caller's own append to report."""
        agent = self.agent
        if agent is None:
            return
        entry = self._sources.entry(agent.session_id, self.shell, self.recorder)
        if entry is not None:
            with contextlib.suppress(TranscriptError, TranscriptWriteError):
                agent.transcript.append(entry)

    def _overrides(self) -> dict[str, Any]:
        return {"model": {"name": self.settings.model}} if self.settings.model else {}

    def close(self) -> None:
        """Close the session (releases the transcript's writer lock)."""
        agent, self.agent = self.agent, None
        if agent is not None:
            agent.close()

    # -- output --------------------------------------------------------------------------

    @property
    def rich(self) -> bool:
        """Decided per call: a kernel with a frontend gets HTML, anything else text."""
        mode = self.settings.display_mode
        if mode != "auto":
            return bool(mode == "rich")
        return type(self.shell).__name__ == "ZMQInteractiveShell"

    def renderer(self) -> TurnRenderer:
        return TurnRenderer(rich=self.rich, sidebar=self.sidebar)

    def refresh_monitor(self) -> None:
        """Send the session's budget to the sidebar (after anything that changes it)."""
        if self.agent is not None:
            self.sidebar.refresh(snapshot_of(self.agent))

    def live(self, on_event: Callable[[AgentEvent], None]) -> Callable[[AgentEvent], None]:
        """`on_event` that also keeps the sidebar's figures fresh while a turn runs: after each
        model answer (the calls it asked for start) and each call, at most twice a second —
        kernel → frontend messages flow while the cell runs (issue 26: the panel was asleep
        until the turn ended)."""
        last = [0.0]

        def forward(event: AgentEvent) -> None:
            on_event(event)
            if isinstance(event, ToolStarted | ToolFinished) and time.monotonic() - last[0] >= LIVE_REFRESH_S:
                last[0] = time.monotonic()
                with contextlib.suppress(Exception):  # the sidebar is a view: never the turn's problem
                    self.refresh_monitor()

        return forward

    # -- the running operation -----------------------------------------------------------

    @contextmanager
    def cancellable(self) -> Iterator[threading.Event]:
        """The cancel signal of one operation (turn, compaction, capsule); one at a time.

        `%soba --cancel` (e.g. from another thread) sets it; it is cleared when the
        operation ends, however it ends.
        """
        with self._guard:
            if self._cancel is not None:
                raise UsageError("a turn is already running; `%soba --cancel` stops it")
            self._cancel = threading.Event()
            cancel = self._cancel
        try:
            yield cancel
        finally:
            with self._guard:
                self._cancel = None

    @property
    def running(self) -> bool:
        return self._cancel is not None

    def cancel_running(self) -> bool:
        """Ask the running operation to stop; False when nothing runs."""
        cancel = self._cancel
        if cancel is None:
            return False
        cancel.set()
        return True


def with_artifacts(record: CellRecord, cell: RecordedCell, places: tuple[Path, Path]) -> CellRecord:
    """`record` listing `cell`'s images as artifacts (`keep_images`: written once, by content,
    to `places`' folder) and naming those that could not be kept."""
    if not cell.images:
        return record
    displayed = [DisplayedImage(mime, raw) for mime, raw in cell.images]
    kept = keep_images(displayed, *places)
    artifacts = iter(kept.artifacts)
    images: list[Artifact] = []
    not_kept = list(record.images_not_kept or ())
    for image, note in zip(displayed, kept.notes, strict=True):
        if NOT_KEPT in note:  # `[image 2: not kept: why]`
            not_kept.append(f"{image.mime} not kept: {note.partition(NOT_KEPT)[2].removesuffix(']')}")
        else:
            images.append(next(artifacts))
    return msgspec.structs.replace(record, images=images or UNSET, images_not_kept=not_kept or UNSET)


NOT_KEPT = "not kept: "
"""How `keep_images` names an image it could not keep, ahead of the reason."""


def _repair_hint(error: TranscriptError) -> str:
    """A transcript with a bad line: the way back to the session, and the way around it."""
    marker = f":{error.line}:"
    if error.line is None or marker not in str(error):
        return ""
    path = str(error).split(marker, 1)[0]  # the message names the file first: `PATH:LINE: problem`
    return (
        f" — soba-nb verify {path} --repair writes a repaired copy beside it "
        "(then %soba --session COPY); %soba --new starts a new session"
    )


def _as_markdown_cell(source: str) -> str:
    """`set_next_input` makes a code cell: a Markdown proposal goes as IPython's `%%markdown`."""
    return f"%%markdown\n{source}"


def _session_path(text: str) -> Path:
    """`%soba --session PATH` as an absolute path, its folder resolved but not the file itself
    (a link there is refused when opened, never followed; a folder that is itself a link is
    refused); a name too long for the file
    system is one line of error (it ended in a raw `OSError [Errno 36]`)."""
    path = Path.cwd() / Path(text).expanduser()
    try:
        longest = os.pathconf(path.parent if path.parent.is_dir() else Path.cwd(), "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = NAME_MAX_BYTES
    for part in path.parts:
        if len(os.fsencode(part)) > longest:
            raise UsageError(
                f"%soba --session: a name in the path is {len(os.fsencode(part)):,} bytes long; "
                f"the file system takes at most {longest}"
            )
    if path.parent.is_symlink():  # resolved, it would be written through (SPEC §16)
        raise UsageError(
            f"%soba --session: {path.parent}: the session folder is a link; soba writes its sessions only into a real folder, never through a link"
        )
    try:
        return path.parent.resolve() / path.name
    except OSError as exc:
        raise UsageError(f"%soba --session: {text[:80]!r}: {exc.strerror or exc}") from None


@contextmanager
def one_line_errors(what: str) -> Iterator[None]:
    """A transcript that cannot be written (a full disk, a deleted file) or read is one line
    in the cell, never a traceback."""
    try:
        yield
    except (TranscriptError, TranscriptWriteError) as exc:
        raise UsageError(f"{what}: {error_line(exc)}") from None
