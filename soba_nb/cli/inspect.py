"""`soba-nb inspect SESSION [--json] [--count]`: entries, leaf, checkpoints, capsules, token figures."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from soba_nb.cli.session import (
    load_counted_session,
    session_config,
    token_arguments,
    token_figures,
    uncounted_note,
)
from soba_nb.cli.table import EXIT_OK, print_json, subcommand
from soba_nb.printable import printable
from soba_nb.transcript.entries import CapsuleEntry, CheckpointEntry, entry_to_dict
from soba_nb.transcript.store import Transcript


def describe(transcript: Transcript, *, count: bool = False) -> dict[str, Any]:
    """Everything `inspect` shows, as JSON-ready data (`count`: `token_figures`)."""
    header = transcript.header
    entries = transcript.entries
    return {
        "session": str(transcript.file),
        "header": entry_to_dict(header) if header else None,
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
                "continuation": entry.continuation,
                "amends": entry.amends,
                "author": entry.author,
                # Which native item it holds, never the item itself (opaque, often encrypted).
                "native": None
                if entry.native is None
                else {"provider": entry.native.provider, "model": entry.native.model, "kind": entry.native.kind},
            }
            for entry in entries
            if isinstance(entry, CapsuleEntry)
        ],
        "tokens": token_figures(transcript, session_config(transcript) if transcript.config else None, count=count),
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
        + (f"  native {cap['native']['provider']}/{cap['native']['model']} ({cap['native']['kind']})" if cap["native"] else "")
        + (f"  amends {cap['amends']} by {printable(cap['author'] or 'unknown')}" if cap["amends"] else "")
        for cap in info["capsules"]
    ]
    exactness = "" if tokens["exactTokenizer"] else ", estimate for this model family"
    path, estimated = tokens["pathTokens"], tokens["estimatedTokens"]
    lines += [
        f"tokens       path {path if path is not None else 'not counted'} · model input "
        f"{estimated if estimated is not None else 'not counted'} "
        f"(estimated, {tokens['encoding']}{exactness}; system prompt and tool schemas not included)",
    ]
    if path is None:
        lines.append(f"  {uncounted_note(tokens)}")
    usage = tokens["lastUsage"]
    lines.append(
        f"  last provider usage: input {usage['inputTokens']}, output {usage['outputTokens']} "
        f"(entry {usage['id']})"
        if usage
        else "  last provider usage: none recorded"
    )
    return "\n".join(lines)


@subcommand(
    "inspect", "entries, leaf, checkpoints, capsules and token figures", token_arguments
)
def inspect_command(args: argparse.Namespace) -> int:
    info = describe(load_counted_session(args.session), count=args.count)
    if args.json:
        print_json(info)
    else:
        print(render_inspect(info))
    return EXIT_OK
