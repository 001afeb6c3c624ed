"""SPEC §13: the admin's layer, `/etc/soba/config.json` (or `SOBA_SYSTEM_CONFIG`), sits
below the user's: defaults → system → ~/.soba/config.json → soba.json → environment →
magic arguments; `soba-nb doctor` names the file each setting came from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from soba_nb.cli import main
from soba_nb.config import ConfigError, load_config, system_config_path

GATEWAY = "https://llm-gateway.example.com/v1"
TEAM_KEY = "team-capsule-key-" + "5d41402abc4b2a76b9719d911017c592"


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture
def layers(tmp_path: Path) -> dict[str, Path]:
    """One file per layer, each setting one key of its own and one a later layer overrides."""
    system = write_json(
        tmp_path / "etc" / "soba" / "config.json",
        {
            "model": {"provider": "openai", "name": "team-model", "baseUrl": GATEWAY, "apiKeyEnv": "TEAM_LLM_KEY"},
            "compaction": {"timeoutMs": 1000, "keepRecentTokens": 1500, "minSavingsRatio": 0.3},
        },
    )
    user = write_json(tmp_path / "home" / ".soba" / "config.json", {"compaction": {"timeoutMs": 2000, "minSavingsRatio": 0.4}})
    project = write_json(tmp_path / "project" / "soba.json", {"compaction": {"timeoutMs": 3000}})
    return {"system": system, "user": user, "project": project, "folder": project.parent}


def test_the_system_layer_sits_below_every_layer_of_the_user(layers: dict[str, Path]) -> None:
    environ = {"SOBA_SYSTEM_CONFIG": str(layers["system"]), "SOBA_COMPACTION_KEEP_RECENT_TOKENS": "1200"}
    config = load_config(layers["folder"], environ=environ, user_config=layers["user"])
    assert config.model.base_url == GATEWAY and config.model.api_key_env == "TEAM_LLM_KEY"
    assert config.set_by("model.baseUrl") == str(layers["system"])
    assert config.compaction.min_savings_ratio == 0.4 and config.set_by("compaction.minSavingsRatio") == str(layers["user"])
    assert config.compaction.timeout_ms == 3000 and config.set_by("compaction.timeoutMs") == str(layers["project"])
    assert config.compaction.keep_recent_tokens == 1200 and config.set_by("compaction.keepRecentTokens") == "environment"
    overridden = load_config(layers["folder"], {"model": {"name": "mine"}}, environ=environ, user_config=layers["user"])
    assert overridden.model.name == "mine" and overridden.set_by("model.name") == "arguments"
    assert config.model.name == "team-model" and "from " + str(layers["system"]) in config.provider_source


def test_the_system_file_is_etc_soba_config_json_unless_the_environment_names_another(tmp_path: Path) -> None:
    assert system_config_path({}) == Path("/etc/soba/config.json")
    assert system_config_path({"SOBA_SYSTEM_CONFIG": str(tmp_path / "team.json")}) == tmp_path / "team.json"
    assert system_config_path({"SOBA_SYSTEM_CONFIG": ""}) is None
    # The keyword argument wins over both, as `user_config` does for the user's file.
    named = write_json(tmp_path / "team.json", {"model": {"provider": "openai", "name": "from-environment"}})
    given = write_json(tmp_path / "given.json", {"model": {"provider": "openai", "name": "from-argument"}})
    user = tmp_path / "no-home" / "config.json"
    environ = {"SOBA_SYSTEM_CONFIG": str(named)}
    assert load_config(tmp_path, environ=environ, user_config=user).model.name == "from-environment"
    assert load_config(tmp_path, environ=environ, user_config=user, system_config=given).model.name == "from-argument"


def test_a_missing_system_file_is_no_layer(tmp_path: Path) -> None:
    environ = {"SOBA_SYSTEM_CONFIG": str(tmp_path / "nowhere" / "config.json")}
    config = load_config(tmp_path, environ=environ, user_config=tmp_path / "home" / "config.json")
    assert config.explicit_keys == {}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not valid JSON (line 1"),
        (json.dumps({"model": {"apiKey": None}}), "model.apiKey: unknown key"),
        (json.dumps({"compaction": {"minSavingsRatio": 1.5}}), "compaction.minSavingsRatio = 1.5"),
    ],
)
def test_a_bad_system_file_is_one_line_naming_it(tmp_path: Path, content: str, expected: str) -> None:
    system = tmp_path / "etc" / "config.json"
    system.parent.mkdir()
    system.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, environ={"SOBA_SYSTEM_CONFIG": str(system)}, user_config=tmp_path / "none.json")
    message = str(caught.value)
    assert "\n" not in message and expected in message and str(system) in message


def test_a_folder_where_the_system_file_should_be_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="it is a folder"):
        load_config(tmp_path, environ={"SOBA_SYSTEM_CONFIG": str(tmp_path)}, user_config=tmp_path / "none.json")


@pytest.fixture
def doctor_environment(tmp_path: Path, layers: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "SOBA_BASE_URL", "SOBA_PROVIDER", "SOBA_MODEL", "SOBA_CAPSULE_KEY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SOBA_SYSTEM_CONFIG", str(layers["system"]))
    monkeypatch.setenv("SOBA_COMPACTION_KEEP_RECENT_TOKENS", "1200")
    # Doctor asks the server for its window; nobody answers on port 9, and doctor goes on.
    write_json(layers["system"], {**json.loads(layers["system"].read_text()), "model": {
        "provider": "openai", "name": "team-model", "baseUrl": "http://127.0.0.1:9/v1", "apiKeyEnv": "TEAM_LLM_KEY"}})
    return layers["folder"]


def _doctor(folder: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["doctor", str(folder)]) == 0
    return capsys.readouterr().out.splitlines()


def test_doctor_names_the_file_of_each_setting(
    doctor_environment: Path, layers: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _doctor(doctor_environment, capsys)
    system, project = str(layers["system"]), str(layers["project"])
    set_lines = [line.removeprefix("set").strip() for line in lines if line.startswith(("set ", "    "))]
    assert f'model.baseUrl = "http://127.0.0.1:9/v1" · {system}' in set_lines
    assert f'model.apiKeyEnv = "TEAM_LLM_KEY" · {system}' in set_lines
    assert "compaction.minSavingsRatio = 0.4 · ~/.soba/config.json" in set_lines  # HOME is the test's
    assert f"compaction.timeoutMs = 3000 · {project}" in set_lines
    assert "compaction.keepRecentTokens = 1200 · environment" in set_lines
    assert set_lines[-1] == "every other setting: its default"
    [files] = [line for line in lines if line.startswith("config ")]
    assert f"defaults → system {system} → user " in files and f"→ project {project} → environment → arguments" in files


def test_doctor_says_whether_capsules_are_signed_and_never_shows_the_key(
    doctor_environment: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    [unsigned] = [line for line in _doctor(doctor_environment, capsys) if line.startswith("capsules")]
    assert "unsigned (no SOBA_CAPSULE_KEY" in unsigned
    monkeypatch.setenv("SOBA_CAPSULE_KEY", TEAM_KEY)
    out = _doctor(doctor_environment, capsys)
    [signed] = [line for line in out if line.startswith("capsules")]
    assert signed.startswith("capsules   signed with the team key") and TEAM_KEY not in "\n".join(out)
