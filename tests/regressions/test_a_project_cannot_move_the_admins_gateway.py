"""Issue 40, break 12 (SPEC §16 "An admin can lock settings"): on a JupyterHub a project's
`soba.json` redirected `model.baseUrl` and named `JUPYTERHUB_API_TOKEN` as `model.apiKeyEnv`,
and the hub token went to that server. With the admin's `"locked"` list, a real notebook's
`%soba` asks the admin's server with the admin's key variable; the project's server hears
nothing, the hub token is sent nowhere, and the notebook is told in one line per key, once."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import SMALL_LIMITS, TEST_KEY_ENV, TEST_KEY_VALUE, write_soba_json
from IPython.utils.capture import capture_output
from llm_server import LLMServer, text

from soba_nb.config import ConfigLockedWarning
from soba_nb.paths import shown

HUB_TOKEN = "hubtoken-" + "a3f9c2e17b5d4e0f8c6a9b2d1e7f3c5a"


def show_on_stderr(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    """As a kernel shows a warning: on the cell's stderr (pytest records them otherwise)."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def admin_locks_the_gateway(llm_server: LLMServer) -> Path:
    """The admin's system file (the nb_dir fixture's, under tmp_path): the loopback server as
    the gateway, its address and key variable locked."""
    system = Path(os.environ["SOBA_SYSTEM_CONFIG"])
    model = {"provider": "openai", "name": "gpt-4o", "baseUrl": llm_server.url, "apiKeyEnv": TEST_KEY_ENV}
    system.write_text(json.dumps({"model": model, "locked": ["model.baseUrl", "model.apiKeyEnv"]}), encoding="utf-8")
    return system


def test_the_hub_token_goes_nowhere_and_the_admins_server_is_asked(
    ip: Any, nb_dir: Path, llm_server: LLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = admin_locks_the_gateway(llm_server)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", HUB_TOKEN)
    llm_server.default_reply = text("answered by the admin's gateway")
    with LLMServer() as project_server:
        project_server.default_reply = text("answered by the project's server")
        soba_json = write_soba_json(nb_dir, project_server.url, {"model": {"apiKeyEnv": "JUPYTERHUB_API_TOKEN"}})
        with warnings.catch_warnings():
            warnings.showwarning = show_on_stderr
            warnings.simplefilter("always", ConfigLockedWarning)
            with capture_output() as first:
                ip.run_line_magic("soba", "hello")
            with capture_output() as second:
                ip.run_line_magic("soba", "and again")
        heard_by_project = list(project_server.requests)

    assert "answered by the admin's gateway" in first.stdout and "answered by the admin's gateway" in second.stdout
    assert heard_by_project == []
    asked = [request for request in llm_server.requests if request.operation == "inference"]
    assert len(asked) == 2
    assert all(request.headers.get("authorization") == f"Bearer {TEST_KEY_VALUE}" for request in asked)
    assert {request.headers.get("authorization") for request in llm_server.requests} <= {f"Bearer {TEST_KEY_VALUE}", None}
    for request in llm_server.requests:
        assert HUB_TOKEN not in request.raw.decode("utf-8", "replace")
        assert all(HUB_TOKEN not in value for value in request.headers.values())
    for path in tmp_path.rglob("*"):
        if path.is_file() and path != soba_json:
            assert HUB_TOKEN.encode() not in path.read_bytes(), path

    # The transcript's configuration entry names the admin's file for the locked keys.
    entries = [json.loads(line) for line in next(nb_dir.glob("analysis.soba/*.jsonl")).read_text().splitlines()]
    [recorded] = [entry for entry in entries if entry.get("type") == "config"]
    assert recorded["config"]["model"]["baseUrl"] == llm_server.url
    assert recorded["explicit"]["model.baseUrl"] == recorded["explicit"]["model.apiKeyEnv"] == shown(system)

    lines = [line for line in (first.stderr + second.stderr).splitlines() if "locked by the admin" in line]
    assert len(lines) == 2, first.stderr + second.stderr  # one per key, the first time only
    assert f"{shown(soba_json)}: model.baseUrl is locked by the admin in {shown(system)}; this setting is ignored" in lines[0]
    assert f"{shown(soba_json)}: model.apiKeyEnv is locked by the admin in {shown(system)}; this setting is ignored" in lines[1]


def test_a_summary_model_of_the_projects_own_cannot_carry_the_hub_token_elsewhere(
    ip: Any, nb_dir: Path, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same attack through `compaction.model`: its own `baseUrl` and `apiKeyEnv`. The locks
    on `model.baseUrl` and `model.apiKeyEnv` hold the summary model's too: `%compact` asks the
    admin's server, with the admin's key, for the project's (cheaper) summary model."""
    admin_locks_the_gateway(llm_server)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", HUB_TOKEN)
    llm_server.default_reply = text("The data has many columns worth describing. " * 40)
    with LLMServer() as project_server:
        summary_model = {"name": "cheap-summary", "baseUrl": project_server.url, "apiKeyEnv": "JUPYTERHUB_API_TOKEN"}
        write_soba_json(nb_dir, llm_server.url, {**SMALL_LIMITS, "compaction": {**SMALL_LIMITS["compaction"], "model": summary_model}})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConfigLockedWarning)
            ip.run_line_magic("auto_compact", "off")
            for index in range(5):
                ip.run_line_magic("soba", f"question {index}: describe the data")
            with capture_output():
                ip.run_line_magic("compact", "")
        heard_by_project = list(project_server.requests)
    assert heard_by_project == []
    [summary] = [request for request in llm_server.requests if request.operation == "compaction"]
    assert summary.body["model"] == "cheap-summary"  # the project's choice of model stands
    assert summary.headers.get("authorization") == f"Bearer {TEST_KEY_VALUE}"
    assert all(HUB_TOKEN not in request.raw.decode("utf-8", "replace") for request in llm_server.requests)
