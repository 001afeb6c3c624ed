"""Issue 28: a transcript opened cold — copied, downloaded or restored without what soba-nb
keeps beside it (`.tokens`, `.budget`, `.extract`) — resumed at 10–40× pi's time, because
every entry was counted to know the effective tokens. SPEC §2's figure is the provider's
count of the last request plus what came after it: only that is counted to open the session
and run its first preflight, and the first `%soba` reads the same figures a warm session
reads. (The request's input is counted whole when it is built: under the hard limit, about a
window's worth.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from soba_nb.agent.assembly import open_session
from soba_nb.compaction.triggers import TurnState
from soba_nb.config import build_config
from soba_nb.layout import SessionLayout
from soba_nb.transcript.entries import MessageEntry, ToolCallEntry, ToolResultEntry, UsageEntry
from soba_nb.transcript.token_index import index_path

ROUNDS = 200
CONFIG = build_config([("test", {"model": {"provider": "openai", "name": "gpt-4o"}})])


def a_long_session(folder: Path) -> Path:
    path = folder / "analysis.soba" / "s.jsonl"
    session = open_session(CONFIG, SessionLayout(path), project_root=folder)
    append = session.transcript.append
    for n in range(ROUNDS):
        append(MessageEntry(role="user", content=f"Load part {n} of sales.csv and show the revenue by region."))
        append(MessageEntry(role="assistant", content=f"Reading part {n}."))
        append(ToolCallEntry(call_id=f"call_{n}", name="python", arguments='{"code": "df.describe()"}'))
        append(ToolResultEntry(call_id=f"call_{n}", name="python", content=f"region,revenue\nnorth,{n}\n" * 5))
        append(UsageEntry(input_tokens=2_000 + 60 * n, output_tokens=20))
    append(MessageEntry(role="user", content="Now plot the revenue by month."))
    session.compactor.measure()
    session.compactor.tracker.settle()  # a warm session counted everything and saved it
    session.compactor.measure()
    session.close()
    return path


def first_request(path: Path, folder: Path) -> tuple[tuple[object, ...], int]:
    """What the first `%soba` of a new kernel reads before its request leaves, and how many
    counts its preflight needed."""
    session = open_session(CONFIG, SessionLayout(path), project_root=folder)
    try:
        compactor = session.compactor
        assert compactor.preflight(TurnState()) is None  # under the soft limit: nothing to compact
        measured, counted = compactor.measure(), session.counter.cache_size
        built = compactor.request_for_sending()
        figures = (measured.effective, measured.source, measured.estimated, built.tokens, built.messages)
        return (*figures, compactor.send_figure(built)), counted
    finally:
        session.close()


def test_a_copied_transcript_reads_the_warm_figures_counting_only_the_last_request(tmp_path: Path) -> None:
    warm_path = a_long_session(tmp_path / "warm")
    cold_path = tmp_path / "copy" / "analysis.soba" / warm_path.name
    cold_path.parent.mkdir(parents=True)
    shutil.copyfile(warm_path, cold_path)  # the transcript alone

    warm, _ = first_request(warm_path, tmp_path / "warm")
    cold, counted = first_request(cold_path, tmp_path / "copy")
    assert cold == warm
    # To open it and run the preflight: the last figure's answer, its call and result, the new
    # request, the system prompt and tools — a handful of counts for a path of 1,000 entries.
    assert counted <= 8
    assert len(index_path(cold_path).read_bytes().splitlines()) > 4 * ROUNDS  # the input's, kept


def budget_json(capsys, path: Path) -> dict[str, object]:
    from soba_nb.cli import main

    assert main(["budget", "--json", str(path)]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_transcript_copied_alone_after_percent_soba_turns_opens_without_its_tokenizer(
    ip, nb_dir: Path, scripted, capsys, forbid_tokenizer
) -> None:
    """Each finished turn records the budget tracker's state on its checkpoint: the `.jsonl`
    alone, copied after a `%soba` session, gives `soba-nb budget` and a new session the warm
    figures without loading a tokenizer (0.15 s and 60 MiB at a cold open)."""
    from conftest import shut_down
    from IPython.utils.capture import capture_output
    from llm_server import text, tool_calls


    scripted.script(tool_calls(("python", {"code": "total = 6 * 7"})), text("total is 42."), text("Plotted."))
    with capture_output():
        ip.run_line_magic("soba", "compute the total")
        ip.run_line_magic("soba", "now plot it")
    session = ip.magics_manager.registry["SobaMagics"].agent
    path, expected = session.transcript.file, session.compactor.measure()
    shut_down(ip)
    last = json.loads(path.read_bytes().splitlines()[-1])
    assert (last["type"], last["kind"]) == ("checkpoint", "turn") and last["budget"]["usageInput"] > 0
    warm = budget_json(capsys, path)

    copy = nb_dir / "elsewhere" / "copy.soba" / path.name
    copy.parent.mkdir(parents=True)
    shutil.copyfile(path, copy)
    (copy.parent.parent / "soba.json").write_bytes((nb_dir / "soba.json").read_bytes())
    forbid_tokenizer()
    cold = budget_json(capsys, copy)
    assert cold["source"] == warm["source"] == "provider_usage"
    assert (cold["effectiveTokens"], cold["estimatedTokens"]) == (warm["effectiveTokens"], warm["estimatedTokens"])
    assert cold["effectiveTokens"] == expected.effective
    # The same notebook on the same day: the same system prompt, environment line and all (another
    # notebook's name, or tomorrow's date, is a line of its own: it alone is counted).
    reopened = open_session(session.config, SessionLayout(copy), project_root=copy.parent.parent, notebook=session.notebook)
    try:
        assert reopened.compactor.measure() == expected and reopened.compactor.tracker.restores == 1
    finally:
        reopened.close()


NOT_IMPORTED = ("tiktoken", "httpx", "pydantic", "soba_nb.providers", "soba_nb.agent.session", "soba_nb.agent.tools")
"""What `soba-nb budget` of a session with its saved state needs none of: a tokenizer (0.15 s
and 60 MiB to load), an HTTP client, pydantic (50 ms to import, more to build models: the
configuration is msgspec, the tool schemas are data), a provider, the tools (every import is
paid by each whole process)."""


@pytest.mark.parametrize("command", ["budget", "inspect"])
def test_a_command_on_a_session_with_its_state_imports_no_tokenizer_http_client_pydantic_or_provider(
    tmp_path: Path, command: str
) -> None:
    import subprocess
    import sys

    path = a_long_session(tmp_path)
    script = (
        "import json, sys\n"
        "from soba_nb.cli import main\n"
        f"code = main([{command!r}, '--json', {str(path)!r}])\n"
        f"print(json.dumps([code, sorted(m for m in {NOT_IMPORTED!r} if m in sys.modules)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    code, imported = json.loads(done.stdout.splitlines()[-1])
    assert (code, imported) == (0, [])


def budget_in_a_fresh_interpreter(path: Path, cache_home: Path) -> tuple[dict[str, object], bool]:
    """`soba-nb budget --json` in a new process whose cache folder is `cache_home`'s: its
    figures, and whether it imported tiktoken."""
    import os
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from soba_nb.cli import main\n"
        f"assert main(['budget', '--json', {str(path)!r}]) == 0\n"
        "print(json.dumps('tiktoken' in sys.modules))\n"
    )
    environment = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False, env=environment
    )
    assert done.returncode == 0, done.stderr
    *figures, imported = done.stdout.strip().splitlines()
    return json.loads("\n".join(figures)), json.loads(imported)


def test_a_copy_with_no_state_counts_its_plain_tail_without_building_the_encoder(tmp_path: Path) -> None:
    """A transcript with no budget state anywhere (written before states were recorded,
    copied mid-turn) counts what came after its last usage figure: plain text is counted from
    the encoding's plain tokens kept in the cache folder (`soba_nb.plain_counts`), the same
    figures, without tiktoken's encoder (0.1-0.15 s and 60 MiB); with no table kept, the
    encoder counts, and keeps the table for the next process."""
    from soba_nb import plain_counts, tokens

    warm_path = a_long_session(tmp_path / "warm")
    warm = budget_json_in_process(warm_path)
    copy = tmp_path / "copy" / "analysis.soba" / warm_path.name
    copy.parent.mkdir(parents=True)
    shutil.copyfile(warm_path, copy)  # the transcript alone: no `.budget`, no `turn` checkpoint
    assert b'"budget":' not in copy.read_bytes()

    cache_home = tmp_path / "xdg"
    first, imported = budget_in_a_fresh_interpreter(copy, cache_home)
    assert imported  # nothing kept yet: the encoder counted ...
    table = cache_home / "soba-nb" / plain_counts.FILE_NAME
    assert table.read_bytes() == plain_counts.build(tokens._mergeable_ranks("o200k_base", tokens._packaged_bpe("o200k_base")))
    shutil.rmtree(copy.parent)  # ... and wrote the counts beside the copy: copied alone again
    copy.parent.mkdir(parents=True)
    shutil.copyfile(warm_path, copy)
    second, imported = budget_in_a_fresh_interpreter(copy, cache_home)
    assert not imported
    for figures in (first, second):
        assert figures["source"] == "provider_usage"
        assert figures["effectiveTokens"] == warm["effectiveTokens"]


def budget_json_in_process(path: Path) -> dict[str, object]:
    import contextlib
    import io

    from soba_nb.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["budget", "--json", str(path)]) == 0
    return json.loads(out.getvalue())
