"""`soba-nb demo [FOLDER]`: the quick-start session, offline, on the embedded model;
`soba-nb doctor [FOLDER]`: which model would be used, and why; the limits."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

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
    from soba_nb.catalogue import lookup
    from soba_nb.cli.sidebar import sidebar_state
    from soba_nb.config import ConfigError, load_config
    from soba_nb.providers.discovery import discover_window
    from soba_nb.resolution import embedded_model_installed
    from soba_nb.window import resolve_limits

    folder = args.folder or Path.cwd()
    try:
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
    ]
    lines += [f"note       {note}" for note in limits.notes]
    lines += ["why        " + step if index == 0 else "           " + step for index, step in enumerate(config.provider_steps)]
    print("\n".join(lines))
    return EXIT_OK
