"""`soba-nb demo [FOLDER]`: the quick-start session, offline, on the embedded model;
`soba-nb doctor [FOLDER]`: which model would be used, and why; the limits; the file each
setting came from (SPEC §13: an admin's `/etc/soba/config.json` is one of them); whether
capsule files are signed."""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path
from typing import Any

from soba_nb.cli.table import EXIT_OK, PROG, CommandError, subcommand


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
    from soba_nb.agent.mcp.report import doctor_lines as mcp_doctor_lines
    from soba_nb.catalogue import lookup
    from soba_nb.cli.sidebar import sidebar_state
    from soba_nb.config import ConfigError, ConfigLockedWarning, load_config
    from soba_nb.providers.discovery import discover_window
    from soba_nb.resolution import embedded_model_installed
    from soba_nb.window import resolve_limits

    folder = args.folder or Path.cwd()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConfigLockedWarning)  # listed below, on stdout
            config = load_config(folder)
    except ConfigError as error:
        raise CommandError(f"{PROG} doctor: {error}") from None
    model = config.model
    key_env = model.api_key_env
    key_state = "not needed" if not key_env else ("set" if key_env in os.environ else "NOT set")
    server = None
    if model.provider == "openai" and model.base_url:
        key = os.environ.get(key_env, "").strip() if key_env else ""
        server = discover_window(model.base_url, model.name, api_key=key or None)
    limits = resolve_limits(config, catalogue=lookup(model.provider, model.name), server=server)
    lines = [
        f"provider   {model.provider} · {config.provider_source}",
        f"model      {model.name}",
        f"window     {limits.context_window:,} ({limits.window_source}) · maxOutputTokens {limits.max_output_tokens:,}",
        f"baseUrl    {model.base_url or '(provider default)'}",
        f"api key    {key_env or '-'} {key_state}",
        f"embedded   {'installed' if embedded_model_installed() else 'not installed'}",
        f"sidebar    {sidebar_state()}",
        f"hardLimit  {limits.hard_limit:,}",
        f"softLimit  {limits.soft_limit(config):,}",
        f"auto       {'on' if limits.auto else 'off'} (config; a session's %auto_compact setting wins)",
        f"summaries  {_summary_model(config)}",
        f"AGENTS.md  {_instructions(folder, config, limits.hard_limit)}",
    ]
    lines += [f"note       {note}" for note in limits.notes]
    lines += ["why        " + step if index == 0 else "           " + step for index, step in enumerate(config.provider_steps)]
    lines.append(f"config     {_config_files(folder)}")
    lines += _setting_lines(config.to_json(), config.explicit_keys)
    lines += _locked_lines(config)
    lines += mcp_doctor_lines(config, folder)  # each MCP server started, its tools listed, stopped
    lines.append(f"capsules   {_capsule_signing()}")
    print("\n".join(lines))
    return EXIT_OK


def _instructions(folder: Path, config: Any, hard_limit: int) -> str:
    """The project's `AGENTS.md` that every request carries (SPEC §19): its path, its tokens,
    whether it is clipped; why it is not sent; or none."""
    from soba_nb.agent.instructions import AGENTS_FILE, instructions_limit, read_instructions
    from soba_nb.agent.limits import session_counter
    from soba_nb.layout import project_root_for
    from soba_nb.paths import shown
    from soba_nb.printable import printable

    root = project_root_for(folder)
    found = read_instructions(root, session_counter(config), limit=instructions_limit(hard_limit))
    instructions = found.instructions
    if instructions is None:
        if found.line is not None:
            return printable(found.line)
        if os.path.lexists(root / AGENTS_FILE):
            return printable(f"{shown(root / AGENTS_FILE)}: empty; not sent")
        return printable(f"none (no {AGENTS_FILE} in the project folder {root})")
    sent = (
        f"clipped: the first {instructions.sent_tokens:,} are sent"
        if instructions.clipped
        else "sent whole"
    )
    return printable(
        f"{shown(instructions.path)} · {instructions.tokens:,} tokens · {sent} with every request "
        "(%soba --no-instructions leaves it out for a turn)"
    )


def _summary_model(config: Any) -> str:
    """Who writes the summaries (SPEC §14): `model`, or `compaction.model` with its limits,
    its address, whether its key variable is set and its prices."""
    from soba_nb.agent.cost import summary_prices
    from soba_nb.agent.limits import summary_window
    from soba_nb.printable import note_line

    summary, window = config.summary_model, summary_window(config)
    if summary is None or window is None:
        return "by the model (compaction.model is null)"
    key_env = summary.api_key_env
    key_state = "not needed" if not key_env else ("set" if key_env in os.environ else "NOT set")
    prices = summary_prices(config)
    return note_line(
        f"{summary.name} ({summary.provider}, compaction.model) · window {window.context_window:,} · "
        f"maxOutputTokens {window.output_tokens:,} · a summary request up to {window.input_tokens:,} tokens · baseUrl "
        f"{summary.base_url or '(provider default)'} · api key {key_env or '-'} {key_state} · prices: "
        f"{prices.source if prices is not None else 'none'} · native compaction not asked",
        SUMMARY_LINE_CHARS,
    )


SUMMARY_LINE_CHARS = 400
"""The summary line is long: a base URL and a price source fit, a planted one does not."""


SETTING_VALUE_CHARS = 60


def _setting_lines(values: dict[str, Any], explicit: dict[str, str]) -> list[str]:
    """`set        model.baseUrl = "https://…" · /etc/soba/config.json`, one per key a layer
    set, in the order of the keys; every other key has its default (or the provider's)."""
    from soba_nb.printable import note_line, printable
    from soba_nb.redact import redact

    lines = []
    for section, keys in values.items():
        for key, value in keys.items():
            layer = explicit.get(f"{section}.{key}")
            if layer is not None:
                shown_value = note_line(redact(json.dumps(value, ensure_ascii=False)), SETTING_VALUE_CHARS)
                lines.append(f"{section}.{key} = {shown_value} · {printable(layer)}")
    if not lines:
        return ["set        (none: every setting has its default)"]
    lines.append("every other setting: its default")
    return ["set        " + line if index == 0 else "           " + line for index, line in enumerate(lines)]


def _locked_lines(config: Any) -> list[str]:
    """`locked     model.baseUrl · /etc/soba/config.json`, one per key the admin locked (SPEC
    §16), then one `ignored` line per setting of a later layer that tried to change one."""
    from soba_nb.printable import printable

    locked = [f"{key} · {printable(source)}" for key, source in config.locked.items()] or ["(none)"]
    lines = ["locked     " + line if index == 0 else "           " + line for index, line in enumerate(locked)]
    return lines + [f"ignored    {printable(note)}" for note in config.lock_notes]


def _config_files(folder: Path) -> str:
    """The file layers, lowest first, each found or not (SPEC §13's order)."""
    from soba_nb.config import find_project_config, system_config_path
    from soba_nb.layout import SYSTEM_CONFIG_ENV, USER_CONFIG_PATH
    from soba_nb.paths import shown
    from soba_nb.printable import printable

    system = system_config_path(os.environ)
    project = find_project_config(folder)
    files = [
        ("system", system, f"none ({SYSTEM_CONFIG_ENV} is empty)"),
        ("user", USER_CONFIG_PATH.expanduser(), ""),
        ("project", project, "no soba.json"),
    ]
    parts = []
    for name, path, missing in files:
        if path is None:
            parts.append(f"{name} {missing}")
        else:
            state = "" if os.path.lexists(path) else " (not found)"
            parts.append(f"{name} {printable(shown(path))}{state}")
    return " → ".join(["defaults", *parts, "environment", "arguments"])


def _capsule_signing() -> str:
    from soba_nb.capsule_files.signing import (
        ADVISED_KEY_CHARS,
        CAPSULE_KEY_ENV,
        CapsuleKeyError,
        capsule_key,
    )

    try:
        key = capsule_key(os.environ)
    except CapsuleKeyError as error:
        return f"NOT signed: {error}"
    if key is None:
        return f"unsigned (no {CAPSULE_KEY_ENV}: loading says unsigned)"
    advice = "" if len(key) >= ADVISED_KEY_CHARS else f"; a key of {ADVISED_KEY_CHARS}+ random characters is advised"
    return f"signed with the team key ({CAPSULE_KEY_ENV} is set; loads verify it){advice}"
