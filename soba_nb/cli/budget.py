"""`soba-nb budget SESSION [--json] [--count]`: hardLimit / softLimit, effective tokens and
what the session cost (SPEC §11, priced from its own transcript as `%budget` prices it)."""

from __future__ import annotations

import argparse

from soba_nb.cli.session import (
    load_counted_session,
    notebook_folder,
    session_config,
    token_arguments,
    token_figures,
    uncounted_note,
)
from soba_nb.cli.table import EXIT_OK, print_json, subcommand


@subcommand(
    "budget", "hardLimit, softLimit and effective tokens of a session", token_arguments
)
def budget_command(args: argparse.Namespace) -> int:
    from soba_nb.agent.cost import CostLedger, cap_note
    from soba_nb.agent.limits import session_limits

    transcript = load_counted_session(args.session)
    folder = notebook_folder(transcript)
    config = session_config(transcript)
    limits = session_limits(config, transcript)
    hard, soft = limits.hard_limit, limits.soft_limit(config)
    tokens = token_figures(transcript, config, count=args.count, path_total=False)
    effective = tokens["effectiveTokens"]
    ledger = CostLedger()
    ledger.follow(transcript)
    cost = ledger.cost(config)
    info = {
        "session": str(args.session),
        "configFolder": str(folder),
        "configSource": "recorded by the session" if transcript.config else "soba.json of the notebook's folder",
        "model": f"{config.model.provider}/{config.model.name}",
        "contextWindow": limits.context_window,
        "windowSource": limits.window_source,
        "maxOutputTokens": limits.max_output_tokens,
        "hardLimit": hard,
        "softLimit": soft,
        "effectiveTokens": effective,
        "source": tokens["source"],
        "estimatedTokens": tokens["estimatedTokens"],
        "uncountedEntries": tokens["uncountedEntries"],
        "auto": limits.auto,
        "autoSource": limits.auto_source,
        "overHardLimit": effective > hard,
        "overSoftLimit": effective >= soft,
        "cost": cost.to_json(),
        "maxSessionCostUsd": config.agent.max_session_cost_usd,
    }
    if args.json:
        print_json(info)
        return EXIT_OK
    share = effective / hard if hard > 0 else 0.0
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
                f"config     {'recorded by the session' if transcript.config else folder} · model {info['model']}",
                f"window     {limits.context_window} ({limits.window_source}) · maxOutputTokens {limits.max_output_tokens}",
                f"hardLimit  {hard}",
                f"softLimit  {soft}",
                f"effective  {effective} ({tokens['source']}) · {share:.0%} of hardLimit · {state}",
                f"estimated  {tokens['estimatedTokens'] if tokens['estimatedTokens'] is not None else uncounted_note(tokens)}",
                f"auto       {'on' if limits.auto else 'off'} ({limits.auto_source})",
                cost.line() + cap_note(config),
            ]
        )
    )
    return EXIT_OK
