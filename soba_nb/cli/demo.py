"""`soba-nb demo [FOLDER]`: the quick-start session, offline, on the embedded model;
`soba-nb doctor [FOLDER]`: which model would be used, and why; the limits."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from soba_nb.cli import EXIT_OK, PROG, CommandError, subcommand


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
