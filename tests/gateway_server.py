"""A real model gateway for tests: the LiteLLM proxy (`litellm[proxy]` from PyPI, a test-only
dependency installed by `.ci/run`) on 127.0.0.1, in front of another server, as a team runs it.

    with litellm_proxy({"team-smol": (llama_url, "smol")}, tmp_path, key_env=KEY_ENV) as url:
        ...  # soba.json: {"model": {"baseUrl": url, "name": "team-smol", "apiKeyEnv": KEY_ENV}}

Each alias maps to `openai/<model>` at its upstream base URL. The gateway's key (`master_key`)
is read by the proxy from the environment variable `key_env`, never written in its config.
Nothing is fetched at run time: the model-cost map and the other remote lists are the copies
bundled with litellm, telemetry, the admin UI and the API docs are off (`OFFLINE_ENV`).

A gateway disagrees with its server by its nature: it counts the usage of a stream itself when
the server sends none (with its own tokenizer), wraps the server's errors in its own words, and
answers an oversized streamed request with HTTP 200 and one empty `finish_reason: stop` chunk.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from child_processes import stop_process_group, tied_to_this_process, wait_until_answering
from jupyter_support import free_port

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 10.0
OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True",
    "LITELLM_TELEMETRY_DISABLED": "True",
    "DISABLE_ADMIN_UI": "True",
    "NO_DOCS": "True",
}
"""What keeps the proxy off the network: litellm's bundled copies of what it would download,
no telemetry, no UI."""


def require_litellm() -> None:
    """Skip when the LiteLLM proxy is not installed."""
    for module in ("litellm", "backoff", "apscheduler", "fastapi", "uvicorn", "yaml"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"litellm[proxy] is not installed (no {module}); .ci/run installs it")


def proxy_config(routes: Mapping[str, tuple[str, str]], key_env: str, windows: Mapping[str, int]) -> dict[str, Any]:
    """The proxy's config: each alias → `openai/<model>` at its upstream URL; `windows` gives
    some aliases a `max_input_tokens` as an admin would (`model_info`); the master key is the
    environment variable's name, not its value."""
    model_list = []
    for alias, (upstream, model) in routes.items():
        entry: dict[str, Any] = {
            "model_name": alias,
            "litellm_params": {"model": f"openai/{model}", "api_base": upstream, "api_key": "none"},
        }
        if alias in windows:
            entry["model_info"] = {"max_input_tokens": windows[alias]}
        model_list.append(entry)
    return {"model_list": model_list, "general_settings": {"master_key": f"os.environ/{key_env}"}}


@contextlib.contextmanager
def litellm_proxy(
    routes: Mapping[str, tuple[str, str]],
    folder: Path,
    *,
    key_env: str,
    windows: Mapping[str, int] | None = None,
) -> Iterator[str]:
    """The base URL (`http://127.0.0.1:PORT/v1`) of a LiteLLM proxy serving `routes`
    (alias → (upstream base URL, upstream model)); its config and log are kept in `folder`.
    The key is the value of `key_env` in this process's environment. Stopped (its whole
    process group) when the block ends."""
    require_litellm()
    key = os.environ[key_env]
    config = folder / "litellm_config.yaml"  # written as JSON, which is YAML
    config.write_text(json.dumps(proxy_config(routes, key_env, windows or {}), indent=2), encoding="utf-8")
    log = folder / "litellm.log"
    port = free_port()
    command = [
        sys.executable, "-m", "litellm.proxy.proxy_cli",
        "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1",
    ]
    env = {**os.environ, **OFFLINE_ENV}
    with log.open("wb") as output:
        process = subprocess.Popen(
            tied_to_this_process(command), stdout=output, stderr=subprocess.STDOUT, env=env, cwd=folder, start_new_session=True
        )
    root = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(
            process, f"{root}/v1/models", "LiteLLM proxy", log, START_TIMEOUT_S,
            headers={"Authorization": f"Bearer {key}"}, interval_s=0.5,
        )
        yield f"{root}/v1"
    finally:
        stop_process_group(process, STOP_TIMEOUT_S)


def litellm_version() -> str:
    """The installed litellm's version (the figures name it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("litellm")
    except PackageNotFoundError:
        return "?"
