"""The `soba-nb` command: look at a session transcript from outside a notebook, or in CI.

    soba-nb inspect SESSION [--json]   entries, leaf, checkpoints, capsules, token figures
    soba-nb verify SESSION             integrity check; exit 1 with the first problem
    soba-nb budget SESSION [--json]    hardLimit / softLimit and effective tokens
    soba-nb capsule export SESSION CHECKPOINT OUT [--force]
                                       write a capsule as a portable .capsule.md file
    soba-nb demo [FOLDER]              the quick-start session, offline, on the embedded model
    soba-nb doctor [FOLDER]            which model would be used, and why; the limits

Subcommands live in one table, `SUBCOMMANDS`: each is a small function decorated with
`@subcommand(...)`, so adding one (`demo`, `capsule`, `doctor`, …) touches nothing else.
Exit codes: 0 ok, 1 a bad transcript (or config), 2 a usage error. Every error is one line
on stderr; a transcript problem reads `SESSION:LINE: problem`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    UsageEntry,
)
from soba_nb.transcript.store import TornLineWarning, Transcript, TranscriptError

PROG = "soba-nb"
EXIT_OK = 0
EXIT_BAD_TRANSCRIPT = 1
EXIT_USAGE = 2
SESSION_FOLDER_SUFFIX = ".soba"
"""Transcripts live in `<notebook-stem>.soba/`, next to the notebook (SPEC §7)."""


class CommandError(Exception):
    """A subcommand failed; the message is the whole line printed on stderr."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_TRANSCRIPT):
        super().__init__(message)
        self.exit_code = exit_code


# -- the subcommand table ------------------------------------------------------------------


@dataclass(frozen=True)
class Subcommand:
    """One `soba-nb NAME …` command."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    """Adds the command's arguments to its parser."""
    run: Callable[[argparse.Namespace], int]
    """Does the work; returns the exit code or raises `CommandError`."""


SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(
    name: str, help: str, arguments: Callable[[argparse.ArgumentParser], None]
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register the decorated function as `soba-nb NAME`."""

    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        if name in SUBCOMMANDS:
            raise ValueError(f"subcommand {name!r} is registered twice")
        SUBCOMMANDS[name] = Subcommand(name, help, arguments, run)
        return run

    return register


def session_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", metavar="SESSION", type=Path, help="path to a .jsonl transcript")


def session_and_json_arguments(parser: argparse.ArgumentParser) -> None:
    session_argument(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with a pointer to --help), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Inspect and check soba-nb session transcripts.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in SUBCOMMANDS.values():
        command.arguments(commands.add_parser(command.name, help=command.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `soba-nb` console script."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse has printed its one-line usage error
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    try:
        return SUBCOMMANDS[args.command].run(args)
    except CommandError as error:
        print(error, file=sys.stderr)
        return error.exit_code


# -- shared helpers -------------------------------------------------------------------------


def load_session(path: Path) -> Transcript:
    """Load a transcript read-only; torn lines become one warning line each on stderr."""
    if not path.exists():
        raise CommandError(f"{PROG}: error: {path}: no such file", EXIT_USAGE)
    if path.is_dir():
        raise CommandError(
            f"{PROG}: error: {path}: is a folder, not a .jsonl transcript", EXIT_USAGE
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TornLineWarning)
        try:
            transcript = Transcript.load(path)
        except TranscriptError as error:
            raise CommandError(str(error)) from None
        except OSError as error:
            raise CommandError(f"{path}: cannot read ({error.strerror})") from None
    # Loading warns only about a torn *last* line; earlier ones were recovered by an append.
    warned = len([w for w in caught if issubclass(w.category, TornLineWarning)])
    for index, line in enumerate(transcript.torn_lines):
        last = warned and index == len(transcript.torn_lines) - 1
        what = "torn last line ignored" if last else "torn line (recovered after a crash)"
        print(f"{path}:{line}: warning: {what}", file=sys.stderr)
    return transcript


def model_of(transcript: Transcript) -> tuple[str, str]:
    """(provider, model name) from the header's `provider/name`."""
    header = transcript.header
    if header is None or not header.model:
        return "unknown", "unknown"
    provider, _, name = header.model.partition("/")
    return (provider, name) if name else ("unknown", provider)


def token_figures(transcript: Transcript) -> dict[str, Any]:
    """Estimated tokens (whole path and effective model input) and the provider figure,
    measured exactly as the agent's preflight measures them."""
    from soba_nb.agent.session import SYSTEM_PROMPT
    from soba_nb.agent.tools import TOOL_SCHEMAS
    from soba_nb.compaction.budget import BudgetTracker
    from soba_nb.compaction.model_input import entry_tokens, fixed_tokens
    from soba_nb.tokens import TokenCounter  # loads the BPE ranks: only when counting

    provider, name = model_of(transcript)
    counter = TokenCounter.for_model(provider, name)
    path = transcript.path_view()
    measurement = BudgetTracker(counter, fixed_tokens(SYSTEM_PROMPT, TOOL_SCHEMAS, counter)).measure(path)
    last_usage = next((e for e in reversed(path) if isinstance(e, UsageEntry)), None)
    return {
        "encoding": counter.choice.encoding,
        "exactTokenizer": counter.choice.exact,
        "pathTokens": sum(entry_tokens(entry, counter) for entry in path),
        "estimatedTokens": measurement.estimated,
        "effectiveTokens": measurement.effective,
        "source": measurement.source,
        "lastUsage": None
        if last_usage is None
        else {
            "id": last_usage.id,
            "inputTokens": last_usage.input_tokens,
            "outputTokens": last_usage.output_tokens,
        },
    }


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


# -- inspect ---------------------------------------------------------------------------------


def describe(transcript: Transcript) -> dict[str, Any]:
    """Everything `inspect` shows, as JSON-ready data."""
    header = transcript.header
    entries = transcript.entries
    return {
        "session": str(transcript.file),
        "header": header.model_dump(by_alias=True, mode="json") if header else None,
        "entries": len(entries),
        "byType": dict(Counter(entry.type for entry in entries).most_common()),
        "leaf": transcript.leaf,
        "pathLength": len(transcript.path_view()),
        "tornLines": transcript.torn_lines,
        "checkpoints": [
            {
                "checkpointId": entry.checkpoint_id,
                "kind": entry.kind,
                "note": entry.note,
                "id": entry.id,
            }
            for entry in entries
            if isinstance(entry, CheckpointEntry)
        ],
        "capsules": [
            {
                "id": entry.id,
                "checkpointId": entry.checkpoint_id,
                "trigger": entry.trigger,
                "quality": entry.quality,
                "tokensBefore": entry.tokens_before,
                "tokensAfter": entry.tokens_after,
                "firstKeptEntryId": entry.first_kept_entry_id,
            }
            for entry in entries
            if isinstance(entry, CapsuleEntry)
        ],
        "tokens": token_figures(transcript),
    }


def render_inspect(info: dict[str, Any]) -> str:
    header = info["header"] or {}
    tokens = info["tokens"]
    lines = [
        f"session      {info['session']}",
        "header       "
        + (
            f"version {header.get('version')} · created {header.get('created')} · "
            f"notebook {header.get('notebook') or '-'} · model {header.get('model') or '-'}"
            if header
            else "(none: the first entry is not a session header)"
        ),
        f"entries      {info['entries']}  ("
        + ", ".join(f"{kind} {count}" for kind, count in info["byType"].items())
        + ")",
        f"leaf         {info['leaf'] or '-'}",
        f"path         {info['pathLength']} entries",
        f"checkpoints  {len(info['checkpoints'])}",
    ]
    lines += [
        f"  {ck['checkpointId']}  {ck['kind']:<10}  {ck['note']}".rstrip()
        for ck in info["checkpoints"]
    ]
    lines.append(f"capsules     {len(info['capsules'])}")
    lines += [
        f"  {cap['checkpointId']}  {cap['trigger']:<16}  {cap['quality']:<8}  "
        f"{cap['tokensBefore']} → {cap['tokensAfter']}  first kept {cap['firstKeptEntryId'] or '-'}"
        for cap in info["capsules"]
    ]
    exactness = "" if tokens["exactTokenizer"] else ", estimate for this model family"
    lines += [
        f"tokens       path {tokens['pathTokens']} · model input {tokens['estimatedTokens']} "
        f"(estimated, {tokens['encoding']}{exactness}; system prompt and tool schemas not included)",
    ]
    usage = tokens["lastUsage"]
    lines.append(
        f"  last provider usage: input {usage['inputTokens']}, output {usage['outputTokens']} "
        f"(entry {usage['id']})"
        if usage
        else "  last provider usage: none recorded"
    )
    return "\n".join(lines)


@subcommand(
    "inspect", "entries, leaf, checkpoints, capsules and token figures", session_and_json_arguments
)
def inspect_command(args: argparse.Namespace) -> int:
    info = describe(load_session(args.session))
    if args.json:
        print_json(info)
    else:
        print(render_inspect(info))
    return EXIT_OK


# -- verify ----------------------------------------------------------------------------------


def integrity_problems(transcript: Transcript) -> list[tuple[int, str]]:
    """(line, problem) for what loading accepts but a sound session must not contain."""
    problems: list[tuple[int, str]] = []
    by_id = {entry.id: entry for entry in transcript}
    for entry in transcript:
        if not isinstance(entry, CapsuleEntry) or entry.first_kept_entry_id is None:
            continue
        ancestor = entry.parent_id
        while ancestor is not None and ancestor != entry.first_kept_entry_id:
            ancestor = by_id[ancestor].parent_id
        if ancestor is None:
            problems.append(
                (
                    transcript.line_of(entry.id),
                    f"capsule firstKeptEntryId {entry.first_kept_entry_id!r} is not on its path",
                )
            )
    return sorted(problems)


def structure_warnings(transcript: Transcript) -> list[tuple[int, str]]:
    """(line, warning) for a file that is sound but unusual."""
    found: list[tuple[int, str]] = []
    entries = transcript.entries
    if entries and transcript.header is None:
        found.append((1, "the first entry is not a session header"))
    for entry in entries[1:]:
        if entry.parent_id is None:
            found.append((transcript.line_of(entry.id), f"entry {entry.id!r} starts a second root"))
    return found


@subcommand(
    "verify", "check a transcript's integrity; exit 1 with the first problem", session_argument
)
def verify_command(args: argparse.Namespace) -> int:
    transcript = load_session(args.session)
    for line, warning in structure_warnings(transcript):
        print(f"{args.session}:{line}: warning: {warning}", file=sys.stderr)
    problems = integrity_problems(transcript)
    if problems:
        line, problem = problems[0]
        raise CommandError(f"{args.session}:{line}: {problem}")
    print(f"ok: {len(transcript)} entries, leaf {transcript.leaf or '-'}")
    return EXIT_OK


# -- budget ----------------------------------------------------------------------------------


def notebook_folder(transcript: Transcript) -> Path:
    """The folder whose `soba.json` applies: the notebook's, from the header or the layout."""
    header = transcript.header
    session_folder = transcript.file.resolve().parent
    if header is not None and header.notebook:
        notebook = Path(header.notebook).expanduser()
        if not notebook.is_absolute() and session_folder.name.endswith(SESSION_FOLDER_SUFFIX):
            notebook = session_folder.parent / notebook
        if notebook.is_absolute():
            return notebook.parent
    if session_folder.name.endswith(SESSION_FOLDER_SUFFIX):
        return session_folder.parent
    return session_folder


@subcommand(
    "budget", "hardLimit, softLimit and effective tokens of a session", session_and_json_arguments
)
def budget_command(args: argparse.Namespace) -> int:
    from soba_nb.config import ConfigError, load_config

    transcript = load_session(args.session)
    folder = notebook_folder(transcript)
    try:
        config = load_config(folder)
    except ConfigError as error:
        raise CommandError(f"{PROG} budget: {error}") from None
    tokens = token_figures(transcript)
    effective = tokens["effectiveTokens"]
    info = {
        "session": str(args.session),
        "configFolder": str(folder),
        "model": f"{config.model.provider}/{config.model.name}",
        "contextWindow": config.model.context_window,
        "hardLimit": config.hard_limit,
        "softLimit": config.soft_limit,
        "effectiveTokens": effective,
        "source": tokens["source"],
        "estimatedTokens": tokens["estimatedTokens"],
        "auto": config.compaction.auto,
        "overHardLimit": effective > config.hard_limit,
        "overSoftLimit": effective >= config.soft_limit,
    }
    if args.json:
        print_json(info)
        return EXIT_OK
    share = effective / config.hard_limit if config.hard_limit > 0 else 0.0
    state = (
        "over hardLimit: the next request would compact first (hard_limit)"
        if info["overHardLimit"]
        else "at or over softLimit"
        if info["overSoftLimit"]
        else "under softLimit"
    )
    print(
        "\n".join(
            [
                f"session    {args.session}",
                f"config     {folder} · model {info['model']} · window {config.model.context_window}",
                f"hardLimit  {config.hard_limit}",
                f"softLimit  {config.soft_limit}",
                f"effective  {effective} ({tokens['source']}) · {share:.0%} of hardLimit · {state}",
                f"estimated  {tokens['estimatedTokens']}",
                f"auto       {'on' if config.compaction.auto else 'off'}",
            ]
        )
    )
    return EXIT_OK


# -- capsule export --------------------------------------------------------------------------


def capsule_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="capsule_action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="write a capsule to a .capsule.md file")
    session_argument(export)
    export.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="checkpoint id (ck_…) of a capsule"
    )
    export.add_argument("out", metavar="OUT", type=Path, help="the .capsule.md file to write")
    export.add_argument("--force", action="store_true", help="overwrite OUT if it exists")


@subcommand(
    "capsule", "portable capsules: `capsule export SESSION CHECKPOINT OUT`", capsule_arguments
)
def capsule_command(args: argparse.Namespace) -> int:
    from soba_nb.capsules.export import export_capsule
    from soba_nb.capsules.memory import project_root_for

    transcript = load_session(args.session)
    try:
        # A path outside the project is allowed only when given explicitly (absolute).
        written = export_capsule(
            transcript,
            args.checkpoint,
            args.out,
            project_root=project_root_for(notebook_folder(transcript)),
            force=args.force,
            allow_outside=args.out.expanduser().is_absolute(),
        )
    except (ValueError, OSError) as error:
        raise CommandError(f"{PROG} capsule export: {error}") from None
    print(f"exported {args.checkpoint} to {written}")
    return EXIT_OK



# -- demo and doctor ---------------------------------------------------------------------------


def demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "folder", nargs="?", type=Path, default=None, help="where to work (default: a new temp folder)"
    )


@subcommand("demo", "run the quick-start session offline on the embedded model", demo_arguments)
def demo_command(args: argparse.Namespace) -> int:
    from soba_nb.config import ConfigError
    from soba_nb.demo import run_demo
    from soba_nb.providers.errors import ProviderError

    try:
        return run_demo(args.folder)
    except (ConfigError, ProviderError) as error:
        raise CommandError(f"{PROG} demo: {error}") from None


@subcommand("doctor", "which model would be used and why, and the limits", demo_arguments)
def doctor_command(args: argparse.Namespace) -> int:
    from soba_nb.config import ConfigError, load_config
    from soba_nb.resolution import embedded_model_installed

    folder = args.folder or Path.cwd()
    try:
        config = load_config(folder)
    except ConfigError as error:
        raise CommandError(f"{PROG} doctor: {error}") from None
    key_env = config.model.api_key_env
    key_state = "not needed" if not key_env else ("set" if key_env in os.environ else "NOT set")
    print(
        "\n".join(
            [
                f"provider   {config.model.provider} · {config.provider_source}",
                f"model      {config.model.name} · window {config.model.context_window:,} · "
                f"maxOutputTokens {config.model.max_output_tokens:,}",
                f"baseUrl    {config.model.base_url or '(provider default)'}",
                f"api key    {key_env or '-'} {key_state}",
                f"embedded   {'installed' if embedded_model_installed() else 'not installed'}",
                f"hardLimit  {config.hard_limit:,}",
                f"softLimit  {config.soft_limit:,}",
                f"auto       {'on' if config.compaction.auto else 'off'}",
            ]
        )
    )
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
