"""The `%capsule` subcommands (SPEC §8, §9): create, export, load, list, show.

Each handler takes the `SobaMagics` instance, the open agent session and the rest of the
line after the subcommand; `SobaMagics.capsule` picks one from `COMMANDS` and turns the
capsule errors into a one-line `UsageError`. Each subcommand's arguments are a
`magic_arguments` spec below (its docstring is the help text).
"""

# IPython's magic_arguments are untyped.
# mypy: allow-untyped-calls, allow-untyped-decorators

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from IPython.core.magic_arguments import argument, magic_arguments

from soba_nb.agent.session import AgentSession
from soba_nb.capsules.export import (
    capsule_file_from_entry,
    export_capsule,
    find_capsule,
    load_capsule,
)
from soba_nb.capsules.file import FILE_SUFFIX, write_capsule_file
from soba_nb.capsules.memory import list_memory, memory_dir
from soba_nb.notebook.arguments import parse
from soba_nb.notebook.monitor import capsule_line
from soba_nb.notebook.render import TextView, ipython_display
from soba_nb.paths import shown
from soba_nb.redact import redact

if TYPE_CHECKING:
    from soba_nb.notebook.magics import SobaMagics

SLUG_CHARS = 60
DEFAULT_SLUG = "capsule"


def slug(title: str) -> str:
    """A file-name-safe form of a title: `Churn model — v2!` → `churn-model-v2`."""
    words = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return words[:SLUG_CHARS].rstrip("-") or DEFAULT_SLUG


def capsule_create(magics: SobaMagics, agent: AgentSession, rest: str) -> None:
    args = parse(_create_arguments, rest)
    title = redact(" ".join(args.title))  # it names the file and is shown in the cell
    agent.ensure_summarizer()
    try:
        with magics.cancellable() as cancel:
            entry = agent.compactor.make_capsule(cancel=cancel)
    except KeyboardInterrupt:
        entry = None
    if entry is None:
        print("cancelled: no capsule file was written")
        return
    capsule_file = capsule_file_from_entry(
        entry, notebook=agent.notebook, session_id=agent.session_id, title=title
    )
    target = agent.project_root / f"{slug(title)}{FILE_SUFFIX}"
    written = write_capsule_file(target, capsule_file, force=args.force)
    fallback = " · fallback" if entry.quality == "degraded" else ""
    print(
        f"capsule {title!r} written to {shown(written)} "
        f"({capsule_file.metadata.tokens:,} tokens · quality {entry.quality}{fallback})"
    )


def capsule_export(magics: SobaMagics, agent: AgentSession, rest: str) -> None:
    args = parse(_export_arguments, rest)
    explicit = Path(args.path).expanduser().is_absolute()
    written = export_capsule(
        agent.transcript, args.checkpoint, args.path,
        project_root=agent.project_root, force=args.force, allow_outside=explicit,
    )
    print(f"exported {args.checkpoint} to {shown(written)}")


def capsule_load(magics: SobaMagics, agent: AgentSession, rest: str) -> None:
    args = parse(_load_arguments, rest)
    entry = load_capsule(args.path, agent.transcript, session_notebook=agent.notebook, counter=agent.counter)
    print(
        f"loaded {entry.title!r} from {entry.source} as {entry.checkpoint_id} "
        f"({entry.tokens_after:,} tokens · quality {entry.quality}); the next turn starts from it"
    )
    _show_markdown(magics, entry.content)
    magics.refresh_monitor()


def capsule_list(magics: SobaMagics, agent: AgentSession, rest: str) -> None:
    args = parse(_list_arguments, rest)
    if args.memory:
        found = list_memory(agent.project_root)
        if not found:
            print(f"project memory is empty ({shown(memory_dir(agent.project_root))})")
        for item in found:
            meta = item.metadata
            described = f"{meta.title} · {meta.quality} · {meta.created}" if meta else f"unreadable: {item.error}"
            print(f"{item.path.name}  {described}")
        return
    capsules = agent.capsules()
    if not capsules:
        print("no capsules on the current path")
    for capsule in capsules:
        origin = capsule.title or capsule.source or ""
        print(f"{capsule_line(capsule)} · {capsule.quality}" + (f" · {origin}" if origin else ""))


def capsule_show(magics: SobaMagics, agent: AgentSession, rest: str) -> None:
    args = parse(_show_arguments, rest)
    if args.checkpoint:
        capsule = find_capsule(agent.transcript, args.checkpoint)
    else:
        capsules = agent.capsules()
        if not capsules:
            print("no capsules on the current path")
            return
        capsule = capsules[-1]
    print(f"{capsule_line(capsule)} · quality {capsule.quality}")
    _show_markdown(magics, capsule.content)


def _show_markdown(magics: SobaMagics, text: str) -> None:
    if not magics.rich:
        print(text)
        return
    ipython_display(TextView(text))


COMMANDS: dict[str, Callable[[SobaMagics, AgentSession, str], None]] = {
    "create": capsule_create,
    "export": capsule_export,
    "load": capsule_load,
    "list": capsule_list,
    "show": capsule_show,
}
"""`%capsule SUBCOMMAND …` → its handler, in the order the usage message names them."""


# Parsers of the %capsule subcommands (magic_arguments builds them; the docstrings are help).


@magic_arguments(name="capsule create")
@argument("title", nargs="+", help="The capsule's title (quote it, or the rest of the line).")
@argument("--force", action="store_true", help="Replace an existing file of that name.")
def _create_arguments() -> None:
    """Write a portable handoff capsule of the current state."""


@magic_arguments(name="capsule export")
@argument("checkpoint", help="Checkpoint id of a capsule (ck_…).")
@argument("path", help="Output file or folder.")
@argument("--force", action="store_true", help="Replace an existing file.")
def _export_arguments() -> None:
    """Write one capsule of this session to a .capsule.md file."""


@magic_arguments(name="capsule load")
@argument("path", help="A .capsule.md file.")
def _load_arguments() -> None:
    """Start this session from a capsule file."""


@magic_arguments(name="capsule list")
@argument("--memory", action="store_true", help="List the project memory instead.")
def _list_arguments() -> None:
    """List capsules."""


@magic_arguments(name="capsule show")
@argument("checkpoint", nargs="?", help="Checkpoint id; default: the latest capsule on the path.")
def _show_arguments() -> None:
    """Show a capsule's Markdown."""
