"""What the `soba-nb` commands share about a session: the SESSION argument, loading a
transcript read-only, its model, its token figures and the folder whose `soba.json` applies.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from soba_nb.cli.table import EXIT_USAGE, PROG, CommandError
from soba_nb.compaction.budget_state import has_saved_state, tail_is_plain
from soba_nb.layout import SESSIONS_FOLDER_SUFFIX, session_transcripts, sessions_folder_for
from soba_nb.transcript.entries import UsageEntry
from soba_nb.transcript.store import TornLineWarning, Transcript, TranscriptError

if TYPE_CHECKING:
    from soba_nb.config import SobaConfig

HEADER_BYTES = 64 * 1024
"""A header line longer than this is not read to choose a tokenizer ahead."""



def session_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "session",
        metavar="SESSION",
        type=session_path,
        help="a .jsonl transcript, or a notebook or its .soba folder (its latest session)",
    )


def session_path(text: str) -> Path:
    """SESSION as typed: a transcript, or a notebook (`analysis.ipynb`) or its sessions folder
    (`analysis.soba`), which stand for the session written last (`session_transcripts`: links
    and flight records are none). Which one that was is said on stderr when there were others."""
    path = Path(text)
    if path.suffix == ".ipynb":
        folder = sessions_folder_for(path)
        none = f"no soba-nb session for this notebook (no transcript in {folder})"
    elif path.is_dir():
        folder, none = path, "a folder with no soba-nb session transcript in it"
    else:
        return path
    sessions = session_transcripts(folder)
    if not sessions:
        raise argparse.ArgumentTypeError(f"{text}: {none}")
    latest = sessions[-1]
    if len(sessions) > 1:
        print(f"{PROG}: {text}: the latest of {len(sessions)} sessions, {latest.name}", file=sys.stderr)
    return latest


def session_and_json_arguments(parser: argparse.ArgumentParser) -> None:
    session_argument(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def token_arguments(parser: argparse.ArgumentParser) -> None:
    """SESSION, --json and --count (the commands that show token figures)."""
    session_and_json_arguments(parser)
    parser.add_argument(
        "--count",
        action="store_true",
        help="count every entry the local figures need, even those with no count kept beside the transcript",
    )


def load_session(path: Path) -> Transcript:
    """Load a transcript read-only; torn lines become one warning line each on stderr."""
    if not path.exists():
        raise CommandError(f"{PROG}: error: {path}: no such file", EXIT_USAGE)
    if path.is_dir():
        raise CommandError(
            f"{PROG}: error: {path}: is a folder, not a .jsonl transcript", EXIT_USAGE
        )
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always", TornLineWarning)
        try:
            transcript = Transcript.load(path)
        except TranscriptError as error:
            raise CommandError(str(error)) from None
        except OSError as error:
            raise CommandError(f"{path}: cannot read ({error.strerror})") from None
    # Torn lines after the last entry are crash leftovers no append has followed yet; earlier
    # ones were recovered by an append (marked `followsTornLine`).
    entries = transcript.entries
    last_entry_line = transcript.line_of(entries[-1].id) if entries else 0
    for line in transcript.torn_lines:
        what = "torn line at the end ignored" if line > last_entry_line else "torn line (recovered after a crash)"
        print(f"{path}:{line}: warning: {what}", file=sys.stderr)
    return transcript


def load_counted_session(path: Path) -> Transcript:
    """`load_session` for a command that counts: a transcript without a saved budget state
    (beside it, or on its last line) is counted from its last usage figure on, so the
    tokenizer its header's model counts with is loaded first (`TokenCounter.load`; the
    embedded model's is left alone)."""
    if path.is_file() and not has_saved_state(path):
        with contextlib.suppress(OSError, ValueError, AttributeError), path.open("rb") as lines:
            model = json.loads(lines.readline(HEADER_BYTES)).get("model") or ""
            provider, _, name = model.partition("/")
            if name and provider != "local":
                from soba_nb.tokens import TokenCounter

                TokenCounter.for_model(provider, name).load(plain_text=tail_is_plain(path))
    return load_session(path)


def model_of(transcript: Transcript) -> tuple[str, str]:
    """(provider, model name) from the header's `provider/name`."""
    header = transcript.header
    if header is None or not header.model:
        return "unknown", "unknown"
    provider, _, name = header.model.partition("/")
    return (provider, name) if name else ("unknown", provider)


def session_config(transcript: Transcript) -> SobaConfig:
    """The configuration the session recorded (`config` entry); for a transcript written
    before sessions recorded it, the `soba.json` of its notebook's folder."""
    from soba_nb.config import ConfigError, load_config, recorded_config

    recorded = transcript.config
    if recorded is not None:
        try:
            return recorded_config(recorded.config, recorded.explicit, "recorded by the session")
        except ValueError as error:
            raise CommandError(f"{transcript.file}: {error}") from None
    try:
        return load_config(notebook_folder(transcript))
    except ConfigError as error:
        raise CommandError(f"{PROG}: {error}") from None


def token_figures(
    transcript: Transcript, config: SobaConfig | None = None, *, count: bool = False, path_total: bool = True
) -> dict[str, Any]:
    """Estimated tokens (whole path and effective model input) and the provider figure,
    measured exactly as the agent's preflight measures them, with the session's tokenizer.

    The effective figure needs only what came after the last usage figure. The local ones
    (`pathTokens`, `estimatedTokens`) need a count of every entry: they are given when the
    counts are at hand (kept beside the transcript), when few entries lack one, or with
    `count`; else None, and `uncountedEntries` says how many lack one (a transcript copied
    without what soba-nb keeps beside it: counting 300,000 entries takes most of a minute).
    `path_total`: give `pathTokens` (without it, `uncountedEntries` counts what the estimate
    lacks, and the counts kept beside the transcript are not read for it)."""
    from soba_nb.agent.measure import measure_recorded
    from soba_nb.compaction.budget import EAGER_BACKLOG_ENTRIES
    from soba_nb.compaction.model_input import entry_tokens
    from soba_nb.layout import project_root_for
    from soba_nb.tokens import TokenCounter  # loads the BPE ranks: only when counting
    from soba_nb.transcript.entries import (
        CapsuleEntry,
        CellsEntry,
        MessageEntry,
        ToolCallEntry,
        ToolResultEntry,
    )

    provider, name = model_of(transcript)
    project_root = project_root_for(notebook_folder(transcript)) if config is not None else None
    counter, measurement = measure_recorded(
        transcript, config, None if config is not None else TokenCounter.for_model(provider, name), project_root=project_root
    )
    path = transcript.path_view()
    backlog = measurement.backlog
    path_tokens = estimated = None
    if not path_total:
        uncounted = 0 if backlog is None or count else backlog.visible
        estimated = measurement.estimated if not uncounted else None
    else:
        costly = (MessageEntry, ToolCallEntry, ToolResultEntry, CellsEntry, CapsuleEntry)
        entries = [entry for entry in path if type(entry) in costly]  # the others cost nothing
        known = counter.known_all([entry.id for entry in entries])
        uncounted = known.count(None)
        if count or uncounted < EAGER_BACKLOG_ENTRIES:
            path_tokens = sum(entry_tokens(e, counter) if cost is None else cost for e, cost in zip(entries, known, strict=True))
            estimated, uncounted = measurement.estimated, 0
        elif backlog is None:
            estimated = measurement.estimated
    # A compaction request's figure measures its summary prompt, not the path.
    last_usage = next((e for e in reversed(path) if isinstance(e, UsageEntry) and e.operation == "inference"), None)
    return {
        "encoding": counter.choice.encoding,
        "exactTokenizer": counter.choice.exact,
        "pathTokens": path_tokens,
        "estimatedTokens": estimated,
        "uncountedEntries": uncounted,
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


def uncounted_note(tokens: dict[str, Any]) -> str:
    """What a local figure left out says (`token_figures`)."""
    return (
        f"not counted ({tokens['uncountedEntries']:,} entries have no count kept beside the transcript; "
        f"--count counts them, effective tokens need none of them)"
    )


def notebook_folder(transcript: Transcript) -> Path:
    """The folder whose `soba.json` applies: the notebook's, from the header or the layout."""
    header = transcript.header
    session_folder = transcript.file.resolve().parent
    if header is not None and header.notebook:
        notebook = Path(header.notebook).expanduser()
        if not notebook.is_absolute() and session_folder.name.endswith(SESSIONS_FOLDER_SUFFIX):
            notebook = session_folder.parent / notebook
        if notebook.is_absolute():
            return notebook.parent
    if session_folder.name.endswith(SESSIONS_FOLDER_SUFFIX):
        return session_folder.parent
    return session_folder
