"""SPEC §16 "An admin can lock settings": the system layer's `"locked": [...]` (dotted camelCase
keys); a later layer that sets a locked key is ignored for that key with one line naming the
layer and the key; `locked` anywhere else is refused; `soba-nb doctor` lists the locks."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from soba_nb.cli import main
from soba_nb.config import ConfigError, ConfigLockedWarning, load_config

GATEWAY = "https://llm-gateway.example.com/v1"
ELSEWHERE = "http://203.0.113.7:8000/v1"
ADMIN = {
    "model": {"provider": "openai", "name": "team-model", "baseUrl": GATEWAY, "apiKeyEnv": "TEAM_LLM_KEY"},
    "locked": ["model.baseUrl", "model.apiKeyEnv"],
}


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def load(tmp_path: Path, system: Any = ADMIN, user: Any = None, project: Any = None, **kwargs: Any) -> Any:
    """`load_config` for a notebook in `tmp_path/project`, with the layers given (None: none)."""
    system_path = write_json(tmp_path / "etc" / "soba" / "config.json", system)
    user_path = tmp_path / "home" / ".soba" / "config.json"
    if user is not None:
        write_json(user_path, user)
    folder = tmp_path / "project"
    folder.mkdir(exist_ok=True)
    if project is not None:
        write_json(folder / "soba.json", project)
    environ = {"SOBA_SYSTEM_CONFIG": str(system_path), **kwargs.pop("environ", {})}
    return load_config(folder, kwargs.pop("overrides", None), environ=environ, user_config=user_path)


def lock_lines(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, ConfigLockedWarning)]


def test_a_projects_soba_json_cannot_move_a_locked_gateway_or_key(tmp_path: Path) -> None:
    project = {"model": {"baseUrl": ELSEWHERE, "apiKeyEnv": "JUPYTERHUB_API_TOKEN", "name": "their-model"}}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        config = load(tmp_path, project=project)
    assert config.model.base_url == GATEWAY and config.model.api_key_env == "TEAM_LLM_KEY"
    system = str(tmp_path / "etc" / "soba" / "config.json")
    # `explicit` stays truthful: the locked keys come from the admin's file, the rest as ever.
    assert config.set_by("model.baseUrl") == system and config.set_by("model.apiKeyEnv") == system
    assert config.model.name == "their-model" and config.set_by("model.name") == str(tmp_path / "project" / "soba.json")
    soba_json = str(tmp_path / "project" / "soba.json")
    expected = [
        f"{soba_json}: model.baseUrl is locked by the admin in {system}; this setting is ignored",
        f"{soba_json}: model.apiKeyEnv is locked by the admin in {system}; this setting is ignored",
    ]
    assert lock_lines(record) == expected and list(config.lock_notes) == expected
    assert config.locked == {
        "model.baseUrl": system, "model.apiKeyEnv": system,
        "compaction.model.baseUrl": f"{system} (with model.baseUrl)",
        "compaction.model.apiKeyEnv": f"{system} (with model.apiKeyEnv)",
    }  # fmt: skip
    assert ELSEWHERE not in json.dumps(config.to_json()) and "JUPYTERHUB" not in json.dumps(config.to_json())


def test_a_lock_on_the_models_gateway_holds_the_summary_models_too(tmp_path: Path) -> None:
    """A project's summary model of its own (`compaction.model`) with its own address and key
    variable would carry the hub token elsewhere past a lock on `model.baseUrl` and
    `model.apiKeyEnv`: those locks hold `compaction.model`'s same keys. Its name stays the
    project's: a cheaper summary model at the admin's gateway, with the admin's key."""
    project = {
        "compaction": {"model": {"name": "cheap-summary", "baseUrl": ELSEWHERE, "apiKeyEnv": "JUPYTERHUB_API_TOKEN"}},
    }
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        config = load(tmp_path, project=project)
    summary = config.summary_model
    assert summary is not None and summary.name == "cheap-summary"
    assert summary.base_url == GATEWAY and summary.api_key_env == "TEAM_LLM_KEY"
    system = str(tmp_path / "etc" / "soba" / "config.json")
    soba_json = str(tmp_path / "project" / "soba.json")
    assert lock_lines(record) == [
        f"{soba_json}: compaction.model.baseUrl is locked by the admin in {system} (with model.baseUrl); "
        "this setting is ignored",
        f"{soba_json}: compaction.model.apiKeyEnv is locked by the admin in {system} (with model.apiKeyEnv); "
        "this setting is ignored",
    ]


def test_a_summary_model_of_another_provider_is_held_to_the_locked_provider(tmp_path: Path) -> None:
    """Another provider would start from that provider's own address and key variable: with
    `model.provider` locked, the summary model's provider is the admin's."""
    admin = {**ADMIN, "locked": ["model.provider", "model.baseUrl", "model.apiKeyEnv"]}
    project = {"compaction": {"model": {"name": "claude-haiku-4-5", "provider": "anthropic"}}}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        config = load(tmp_path, system=admin, project=project)
    summary = config.summary_model
    assert summary is not None and summary.provider == "openai"
    assert summary.base_url == GATEWAY and summary.api_key_env == "TEAM_LLM_KEY"


def test_the_admins_own_summary_model_keeps_its_address_under_the_locks(tmp_path: Path) -> None:
    admin = {
        **ADMIN,
        "compaction": {"model": {"name": "team-summary", "baseUrl": "https://summaries.example.com/v1"}},
    }
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        config = load(tmp_path, system=admin, project={"compaction": {"model": {"name": "team-summary", "baseUrl": ELSEWHERE}}})
    summary = config.summary_model
    assert summary is not None and summary.base_url == "https://summaries.example.com/v1"
    assert len(lock_lines(record)) == 1


def test_every_later_layer_is_held_to_the_locks(tmp_path: Path) -> None:
    """The user's file, `SOBA_*` variables (long and short forms) and magic arguments too."""
    environ = {"SOBA_BASE_URL": ELSEWHERE, "SOBA_MODEL_API_KEY_ENV": "JUPYTERHUB_API_TOKEN"}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        config = load(
            tmp_path,
            user={"model": {"baseUrl": ELSEWHERE}},
            environ=environ,
            overrides={"model": {"apiKeyEnv": "JUPYTERHUB_API_TOKEN", "name": "chosen"}},
        )
    assert (config.model.base_url, config.model.api_key_env, config.model.name) == (GATEWAY, "TEAM_LLM_KEY", "chosen")
    lines = lock_lines(record)
    assert [line.split(": ")[0] for line in lines] == [
        str(tmp_path / "home" / ".soba" / "config.json"),
        "SOBA_BASE_URL",
        "SOBA_MODEL_API_KEY_ENV",
        "arguments",
    ]
    # A variable of a key inside a locked object is named too.
    system = {**ADMIN, "locked": ["compaction.model"]}
    with warnings.catch_warnings(record=True) as inner:
        warnings.simplefilter("always")
        nested = load(tmp_path, system=system, environ={"SOBA_COMPACTION_MODEL_NAME": "theirs"})
    assert nested.compaction.model is None
    assert lock_lines(inner)[0].startswith("SOBA_COMPACTION_MODEL_NAME: compaction.model is locked by the admin")
    assert [line.split(": ")[1].split(" ")[0] for line in lines] == [
        "model.baseUrl",
        "model.baseUrl",
        "model.apiKeyEnv",
        "model.apiKeyEnv",
    ]


def test_without_locks_later_layers_win_as_before(tmp_path: Path) -> None:
    unlocked = {key: value for key, value in ADMIN.items() if key != "locked"}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        config = load(tmp_path, system=unlocked, project={"model": {"baseUrl": ELSEWHERE}})
    assert config.model.base_url == ELSEWHERE and config.locked == {} and lock_lines(record) == []


def test_a_lock_covers_a_parent_set_to_a_value_and_a_deprecated_name(tmp_path: Path) -> None:
    system = {
        "model": ADMIN["model"],
        "compaction": {"timeoutMs": 4000, "model": {"name": "summarizer", "baseUrl": GATEWAY}},
        "locked": ["compaction.model.baseUrl", "compaction.timeoutMs"],
    }
    project = {"compaction": {"model": None, "backgroundTimeoutMs": 9000}}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        config = load(tmp_path, system=system, project=project)
    assert config.compaction.model is not None and config.compaction.model.base_url == GATEWAY
    assert config.compaction.timeout_ms == 4000
    lines = lock_lines(record)
    assert any("compaction.model would change compaction.model.baseUrl, locked by the admin" in line for line in lines)
    assert any("compaction.timeoutMs is locked by the admin" in line for line in lines)
    # Inside the object, keys that are not locked still apply.
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        config = load(tmp_path, system=system, project={"compaction": {"model": {"name": "theirs", "baseUrl": ELSEWHERE}}})
    assert config.compaction.model is not None
    assert (config.compaction.model.name, config.compaction.model.base_url) == ("theirs", GATEWAY)


def test_each_line_is_shown_once_however_often_the_layers_are_read(tmp_path: Path) -> None:
    project = {"model": {"baseUrl": ELSEWHERE}}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            config = load(tmp_path, project=project)
    assert len(lock_lines(record)) == 1 and len(config.lock_notes) == 1


@pytest.mark.parametrize(
    ("locked", "shown"),
    [
        ("model.baseUrl", 'locked = "model.baseUrl": must be a list'),
        (["model.base_url"], 'locked[0] = "model.base_url": not a setting'),
        (["model.baseUrl", "model"], 'locked[1] = "model": not a setting'),
        (["models.baseUrl"], 'locked[0] = "models.baseUrl": not a setting'),
        (["model.baseUrl.host"], 'locked[0] = "model.baseUrl.host": not a setting'),
        ([7], "locked[0] = 7: not a setting"),
    ],
)
def test_a_bad_lock_is_one_line_naming_the_file(tmp_path: Path, locked: Any, shown: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, system={**ADMIN, "locked": locked})
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "etc" / "soba" / "config.json") + ": ") and shown in message
    assert "\n" not in message


@pytest.mark.parametrize("where", ["user", "project", "arguments"])
def test_locked_anywhere_but_the_system_layer_is_refused(tmp_path: Path, where: str) -> None:
    layer = {"locked": ["model.name"]}
    with pytest.raises(ConfigError) as caught:
        if where == "arguments":
            load(tmp_path, overrides=layer)
        else:
            load(tmp_path, **{where: layer})
    named = {
        "user": str(tmp_path / "home" / ".soba" / "config.json"),
        "project": str(tmp_path / "project" / "soba.json"),
        "arguments": "arguments",
    }[where]
    system = str(tmp_path / "etc" / "soba" / "config.json")
    assert str(caught.value) == f"{named}: locked: only the admin's system file ({system}) may lock settings"


def test_doctor_lists_the_locked_keys_and_the_ignored_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "SOBA_BASE_URL", "SOBA_PROVIDER", "SOBA_MODEL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    # Doctor asks the server for its window; nobody answers on port 9, and doctor goes on.
    admin = {**ADMIN, "model": {**ADMIN["model"], "baseUrl": "http://127.0.0.1:9/v1"}}
    system = write_json(tmp_path / "etc" / "soba" / "config.json", admin)
    monkeypatch.setenv("SOBA_SYSTEM_CONFIG", str(system))
    project = write_json(tmp_path / "project" / "soba.json", {"model": {"baseUrl": ELSEWHERE}})
    assert main(["doctor", str(project.parent)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("locked "))
    assert lines[start] == f"locked     model.baseUrl · {system}"
    assert lines[start + 1] == f"           model.apiKeyEnv · {system}"
    assert lines[start + 2] == f"           compaction.model.baseUrl · {system} (with model.baseUrl)"
    assert lines[start + 3] == f"           compaction.model.apiKeyEnv · {system} (with model.apiKeyEnv)"
    assert lines[start + 4] == (
        f"ignored    {project}: model.baseUrl is locked by the admin in {system}; this setting is ignored"
    )
    assert f'model.baseUrl = "http://127.0.0.1:9/v1" · {system}' in captured.out
    assert "locked by the admin" not in captured.err  # shown once, in the listing


def test_doctor_says_when_nothing_is_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SOBA_SYSTEM_CONFIG", "")
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "SOBA_BASE_URL", "SOBA_PROVIDER", "SOBA_MODEL"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "project").mkdir()
    assert main(["doctor", str(tmp_path / "project")]) == 0
    assert "locked     (none)" in capsys.readouterr().out.splitlines()


def test_the_lock_example_in_docs_teams_holds_as_the_page_says(tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "teams.md").read_text(encoding="utf-8")
    section = page.split("### Locking settings", 1)[1]
    example = "\n".join(line[4:] for line in section.splitlines() if line.startswith("    "))
    admin = json.loads(example[: example.index("\n}") + 2])
    project = {
        "model": {"baseUrl": ELSEWHERE, "apiKeyEnv": "JUPYTERHUB_API_TOKEN", "provider": "anthropic"},
        "compaction": {"model": {"name": "theirs", "baseUrl": ELSEWHERE, "apiKeyEnv": "JUPYTERHUB_API_TOKEN"}},
    }
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        config = load(tmp_path, system=admin, project=project)
    assert config.model.base_url == admin["model"]["baseUrl"] and config.model.api_key_env == "TEAM_LLM_KEY"
    assert config.model.provider == "openai" and config.compaction.model is None
    assert len(config.lock_notes) == 4
