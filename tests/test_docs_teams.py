"""docs/teams.md: what it tells an admin to deploy is what soba-nb reads.

The admin's `/etc/soba/config.json` in the page is loaded as the system layer, the way a
kernel on the hub would load it; the hub's Python configuration at least compiles."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from soba_nb.cli import main
from soba_nb.config import load_config

PAGE = Path(__file__).resolve().parent.parent / "docs" / "teams.md"
USER_GATEWAY_KEY = "sk-litellm-" + "Virtual7Key4Ana0123456789abcdef"


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", PAGE.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)


@pytest.fixture
def system_file(tmp_path: Path) -> Path:
    [admin] = blocks("json")
    path = tmp_path / "etc" / "soba" / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(admin, encoding="utf-8")
    return path


def test_the_admin_config_in_the_page_is_a_valid_system_layer(tmp_path: Path, system_file: Path) -> None:
    admin = json.loads(system_file.read_text(encoding="utf-8"))
    variable = admin["model"]["apiKeyEnv"]
    environ = {variable: USER_GATEWAY_KEY, "SOBA_SYSTEM_CONFIG": str(system_file)}
    notebooks = tmp_path / "home" / "ana" / "work"
    notebooks.mkdir(parents=True)
    config = load_config(notebooks, environ=environ, user_config=tmp_path / "home" / "ana" / ".soba" / "config.json")
    assert config.model.provider == "openai" and config.model.base_url == admin["model"]["baseUrl"]
    assert config.model.name == admin["model"]["name"] and config.model.api_key_env == variable
    assert config.model.pricing is not None and config.agent.max_session_cost_usd == admin["agent"]["maxSessionCostUsd"]
    assert config.set_by("model.baseUrl") == str(system_file)
    # The page's promise: no key in the file, only the name of the variable that holds it.
    assert not any(re.search(r"sk-|apiKey\"", block) for block in blocks("json"))


def test_a_users_own_layers_still_come_after_the_admins(tmp_path: Path, system_file: Path) -> None:
    user = tmp_path / "home" / ".soba" / "config.json"
    user.parent.mkdir(parents=True)
    user.write_text(json.dumps({"model": {"name": "my-own-model"}}), encoding="utf-8")
    config = load_config(tmp_path, environ={"SOBA_SYSTEM_CONFIG": str(system_file)}, user_config=user)
    assert config.model.name == "my-own-model" and config.set_by("model.name") == str(user)
    assert config.model.base_url == "https://llm-gateway.internal.example.com/v1"


def test_doctor_names_the_admins_file_for_the_gateway_settings(
    tmp_path: Path, system_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "SOBA_BASE_URL", "SOBA_PROVIDER", "SOBA_MODEL", "SOBA_CAPSULE_KEY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SOBA_SYSTEM_CONFIG", str(system_file))
    monkeypatch.setenv("TEAM_LLM_KEY", USER_GATEWAY_KEY)
    # The gateway is not there: doctor asks it for the window and goes on without an answer.
    monkeypatch.setenv("SOBA_MODEL_BASE_URL", "http://127.0.0.1:9/v1")
    assert main(["doctor", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f'model.name = "team-gpt-4o" · {system_file}' in out
    assert "model.baseUrl = \"http://127.0.0.1:9/v1\" · environment" in out
    assert "api key    TEAM_LLM_KEY set" in out and USER_GATEWAY_KEY not in out


def test_the_hub_configuration_in_the_page_compiles() -> None:
    [hub] = blocks("python")
    compile(hub, "jupyterhub_config.py", "exec")
    assert "SOBA_CAPSULE_KEY" in hub and "pre_spawn_hook" in hub
