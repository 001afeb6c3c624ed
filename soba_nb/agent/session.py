"""One agent session: its transcript, the model it is bound to, its token counter and its
compactor — the state behind `%soba`.

Sessions are opened by `soba_nb.agent.assembly` (the one place that builds them); this
module holds what an open session does: follow its configuration and limits, bind its
model, navigate its path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from soba_nb.agent.binding import ModelBinding
from soba_nb.agent.cost import CostLedger, SessionCost
from soba_nb.agent.environment import environment_line
from soba_nb.agent.instructions import ProjectInstructions, instructions_limit, read_instructions
from soba_nb.agent.kernel_state import kernel_state
from soba_nb.agent.limits import (
    session_counter,
    session_limits,
    session_usage_ceiling,
    takes_images,
)
from soba_nb.agent.prompt import system_prompt
from soba_nb.agent.provenance import Provenance, trace
from soba_nb.agent.skills import load_skill
from soba_nb.agent.tool_schemas import COMPACT_TOOL_SCHEMAS, TOOL_SCHEMAS, tool_schemas_for
from soba_nb.compaction.compactor import NO_MODELS, Compactor, CompactorSettings
from soba_nb.compaction.flight import FlightRecorder
from soba_nb.compaction.instructions import with_instructions, without_instructions
from soba_nb.compaction.model_input import fixed_key, fixed_tokens
from soba_nb.config import MAX_CONTEXT_WINDOW, ModelSettings, SobaConfig
from soba_nb.images import ImageRule
from soba_nb.layout import SessionLayout
from soba_nb.messages import ToolSchema
from soba_nb.providers import make_provider
from soba_nb.providers.base import ModelRequest, Provider
from soba_nb.providers.discovery import discover_window
from soba_nb.providers.errors import ProviderError
from soba_nb.providers.http import DEFAULT_IDLE_TIMEOUT_S
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CellSourcesEntry,
    CheckpointEntry,
    ConfigEntry,
    LeafEntry,
    SessionEntry,
    SettingEntry,
    SkillEntry,
    WindowEntry,
    WindowSource,
)
from soba_nb.transcript.store import Transcript
from soba_nb.transcript.token_index import TokenIndex
from soba_nb.window import (
    AUTO_KEY,
    ServerWindow,
    SessionLimits,
    model_key,
    recorded_server_window,
)


def _unpriced(model: ModelSettings | None) -> ModelSettings | None:
    """A model as bound (a new price is not a new model)."""
    return None if model is None else msgspec.structs.replace(model, pricing=None)


class RewindError(ValueError):
    """The rewind target names no checkpoint or entry of this session."""


class AgentSession:
    """The state behind `%soba`: transcript, model binding, counter, compactor, namespace.
    Made by `soba_nb.agent.assembly.open_session`."""

    def __init__(
        self,
        config: SobaConfig,
        *,
        layout: SessionLayout,
        project_root: Path,
        namespace: dict[str, Any] | None = None,
        notebook: str | None = None,
        provider: Provider | None = None,
        provider_factory: Callable[[SobaConfig], Provider] | None = None,
    ):
        self.config = config
        self.layout = layout
        self.project_root = project_root
        self.namespace: dict[str, Any] = {} if namespace is None else namespace
        self.notebook = notebook
        self._provider_factory = provider_factory
        self._given_provider = provider
        """A provider handed in (tests, benchmarks): bound as it is, never closed here."""
        self._binding: ModelBinding | None = None
        self._made_providers: list[Provider] = []
        """Providers this session made (not one passed in): closed with the session, so their
        pooled connections do not outlive it."""
        header = SessionEntry(notebook=notebook, model=f"{config.model.provider}/{config.model.name}")
        self.transcript = Transcript.open(layout.transcript, create_header=header)
        try:
            self._set_up(config, layout, notebook)
        except BaseException:
            self.transcript.close()  # a failed open keeps no lock (SPEC §16)
            raise

    def _set_up(self, config: SobaConfig, layout: SessionLayout, notebook: str | None) -> None:
        """Everything the session needs after its transcript is open."""
        self.session_id = layout.session_id
        self.resumed = any(not isinstance(e, SessionEntry) for e in self.transcript.entries)
        """The session has work from before this kernel process opened it (a restart)."""
        self.environment = environment_line(notebook)
        """The line the system prompt ends with (`soba_nb.agent.environment`, SPEC §15)."""
        self.noted_missing: frozenset[str] = frozenset()
        """Missing variables already reported to the user and the model (`rebuild.note_missing`)."""
        self._record_config()
        self.counter = session_counter(config)
        self._token_index = self._attach_token_index()
        self.idle_timeout_s = DEFAULT_IDLE_TIMEOUT_S
        """Longest silence from the server (`%config SobaMagics.idle_timeout_s`)."""
        self._server_window: ServerWindow | None = None
        self._asked: tuple[str, str] | None = None
        """(baseUrl, model) the server was last asked about, so it is asked once."""
        self.limits = session_limits(config, self.transcript, counter=self.counter)
        self._shown_notes: set[str] = set()
        """The limits' notes shown in this session so far (`notes_to_show`)."""
        self._provenance: tuple[tuple[int, int, str], Provenance] | None = None
        self.ledger = CostLedger()
        from soba_nb.agent.mcp.servers import McpServers  # asyncio and the tools' types: a kernel's

        self.mcp = McpServers(config.mcp_servers, cwd=self.project_root)
        """The MCP servers of `mcpServers` (SPEC §19): started at the first turn that offers
        their tools (`use_mcp`), stopped with the session."""
        self._mcp_tools: tuple[ToolSchema, ...] = ()
        """What the session's requests cost (SPEC §11), followed as the transcript grows."""
        self.compactor = Compactor(
            self.transcript,
            self.counter,
            self._compactor_settings(),
            system=system_prompt(self.environment),
            tools=TOOL_SCHEMAS,
            flight=FlightRecorder(layout.flight),
            kernel_state=lambda: kernel_state(self.namespace, self.provenance()),
        )
        self._fit_tools()
        self.instructions: ProjectInstructions | None = None
        """The project's `AGENTS.md` as the next request carries it (None: none; SPEC §19)."""
        self.refresh_instructions()

    @property
    def sends_images(self) -> bool:
        """Requests carry images: the model takes them and the session counts them (a session
        opened on a model that takes none counts none, so it sends none after a switch, until
        it is opened again: a request is never larger than measured)."""
        return self.counter.images is not ImageRule.NONE and takes_images(self.config)

    def artifact_places(self) -> tuple[Path, Path]:
        """(where the images of calls are kept, what their paths are relative to): the session
        folder's `artifacts/`, and the notebook's folder (SPEC §10)."""
        return self.layout.artifacts, self.notebook_folder

    @property
    def notebook_folder(self) -> Path:
        """The notebook's folder (the sessions folder's parent when the notebook is unknown)."""
        return Path(self.notebook).parent if self.notebook else self.layout.folder.parent

    @property
    def sessions_dir(self) -> Path:
        """The folder of the session's transcript (`<notebook-stem>.soba/`)."""
        return self.layout.folder

    # -- configuration -------------------------------------------------------------------

    def _compactor_settings(self) -> CompactorSettings:
        return CompactorSettings(
            thresholds=self.limits.thresholds(self.config),
            timeout_ms=self.config.compaction.timeout_ms,
            max_output_tokens=self.limits.max_output_tokens,
            session_id=self.session_id,
            user_request_tokens=self.config.compaction.user_request_tokens,
        )

    def _attach_token_index(self) -> TokenIndex:
        """Counts from earlier kernels (never re-tokenise a resumed path), read when a count is
        first missing; new ones are kept."""
        index = TokenIndex.open(self.layout.transcript, self.counter.key, keys_of=self.transcript.own_ids)
        self.counter.backfill = index.read_counts
        self.counter.persist = index.add
        return index

    def set_idle_timeout(self, seconds: float) -> None:
        """A new idle limit applies from the next provider (made on next use)."""
        if seconds != self.idle_timeout_s:
            self.idle_timeout_s = seconds
            self.unbind()

    def apply_config(self, config: SobaConfig) -> None:
        """New settings (e.g. soba.json edited); a model change also changes the provider."""
        # A new price is not a new model: the binding (and its native state) stays.
        model_changed = msgspec.structs.replace(config.model, pricing=None) != msgspec.structs.replace(
            self.config.model, pricing=None
        )
        summary_changed = _unpriced(config.summary_model) != _unpriced(self.config.summary_model)
        if config.mcp_servers != self.config.mcp_servers:  # other servers: the old ones stop
            self.mcp.close()
            self.mcp, self._mcp_tools = type(self.mcp)(config.mcp_servers, cwd=self.project_root), ()
        self.config = config
        self._record_config()
        if model_changed:
            # A new model gets the portable capsule: native items are replayed only to the
            # provider and model that made them (the compactor's target changes with it).
            self.unbind()
            self._server_window = None
        elif summary_changed:  # compaction.model set, changed or removed: bound with the model
            self.unbind()
        self.refresh_limits()

    def _record_config(self) -> None:
        """The settings every view of this session computes from, when they are new."""
        recorded = self.transcript.config
        current, explicit = self.config.to_json(), self.config.explicit_keys
        environment = self.environment
        if (
            recorded is None
            or recorded.config != current
            or recorded.explicit != explicit
            or recorded.environment != environment
        ):
            self.transcript.append(ConfigEntry(config=current, explicit=explicit, environment=environment))

    def refresh_environment(self) -> None:
        """The environment line as of now (a turn starts: the date may have changed), recorded
        and sent from the next request on when it differs."""
        environment = environment_line(self.notebook)
        if environment == self.environment:
            return
        self.environment = environment
        self._record_config()
        self._fit_tools(with_instructions(system_prompt(environment), self._instructions_message()))

    def refresh_instructions(self, *, send: bool = True) -> str | None:
        """The project's `AGENTS.md` as of now (a turn starts: it may have been edited), in
        the fixed input from the next request on; `send=False` (`--no-instructions`) leaves
        it out. Returns the line to show (a refusal, a clip), or None."""
        found = None
        if send:
            found = read_instructions(self.project_root, self.counter, limit=instructions_limit(self.limits.hard_limit))
        self.instructions = None if found is None else found.instructions
        self._fit_tools(with_instructions(system_prompt(self.environment), self._instructions_message()))
        return None if found is None else found.line

    def _instructions_message(self) -> str | None:
        return None if self.instructions is None else self.instructions.message

    def refresh_limits(self, *, ask_server: bool = False) -> SessionLimits:
        """Recompute the limits (asking the server first, once per model, when told to)."""
        if ask_server:
            self._ask_server()
        self.limits = session_limits(self.config, self.transcript, self._server_window, self.counter)
        self.compactor.update_settings(self._compactor_settings())
        self.compactor.tracker.distrust_usage_from(session_usage_ceiling(self.config, self.transcript, self.counter))
        self._fit_tools()
        return self.limits

    def _fit_tools(self, system: str | None = None) -> None:
        """Compact tool schemas for a window too small for the full ones (`tool_schemas_for`),
        with `system` as the system prompt from now on when given."""
        system = self.compactor.system if system is None else system
        prompt = without_instructions(system)  # the project's instructions have their own bound
        full = fixed_tokens(prompt, TOOL_SCHEMAS, self.counter)
        self.compactor.deciding_keys = (fixed_key(prompt, TOOL_SCHEMAS),)
        self.compactor.set_tools((*tool_schemas_for(self.limits.hard_limit, full), *self._mcp_tools), system)

    def use_mcp(self, on: bool = True) -> list[str]:
        """Offer the MCP servers' tools from the next request on (`on`; started the first time,
        the lines for the servers that failed returned once) or leave them out (`--no-mcp`).
        Their schemas count in the fixed part of every request, as soba's do."""
        failed = self.mcp.start() if on else []
        self._mcp_tools = self.mcp.schemas if on else ()
        self._fit_tools()
        return failed

    def _ask_server(self) -> None:
        """An OpenAI-compatible server at `baseUrl` may say its real window (llama.cpp,
        Ollama, vLLM); the answer is recorded when it is new, so `soba-nb budget` knows it."""
        model = self.config.model
        if model.provider != "openai" or not model.base_url:
            return
        asked = (model.base_url, model.name)
        if self._asked == asked:
            return
        self._asked = asked
        key = os.environ.get(model.api_key_env, "").strip() if model.api_key_env else ""
        found = discover_window(model.base_url, model.name, api_key=key or None)
        if found is not None and not self.plausible_window(found.context_window):
            found = None  # a window that cannot hold the system prompt is a broken answer
        self._server_window = found
        if found is None:
            return
        known = recorded_server_window(self.transcript.windows, model_key(self.config))
        if known is None or known != found:
            self._record_window(found.context_window, "server", found.source)

    def notes_to_show(self) -> list[str]:
        """The limits' notes not shown yet in this session: each once, not at every turn
        (SPEC §12). A note whose figures change (a new window) is a new note."""
        fresh = [note for note in self.limits.notes if note not in self._shown_notes]
        self._shown_notes.update(fresh)
        return fresh

    def first_time(self, note: str) -> bool:
        """Whether `note` is new in this session (then it is remembered): what is said about
        the server's figures is said once, not at every turn (SPEC §12)."""
        if note in self._shown_notes:
            return False
        self._shown_notes.add(note)
        return True

    def plausible_window(self, context_window: int) -> bool:
        """A server's figure can be a window: more than the system prompt and the compact tool
        schemas take (our count: the least a request can be), and at most `MAX_CONTEXT_WINDOW`.
        A server's words are data (SPEC §12): "maximum context length is 0 tokens" is no
        limit, and a session that took it as one could never send a request again."""
        least = fixed_tokens(without_instructions(self.compactor.system), COMPACT_TOOL_SCHEMAS, self.counter)
        return least < context_window <= MAX_CONTEXT_WINDOW

    def learn_window(self, context_window: int, source: WindowSource, detail: str) -> bool:
        """The model's window is smaller than we thought (an overflow error stated it, or the
        server cut a prompt): record it for the session and recompute. False if not news,
        or not a figure a window can be (`plausible_window`)."""
        if not self.plausible_window(context_window) or context_window >= self.limits.context_window:
            return False
        self._record_window(context_window, source, detail)
        self.refresh_limits()
        return True

    def _record_window(self, context_window: int, source: WindowSource, detail: str) -> None:
        self.transcript.append(
            WindowEntry(context_window=context_window, source=source, detail=detail, model=model_key(self.config))
        )

    def set_auto(self, on: bool) -> None:
        """`%auto_compact on|off`: kept in the transcript, so a resumed session keeps it."""
        recorded = self.transcript.setting(AUTO_KEY)
        if recorded is None or recorded.value != on:
            self.transcript.append(SettingEntry(key=AUTO_KEY, value=on))
        self.refresh_limits()

    # -- the model ----------------------------------------------------------------------

    @property
    def provider(self) -> Provider:
        """The bound provider, made on first use (so `%budget` works without a configured key)."""
        return self.bind().provider

    def bind(self) -> ModelBinding:
        """The session's model binding, made on first use and given to the compactor whole:
        the provider, its summarizer and its native compaction (`agent.binding`)."""
        if self._binding is None:
            binding = ModelBinding.of(
                self._make_provider(), self.check_spend, config=self.config, idle_timeout_s=self.idle_timeout_s
            )
            if binding.summary_provider is not None:  # compaction.model's: closed with the session
                self._made_providers.append(binding.summary_provider)
            self.compactor.bind(binding.models)
            self._binding = binding
        return self._binding

    def unbind(self) -> None:
        """Drop the binding (a new model or idle limit): the next use makes a new one. The
        providers made so far are closed with the session."""
        self._binding = None
        self.compactor.bind(NO_MODELS)

    def _make_provider(self) -> Provider:
        if self._given_provider is not None:
            return self._given_provider
        if self._provider_factory is not None:
            provider = self._provider_factory(self.config)
        elif self.config.provider_source.startswith("no model"):
            raise ProviderError(self.config.provider_source)
        else:
            provider = make_provider(self.config.model, idle_timeout_s=self.idle_timeout_s)
            warm_up = getattr(provider, "warm_up", None)
            if callable(warm_up):  # the embedded model: load it while the user reads
                warm_up()
        self._made_providers.append(provider)
        return provider

    def cost(self) -> SessionCost:
        """What the session has cost so far, priced as SPEC §11 says (`agent.cost`)."""
        self.ledger.follow(self.transcript)
        return self.ledger.cost(self.config)

    def check_spend(self, request: ModelRequest) -> None:
        """Before a request leaves (inference and compaction alike): `CostCapExceeded` when its
        worst case could take the session past `agent.maxSessionCostUsd` (fail-closed)."""
        if self.config.agent.max_session_cost_usd is None:
            return
        tokens = request.input_tokens
        if tokens is None:  # a summary request: counted here, as the model input is
            count = self.counter
            tokens = count.count_text(request.system) + sum(count.count_message(m.role, m.content) for m in request.messages)
        self.ledger.follow(self.transcript)
        self.ledger.check(self.config, tokens, request.max_output_tokens, request.operation)

    def ensure_summarizer(self) -> None:
        """Bind the session's model for compaction; without one (no key, no model) compaction
        uses the deterministic capsule."""
        try:
            self.bind()
        except Exception:
            self.unbind()

    # -- navigation ----------------------------------------------------------------------

    @property
    def file(self) -> Path:
        return self.transcript.file

    def session_files(self) -> frozenset[Path]:
        """The files this session writes (its transcript, the side-cars beside it and the
        flight records), resolved: the agent's file tools never write them."""
        return self.layout.files()

    def resolve_target(self, target: str) -> str:
        """An entry id for a checkpoint id (`ck_…`) or an entry id."""
        found = self.transcript.find_checkpoint(target)
        if found is not None:
            return found.id
        entry = self.transcript.get(target)
        if entry is None or isinstance(entry, LeafEntry):
            raise RewindError(f"rewind: {target!r} is neither a checkpoint nor an entry id of {self.file.name}")
        return entry.id

    def rewind(self, target: str) -> LeafEntry:
        """Move the leaf; later work branches from there and the model input is rebuilt."""
        return self.transcript.rewind(self.resolve_target(target))

    def checkpoints(self) -> list[CheckpointEntry | CapsuleEntry]:
        """Checkpoints and capsules on the current path."""
        return [e for e in self.transcript.path_view() if isinstance(e, CheckpointEntry | CapsuleEntry)]

    def provenance(self) -> Provenance:
        """The agent's python calls on the current path, the user's recorded cells on every
        branch (a rewind does not un-run a cell), and the variables they built."""
        path = self.transcript.path_view()
        key = (len(self.transcript), len(path), path[-1].id if path else "")
        if self._provenance is None or self._provenance[0] != key:
            self._provenance = (key, trace(self.transcript.path_and_every(CellSourcesEntry)))
        return self._provenance[1]

    def capsules(self) -> list[CapsuleEntry]:
        return [e for e in self.transcript.path_view() if isinstance(e, CapsuleEntry)]

    def activate_skill(self, name: str) -> SkillEntry:
        skill = load_skill(self.project_root, name)
        written = self.transcript.append(SkillEntry(name=skill.name, path=str(skill.path), content=skill.content))
        assert isinstance(written, SkillEntry)
        return written

    def close(self) -> None:
        """Release the transcript's writer lock and close the HTTP clients of the providers
        this session made (one replaced by a new idle limit or model included)."""
        self.mcp.close()
        self._token_index.close()
        self.transcript.close()
        made, self._made_providers = self._made_providers, []
        for provider in made:
            close = getattr(provider, "close", None)
            if callable(close):
                close()
