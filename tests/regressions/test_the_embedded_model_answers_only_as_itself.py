"""The embedded model answers only as itself (SPEC §3, §9).

Found by asking for a model by name with no key set (and by naming a server beside
`"provider": "local"`): `%soba --model gpt-4o hi`, a soba.json
`{"model": {"name": "gpt-4o"}}` in a kernel without OPENAI_API_KEY, or `SOBA_MODEL=llama3`
all chose the embedded provider (nothing else was configured) and recorded the name asked
for; SmolLM2-135M answered, and `%budget` said "Model: local/gpt-4o". A wrong `--model` was
also kept for every later turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from soba_nb import resolution
from soba_nb.config import ConfigError, load_config
from soba_nb.providers.local_model import local_model_available

EMBEDDED = "SmolLM2-135M-Instruct"


@pytest.fixture
def no_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """`load_config` arguments for a machine with no key, no server and the embedded model."""
    monkeypatch.setattr(resolution, "embedded_model_installed", lambda: True)
    return {"environ": {}, "user_config": tmp_path / "home" / "config.json", "system_config": tmp_path / "none.json"}


def refusal(folder: Path, no_key: dict[str, object], overrides: dict[str, object] | None = None) -> str:
    with pytest.raises(ConfigError) as refused:
        load_config(folder, overrides, **no_key)  # type: ignore[arg-type]
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_model_asked_for_by_name_is_never_answered_by_the_embedded_one(tmp_path: Path, no_key: dict[str, object]) -> None:
    soba_json = tmp_path / "soba.json"
    soba_json.write_text(json.dumps({"model": {"name": "gpt-4o"}}), encoding="utf-8")
    assert refusal(tmp_path, no_key) == (
        f'invalid configuration: model.name = "gpt-4o" (in {soba_json}): the provider is \'local\' '
        f"(chosen because no provider, API key or server is configured), the embedded {EMBEDDED}, which runs "
        "no other model; another needs model.provider (openai or anthropic, with its key) or model.baseUrl (a server)"
    )
    soba_json.write_text(json.dumps({}), encoding="utf-8")
    assert 'model.name = "gpt-99" (in arguments): ' in refusal(tmp_path, no_key, {"model": {"name": "gpt-99"}})
    soba_json.write_text(json.dumps({"model": {"provider": "local", "name": "llama3"}}), encoding="utf-8")
    assert f"the provider is 'local' (set in {soba_json})" in refusal(tmp_path, no_key)


def test_local_beside_a_servers_address_is_refused_not_answered_by_the_embedded_model(
    tmp_path: Path, no_key: dict[str, object]
) -> None:
    """"local" read as "my own llama.cpp server": SmolLM2 answered instead of the server."""
    soba_json = tmp_path / "soba.json"
    soba_json.write_text(json.dumps({"model": {"provider": "local", "baseUrl": "http://127.0.0.1:8080/v1"}}), encoding="utf-8")
    assert refusal(tmp_path, no_key) == (
        f'invalid configuration: model.baseUrl = "http://127.0.0.1:8080/v1" (in {soba_json}): the provider is '
        f"'local' (set in {soba_json}), the embedded {EMBEDDED}, which is no server at an address: "
        "a local server (llama.cpp, Ollama, vLLM) is provider 'openai'"
    )
    environ = {"SOBA_PROVIDER": "local", "SOBA_BASE_URL": "http://127.0.0.1:11434/v1"}
    assert "model.baseUrl = \"http://127.0.0.1:11434/v1\" (in environment)" in refusal(tmp_path, {**no_key, "environ": environ})


def test_the_embedded_model_by_its_own_name_or_another_provider_by_any(tmp_path: Path, no_key: dict[str, object]) -> None:
    soba_json = tmp_path / "soba.json"
    for layer, model in (
        ({}, ("local", EMBEDDED)),
        ({"model": {"provider": "local"}}, ("local", EMBEDDED)),
        ({"model": {"name": EMBEDDED}}, ("local", EMBEDDED)),
        ({"model": {"provider": "openai", "name": "gpt-4o"}}, ("openai", "gpt-4o")),
        ({"model": {"name": "qwen2.5", "baseUrl": "http://127.0.0.1:9/v1"}}, ("openai", "qwen2.5")),
    ):
        soba_json.write_text(json.dumps(layer), encoding="utf-8")
        config = load_config(tmp_path, **no_key)  # type: ignore[arg-type]
        assert (config.model.provider, config.model.name) == model
    with_key = {**no_key, "environ": {"ANTHROPIC_API_KEY": "set"}}
    soba_json.write_text(json.dumps({"model": {"name": "claude-opus-4"}}), encoding="utf-8")
    assert load_config(tmp_path, **with_key).model.provider == "anthropic"  # type: ignore[arg-type]


@pytest.mark.skipif(not local_model_available(), reason="the `local` extra is not installed")
def test_a_refused_model_is_not_kept_for_the_next_turn(ip, nb_dir, llm_server, monkeypatch) -> None:
    """`%soba --model` is kept "from now on": not when the configuration refuses it."""
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    (nb_dir / "soba.json").write_text("{}", encoding="utf-8")  # nothing configured: the embedded model
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("soba", "--model gpt-99 why does the cell above fail?")
    assert 'model.name = "gpt-99" (in arguments)' in str(refused.value) and "runs no other model" in str(refused.value)
    with capture_output() as out:
        ip.run_line_magic("budget", "")
    assert f"Model: local/{EMBEDDED}" in out.stdout
    assert llm_server.requests == []
