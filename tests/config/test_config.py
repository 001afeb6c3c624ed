"""SPEC §3: configuration keys, layering, the deprecated alias and one-line errors."""

from __future__ import annotations

import codecs
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from soba_nb.config import (
    ConfigDeprecationWarning,
    ConfigError,
    SobaConfig,
    build_config,
    env_layer,
    load_config,
    recorded_config,
)

SPEC_DEFAULTS = {
    "model": {
        "provider": "openai",
        "name": "gpt-4o-mini",
        "api": "chat",
        "baseUrl": None,
        "apiKeyEnv": "OPENAI_API_KEY",
        "contextWindow": 128000,
        "maxOutputTokens": 8000,
        "vision": None,
        "pricing": None,
    },
    "compaction": {
        "auto": True,
        "compactOnTurnComplete": True,
        "compactOnMilestone": True,
        "minTokensForAutoCompact": 32000,
        "minReclaimableTokens": 12000,
        "minSavingsRatio": 0.25,
        "keepRecentTokens": 20000,
        "safetyReserveTokens": 8192,
        "autoCompactThresholdRatio": 0.8,
        "timeoutMs": 15000,
        "userRequestTokens": 4000,
        "model": None,
    },
    "notebook": {"contextTokens": 2000, "maxImagesPerRequest": 4},
    "agent": {"approval": "never", "maxSessionCostUsd": None},
}


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture
def isolated(tmp_path: Path) -> dict[str, Any]:
    """load_config keyword arguments that ignore the real home folder and environment."""
    return {"environ": {}, "user_config": tmp_path / "home" / ".soba" / "config.json"}


def refused(layer: dict[str, Any]) -> str:
    """The one-line message a bad layer is refused with."""
    with pytest.raises(ConfigError) as info:
        build_config([("test", layer)])
    message = str(info.value)
    assert "\n" not in message
    assert "validation error" not in message
    assert "For further information" not in message
    assert "pydantic" not in message.lower()
    return message


# -- defaults and key names ------------------------------------------------------------


def test_model_api_chooses_chat_or_responses() -> None:
    assert SobaConfig().model.api == "chat"
    assert build_config([("soba.json", {"model": {"api": "responses"}})]).model.api == "responses"
    assert "model.api = \"completions\": input should be 'chat' or 'responses'" in refused(
        {"model": {"api": "completions"}}
    )
    assert env_layer({"SOBA_MODEL_API": "responses"}) == {"model": {"api": "responses"}}


def test_defaults_equal_the_spec_table() -> None:
    assert SobaConfig().to_json() == SPEC_DEFAULTS


def test_default_limits() -> None:
    config = SobaConfig()
    assert config.hard_limit == 128000 - 8000 - 8192
    assert config.soft_limit == int(config.hard_limit * 0.8)


def test_keys_are_camel_case_and_round_trip(tmp_path: Path, isolated: dict[str, Any]) -> None:
    project = tmp_path / "project"
    write_json(project / "soba.json", SPEC_DEFAULTS)
    assert load_config(project, **isolated).to_json() == SPEC_DEFAULTS


# -- layering: defaults → user → project → environment → overrides ---------------------


def test_each_layer_overrides_the_one_before(tmp_path: Path) -> None:
    user = write_json(
        tmp_path / "home" / ".soba" / "config.json",
        {"model": {"provider": "openai", "name": "from-user", "contextWindow": 100000}, "compaction": {"timeoutMs": 1}},
    )
    write_json(
        tmp_path / "project" / "soba.json",
        {
            "model": {"contextWindow": 90000},
            "compaction": {"timeoutMs": 2, "keepRecentTokens": 1000},
        },
    )
    notebook_dir = tmp_path / "project" / "analysis" / "deep"
    notebook_dir.mkdir(parents=True)
    environ = {"SOBA_COMPACTION_TIMEOUT_MS": "3", "SOBA_COMPACTION_KEEP_RECENT_TOKENS": "2000"}
    config = load_config(
        notebook_dir, {"compaction": {"timeoutMs": 4}}, environ=environ, user_config=user
    )
    assert config.model.name == "from-user"  # user layer, untouched later
    assert config.model.context_window == 90000  # project beats user
    assert config.compaction.keep_recent_tokens == 2000  # environment beats project
    assert config.compaction.timeout_ms == 4  # overrides beat everything
    assert config.compaction.min_savings_ratio == 0.25  # default where nobody spoke


def test_nearest_soba_json_wins(tmp_path: Path, isolated: dict[str, Any]) -> None:
    write_json(tmp_path / "outer" / "soba.json", {"model": {"provider": "openai", "name": "outer"}})
    write_json(tmp_path / "outer" / "inner" / "soba.json", {"model": {"provider": "openai", "name": "inner"}})
    notebook_dir = tmp_path / "outer" / "inner" / "nb"
    notebook_dir.mkdir()
    assert load_config(notebook_dir, **isolated).model.name == "inner"
    assert load_config(tmp_path / "outer", **isolated).model.name == "outer"


def test_missing_user_config_is_fine(tmp_path: Path, isolated: dict[str, Any]) -> None:
    isolated["environ"] = {"OPENAI_API_KEY": "sk-test"}
    assert load_config(tmp_path, **isolated).to_json() == SPEC_DEFAULTS


def test_provider_resolution_order(tmp_path: Path, isolated: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from soba_nb import resolution

    def resolved(environ: dict[str, str]) -> str:
        isolated["environ"] = environ
        return load_config(tmp_path, **isolated).model.provider

    assert resolved({"OPENAI_API_KEY": "a", "ANTHROPIC_API_KEY": "b"}) == "openai"
    assert resolved({"ANTHROPIC_API_KEY": "b"}) == "anthropic"
    server = load_config(tmp_path, environ={"SOBA_BASE_URL": "http://127.0.0.1:9/v1"}, user_config=isolated["user_config"])
    assert server.model.provider == "openai" and "127.0.0.1:9" in server.provider_source
    explicit = {"SOBA_PROVIDER": "anthropic", "OPENAI_API_KEY": "a"}
    assert resolved(explicit) == "anthropic"
    monkeypatch.setattr(resolution, "embedded_model_installed", lambda: True)
    assert resolved({}) == "local"
    monkeypatch.setattr(resolution, "embedded_model_installed", lambda: False)
    isolated["environ"] = {}
    config = load_config(tmp_path, **isolated)
    assert "no model is configured" in config.provider_source


def test_environment_values_are_parsed() -> None:
    layer = env_layer(
        {
            "SOBA_MODEL": "llama3",
            "SOBA_BASE_URL": "http://localhost:11434/v1",
            "SOBA_COMPACTION_AUTO": "false",
            "SOBA_MODEL_CONTEXT_WINDOW": "65000",
            "UNRELATED": "1",
        }
    )
    assert layer == {
        "model": {"name": "llama3", "baseUrl": "http://localhost:11434/v1", "contextWindow": 65000},
        "compaction": {"auto": False},
    }


def test_environment_layer_through_load_config(tmp_path: Path, isolated: dict[str, Any]) -> None:
    isolated["environ"] = {"SOBA_PROVIDER": "anthropic", "SOBA_COMPACTION_AUTO": "false"}
    config = load_config(tmp_path, **isolated)
    assert config.model.provider == "anthropic"
    assert config.model.api_key_env == "ANTHROPIC_API_KEY"
    assert config.compaction.auto is False


# -- the deprecated alias ----------------------------------------------------------------


def test_background_timeout_alias_warns_naming_the_new_key() -> None:
    with pytest.warns(ConfigDeprecationWarning, match="timeoutMs") as record:
        config = build_config([("soba.json", {"compaction": {"backgroundTimeoutMs": 7000}})])
    assert config.compaction.timeout_ms == 7000
    assert "backgroundTimeoutMs" in str(record[0].message)


def test_timeout_ms_wins_over_the_alias() -> None:
    with pytest.warns(ConfigDeprecationWarning):
        config = build_config(
            [("soba.json", {"compaction": {"backgroundTimeoutMs": 7000, "timeoutMs": 9000}})]
        )
    assert config.compaction.timeout_ms == 9000


def test_alias_from_a_file_and_from_the_environment(
    tmp_path: Path, isolated: dict[str, Any]
) -> None:
    write_json(tmp_path / "soba.json", {"compaction": {"backgroundTimeoutMs": 5000}})
    with pytest.warns(ConfigDeprecationWarning, match="timeoutMs"):
        assert load_config(tmp_path, **isolated).compaction.timeout_ms == 5000
    isolated["environ"] = {"SOBA_COMPACTION_BACKGROUND_TIMEOUT_MS": "6000"}
    with pytest.warns(ConfigDeprecationWarning, match="timeoutMs"):
        assert load_config(tmp_path, **isolated).compaction.timeout_ms == 6000


def test_no_warning_without_the_alias() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_config([("soba.json", {"compaction": {"timeoutMs": 9000}})])


# -- bad values: one line naming key, value and rule ------------------------------------


@pytest.mark.parametrize(
    ("layer", "key", "value", "rule"),
    [
        ({"compaction": {"keepRecentTokens": -5}}, "compaction.keepRecentTokens", "-5", ">= 0"),
        (
            {"compaction": {"minReclaimableTokens": -1}},
            "compaction.minReclaimableTokens",
            "-1",
            ">= 0",
        ),
        (
            {"compaction": {"safetyReserveTokens": -1}},
            "compaction.safetyReserveTokens",
            "-1",
            ">= 0",
        ),
        ({"model": {"maxOutputTokens": -1}}, "model.maxOutputTokens", "-1", "> 0"),
        ({"model": {"contextWindow": 0}}, "model.contextWindow", "0", "> 0"),
        ({"compaction": {"autoCompactThresholdRatio": 0}}, "autoCompactThresholdRatio", "0", "> 0"),
        (
            {"compaction": {"autoCompactThresholdRatio": 1.5}},
            "autoCompactThresholdRatio",
            "1.5",
            "<= 1",
        ),
        ({"compaction": {"minSavingsRatio": 0}}, "compaction.minSavingsRatio", "0", "> 0"),
        ({"compaction": {"minSavingsRatio": 1.01}}, "compaction.minSavingsRatio", "1.01", "<= 1"),
    ],
)
def test_out_of_range_values(layer: dict[str, Any], key: str, value: str, rule: str) -> None:
    message = refused(layer)
    assert key in message
    assert f"= {value}:" in message
    words = {
        ">= 0": "greater than or equal to 0",
        "> 0": "greater than 0",
        "<= 1": "less than or equal to 1",
    }
    assert words[rule] in message


def test_hard_limit_must_be_positive() -> None:
    message = refused({"model": {"contextWindow": 16000, "maxOutputTokens": 8000}, "compaction": {"safetyReserveTokens": 8192}})
    assert "hardLimit" in message
    assert "-192" in message  # 16000 - 8000 - 8192
    assert "> 0" in message


def test_hard_limit_of_exactly_zero_is_refused() -> None:
    message = refused({"model": {"contextWindow": 16192, "maxOutputTokens": 8000}, "compaction": {"safetyReserveTokens": 8192}})
    assert "hardLimit" in message
    assert "= 0;" in message


def test_defaults_that_cannot_hold_in_the_users_window_give_way() -> None:
    """`contextWindow: 8192` alone met the default safety reserve (8,192) and kept tail (20,000)
    and was refused; the user set none of those, so they give way to their share (SPEC §12)."""
    config = build_config([("soba.json", {"model": {"contextWindow": 8192}})])
    assert config.hard_limit > 0 and config.compaction.keep_recent_tokens < config.hard_limit
    assert config.compaction.safety_reserve_tokens == 8192 // 16 and config.model.max_output_tokens == 8192 // 4
    assert config.explicit_keys == {"model.contextWindow": "soba.json"}
    # A figure the user gave is kept while it fits, and refused in their terms when it cannot.
    kept = build_config([("soba.json", {"model": {"contextWindow": 8192}, "compaction": {"safetyReserveTokens": 1000}})])
    assert kept.compaction.safety_reserve_tokens == 1000
    message = refused({"model": {"contextWindow": 8192}, "compaction": {"safetyReserveTokens": 8192}})
    assert "hardLimit" in message and "= -8000;" in message  # 8192 - 8000 - 8192: the figures as set
    message = refused({"model": {"contextWindow": 8192}, "compaction": {"keepRecentTokens": 9000}})
    assert "compaction.keepRecentTokens = 9000" in message
    # The spec's worked example is untouched (nothing needs to give way there).
    example = build_config([("soba.json", {"model": {"contextWindow": 65000, "maxOutputTokens": 8000}})])
    assert (example.hard_limit, example.soft_limit) == (48808, 39046)


def test_keep_recent_tokens_must_be_below_hard_limit() -> None:
    hard = 65000 - 8000 - 8192
    message = refused({"model": {"contextWindow": 65000}, "compaction": {"keepRecentTokens": hard}})
    assert "compaction.keepRecentTokens" in message
    assert str(hard) in message
    assert "< hardLimit" in message
    # One token below is fine.
    build_config(
        [("t", {"model": {"contextWindow": 65000}, "compaction": {"keepRecentTokens": hard - 1}})]
    )


@pytest.mark.parametrize(
    ("layer", "key"),
    [
        ({"compaction": {"keepRecentTokenz": 1}}, "compaction.keepRecentTokenz"),
        ({"model": {"apiKey": "sk-xyz"}}, "model.apiKey"),
        ({"telemetry": True}, "telemetry"),
    ],
)
def test_unknown_keys(layer: dict[str, Any], key: str) -> None:
    message = refused(layer)
    assert key in message
    assert "unknown key" in message


@pytest.mark.parametrize(
    ("layer", "key", "shown"),
    [
        ({"model": {"contextWindow": "big"}}, "model.contextWindow", '"big"'),
        ({"model": {"contextWindow": "65000"}}, "model.contextWindow", '"65000"'),
        ({"model": {"contextWindow": 65000.5}}, "model.contextWindow", "65000.5"),
        ({"compaction": {"timeoutMs": True}}, "compaction.timeoutMs", "true"),
        (
            {"compaction": {"autoCompactThresholdRatio": "0.5"}},
            "autoCompactThresholdRatio",
            '"0.5"',
        ),
        ({"compaction": {"auto": "maybe"}}, "compaction.auto", '"maybe"'),
        ({"model": {"provider": "mystery"}}, "model.provider", '"mystery"'),
        ({"model": {"api": "completions"}}, "model.api", '"completions"'),
        ({"model": {"name": None}}, "model.name", "null"),
        ({"model": "gpt-4o"}, "model", '"gpt-4o"'),
    ],
)
def test_wrong_types(layer: dict[str, Any], key: str, shown: str) -> None:
    message = refused(layer)
    assert f"{key} = {shown}:" in message


def test_invalid_json_file_names_the_file_and_line(
    tmp_path: Path, isolated: dict[str, Any]
) -> None:
    bad = tmp_path / "soba.json"
    bad.write_text('{\n  "model": {\n    "name": "x",\n  }\n}\n', encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path, **isolated)
    message = str(info.value)
    assert str(bad) in message
    assert "line 4" in message
    assert "\n" not in message


def test_invalid_user_config_is_refused_too(tmp_path: Path, isolated: dict[str, Any]) -> None:
    user = isolated["user_config"]
    user.parent.mkdir(parents=True)
    user.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ConfigError, match="JSON object"):
        load_config(tmp_path, **isolated)


def test_bad_value_in_a_file_names_the_key(tmp_path: Path, isolated: dict[str, Any]) -> None:
    write_json(tmp_path / "soba.json", {"compaction": {"keepRecentTokens": -1}})
    with pytest.raises(ConfigError, match=r"compaction\.keepRecentTokens = -1"):
        load_config(tmp_path, **isolated)


def test_bad_environment_value_is_refused(tmp_path: Path, isolated: dict[str, Any]) -> None:
    isolated["environ"] = {"SOBA_COMPACTION_TIMEOUT_MS": "soon"}
    with pytest.raises(ConfigError, match=r'compaction\.timeoutMs = "soon"'):
        load_config(tmp_path, **isolated)


def test_config_error_has_no_chained_pydantic_error() -> None:
    with pytest.raises(ConfigError) as info:
        build_config([("t", {"compaction": {"keepRecentTokens": -1}})])
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


# -- provider profiles -------------------------------------------------------------------


def test_local_provider_profile_gives_a_valid_config() -> None:
    config = build_config([("arguments", {"model": {"provider": "local"}})])
    assert config.model.provider == "local"
    assert 0 < config.compaction.keep_recent_tokens < config.hard_limit
    assert 0 < config.soft_limit < config.hard_limit
    assert config.model.context_window < SPEC_DEFAULTS["model"]["contextWindow"]  # type: ignore[index]


def test_user_keys_beat_the_provider_profile() -> None:
    config = build_config([("arguments", {"model": {"provider": "local", "contextWindow": 16384}})])
    assert config.model.context_window == 16384


def test_api_keys_are_not_in_the_config() -> None:
    dumped = json.dumps(SobaConfig().to_json())
    assert "apiKeyEnv" in dumped
    assert "sk-" not in dumped


# -- a hostile environment (SPEC §12): one line naming the file or key -------------------


def one_line_refusal(call: Any) -> str:
    """The refusal of `call()` (within a few seconds: a FIFO must never block the read)."""
    import threading

    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)
        else:
            outcome.append(None)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert outcome, "the configuration read is still blocked after 5 s"
    error = outcome[0]
    assert isinstance(error, ConfigError), f"not refused: {error!r}"
    message = str(error)
    assert "\n" not in message and "Traceback" not in message and "pydantic" not in message.lower()
    return message


@pytest.mark.parametrize(
    "url",
    ["ftp://example.com/v1", "file:///etc/passwd", "localhost:11434/v1", "http://", "http://host:99999/v1", "http://a b/v1", "//host/v1"],
)
def test_only_http_and_https_base_urls(url: str) -> None:
    message = refused({"model": {"baseUrl": url}})
    assert f"model.baseUrl = {json.dumps(url)}:" in message


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/v1", "https://api.example.com/v1", "HTTP://Host:11434/v1"])
def test_http_base_urls_are_accepted(url: str) -> None:
    assert build_config([("t", {"model": {"baseUrl": url}})]).model.base_url == url


def test_a_window_over_one_hundred_million_tokens_is_refused() -> None:
    from soba_nb.config import MAX_CONTEXT_WINDOW

    message = refused({"model": {"contextWindow": 10**100}})
    assert message.startswith("invalid configuration: model.contextWindow = 1000")
    assert f"less than or equal to {MAX_CONTEXT_WINDOW}" in message
    assert "(in test)" in message  # the layer that set it
    assert build_config([("t", {"model": {"contextWindow": MAX_CONTEXT_WINDOW}})]).hard_limit > 0
    refused({"model": {"contextWindow": MAX_CONTEXT_WINDOW + 1}})


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("model", "maxOutputTokens"),
        ("compaction", "minTokensForAutoCompact"),
        ("compaction", "minReclaimableTokens"),
        ("compaction", "keepRecentTokens"),
        ("compaction", "safetyReserveTokens"),
        ("compaction", "timeoutMs"),
    ],
)
def test_every_figure_has_an_upper_bound(section: str, key: str) -> None:
    from soba_nb.config import MAX_CONTEXT_WINDOW, MAX_TIMEOUT_MS

    bound = MAX_TIMEOUT_MS if key == "timeoutMs" else MAX_CONTEXT_WINDOW
    message = refused({section: {key: bound + 1}})
    assert f"{section}.{key} = {bound + 1}: input should be less than or equal to {bound}" in message


@pytest.mark.parametrize("key", ["auto", "compactOnTurnComplete", "compactOnMilestone"])
@pytest.mark.parametrize("value", ["yes", "true", 1, 0, None])
def test_booleans_are_json_booleans(key: str, value: Any) -> None:
    message = refused({"compaction": {key: value}})
    assert f"compaction.{key} = {json.dumps(value)}:" in message


def test_an_environment_boolean_must_be_true_or_false(tmp_path: Path, isolated: dict[str, Any]) -> None:
    isolated["environ"] = {"SOBA_COMPACTION_AUTO": "yes"}
    message = one_line_refusal(lambda: load_config(tmp_path, **isolated))
    assert "SOBA_COMPACTION_AUTO" in message and 'compaction.auto = "yes"' in message
    for word, expected in (("true", True), ("false", False)):
        isolated["environ"] = {"SOBA_COMPACTION_AUTO": word}
        assert load_config(tmp_path, **isolated).compaction.auto is expected
    isolated["environ"] = {"SOBA_AUTO_COMPACT": "on"}
    assert "SOBA_AUTO_COMPACT" in one_line_refusal(lambda: load_config(tmp_path, **isolated))


@pytest.mark.parametrize(
    ("var", "raw", "shown"),
    [
        ("SOBA_BASE_URL", "ftp://example.com/v1", 'model.baseUrl = "ftp://example.com/v1"'),
        ("SOBA_MODEL_CONTEXT_WINDOW", "1" + "0" * 100, "model.contextWindow = 1000"),
        ("SOBA_COMPACTION_TIMEOUT_MS", "1e100", "compaction.timeoutMs = 1e+100"),
        ("SOBA_COMPACTION_KEEP_RECENT_TOKENS", "-1", "compaction.keepRecentTokens = -1"),
    ],
)
def test_a_bad_environment_value_names_the_variable(var: str, raw: str, shown: str) -> None:
    message = one_line_refusal(lambda: env_layer({var: raw}))
    assert message.startswith(f"invalid configuration: {var}: {shown}")


def special_file(folder: Path, kind: str) -> Path:
    """A `soba.json` in `folder` that is no configuration file."""
    import os

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "soba.json"
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "/dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "broken link":
        path.symlink_to(folder / "nowhere.json")
    elif kind == "nested 100,000 deep":
        path.write_text('{"model": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    elif kind == "nested 17 deep":
        path.write_text('{"model": ' + "[" * 16 + "]" * 16 + "}", encoding="utf-8")
    elif kind == "over 1 MiB":
        from soba_nb.config import MAX_CONFIG_BYTES

        with path.open("wb") as handle:
            handle.truncate(MAX_CONFIG_BYTES + 1)
    elif kind == "NaN":
        path.write_text('{"compaction": {"minSavingsRatio": NaN}}', encoding="utf-8")
    elif kind == "5,000 digits":
        path.write_text('{"model": {"contextWindow": 1' + "0" * 5000 + "}}", encoding="utf-8")
    elif kind == "not UTF-8":
        path.write_bytes(b'{"model": {"name": "\xff"}}')
    return path


SPECIAL_FILES = {
    "folder": "it is a folder",
    "fifo": "it is a FIFO",
    "/dev/zero": "it is a device",
    "broken link": "cannot read config file (No such file or directory)",
    "nested 100,000 deep": "nested too deeply",
    "nested 17 deep": "nested too deeply",
    "over 1 MiB": "larger than 1,048,576 bytes",
    "NaN": "NaN is not a JSON number",
    "5,000 digits": "too many digits",
    "not UTF-8": "not UTF-8 text",
}


@pytest.mark.parametrize("kind", SPECIAL_FILES)
def test_a_soba_json_that_is_no_config_file_is_one_line_of_error(tmp_path: Path, isolated: dict[str, Any], kind: str) -> None:
    # A parent's soba.json must not be used instead, nor the defaults (the embedded model).
    write_json(tmp_path / "soba.json", {"model": {"name": "from-the-parent"}})
    path = special_file(tmp_path / "project", kind)
    message = one_line_refusal(lambda: load_config(tmp_path / "project", **isolated))
    assert message.startswith(f"{path}: ") and SPECIAL_FILES[kind] in message


@pytest.mark.parametrize("kind", ["folder", "fifo", "/dev/zero", "nested 100,000 deep"])
def test_a_user_config_that_is_no_config_file_is_one_line_of_error(tmp_path: Path, kind: str) -> None:
    user = tmp_path / "home" / ".soba"
    path = special_file(user, kind).rename(user / "config.json")
    message = one_line_refusal(lambda: load_config(tmp_path, environ={}, user_config=path))
    assert message.startswith(f"{path}: ") and SPECIAL_FILES[kind] in message


def test_a_config_file_saved_with_a_byte_order_mark_is_read(tmp_path: Path, isolated: dict[str, Any]) -> None:
    """Windows editors save UTF-8 with a BOM, which nobody sees: the JSON after it is read, and
    a bad byte further on is named at its place in the file."""
    (tmp_path / "soba.json").write_bytes(codecs.BOM_UTF8 + b'{"model": {"provider": "openai", "name": "saved-in-notepad"}}')
    assert load_config(tmp_path, **isolated).model.name == "saved-in-notepad"
    (tmp_path / "soba.json").write_bytes(codecs.BOM_UTF8 + b'{"model": {"name": "\xff"}}')
    message = one_line_refusal(lambda: load_config(tmp_path, **isolated))
    assert message == f"{tmp_path / 'soba.json'}: not UTF-8 text (byte 23)"
    (tmp_path / "soba.json").write_bytes(codecs.BOM_UTF8 * 2 + b"{}")  # only one is a mark
    assert "not valid JSON" in one_line_refusal(lambda: load_config(tmp_path, **isolated))


@pytest.mark.parametrize(
    ("text", "where", "said"),
    [
        ('{\n  // the team\'s model\n  "model": {"name": "gpt-4o"}\n}\n', "line 2, column 3", "comments are not JSON"),
        ('{\n  "model": {"name": "gpt-4o"} # ours\n}\n', "line 2, column 31", "comments are not JSON"),
        ('{\n  "model": {"name": "gpt-4o",},\n}\n', "line 2, column 30", "a comma before '}', which JSON does not allow"),
        ('{"model": {"contextWindow": 8192}, "x": [1, 2,\n]}', "line 2, column 1", "a comma before ']', which JSON does not allow"),
        ("{'model': {'name': 'gpt-4o'}}", "line 1, column 2", "JSON names and strings take double quotes"),
        ('{"model": {"name": "gpt-4o"}', "line 1, column 29", "Expecting ',' delimiter)"),
    ],
)
def test_a_hand_edited_soba_json_says_where_and_what_is_not_json(
    tmp_path: Path, isolated: dict[str, Any], text: str, where: str, said: str
) -> None:
    (tmp_path / "soba.json").write_text(text, encoding="utf-8")
    message = one_line_refusal(lambda: load_config(tmp_path, **isolated))
    assert message.startswith(f"{tmp_path / 'soba.json'}: not valid JSON ({where}: ")
    assert message.endswith(said if said.endswith(")") else f" — {said})")


def test_a_config_file_behind_a_link_is_read(tmp_path: Path, isolated: dict[str, Any]) -> None:
    """Dotfile managers link config files: a link to a regular file is fine."""
    target = write_json(tmp_path / "dotfiles" / "soba.json", {"model": {"provider": "openai", "name": "linked"}})
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "soba.json").symlink_to(target)
    assert load_config(tmp_path / "project", **isolated).model.name == "linked"


def test_a_recorded_configuration_refused_today_is_a_config_error() -> None:
    recorded = SobaConfig().to_json()
    recorded["model"]["baseUrl"] = "file:///etc/passwd"
    message = one_line_refusal(lambda: recorded_config(recorded, {}, "recorded"))
    assert 'model.baseUrl = "file:///etc/passwd": must be an http:// or https:// URL' in message


# -- agent and model.pricing (SPEC §3, §11) ------------------------------------------------


def test_agent_section_and_pricing_take_the_spec_keys() -> None:
    config = build_config(
        [
            (
                "soba.json",
                {
                    "agent": {"approval": "edits", "maxSessionCostUsd": 2},
                    "model": {"pricing": {"inputPerMTok": 2.5, "outputPerMTok": 10.0, "cachedInputPerMTok": 1.25}},
                },
            )
        ]
    )
    assert config.agent.approval == "edits" and config.agent.max_session_cost_usd == 2.0
    pricing = config.model.pricing
    assert pricing is not None
    assert (pricing.input_per_m_tok, pricing.output_per_m_tok, pricing.cached_input_per_m_tok) == (2.5, 10.0, 1.25)
    assert config.to_json()["model"]["pricing"] == {"inputPerMTok": 2.5, "outputPerMTok": 10.0, "cachedInputPerMTok": 1.25}
    assert config.set_by("agent.maxSessionCostUsd") == "soba.json"


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"agent": {"approval": "sometimes"}}, "agent.approval = \"sometimes\": input should be 'never', 'edits' or 'all'"),
        ({"agent": {"maxSessionCostUsd": -1}}, "agent.maxSessionCostUsd = -1: input should be greater than or equal to 0"),
        ({"agent": {"maxSessionCostUsd": True}}, "agent.maxSessionCostUsd = true: input should be a valid number"),
        ({"agent": {"maxSessionCostUsd": "5"}}, "agent.maxSessionCostUsd = \"5\": input should be a valid number"),
        ({"agent": {"budget": 5}}, "agent.budget: unknown key (value 5); known keys in agent: approval, maxSessionCostUsd"),
        ({"model": {"pricing": "cheap"}}, 'model.pricing = "cheap": must be a JSON object'),
        ({"model": {"pricing": {"inputPerMTok": 2.5}}}, "model.pricing.outputPerMTok: required"),
        ({"model": {"pricing": {"inputPerMTok": -2, "outputPerMTok": 1}}}, "model.pricing.inputPerMTok = -2: input should be greater"),
        (
            {"model": {"pricing": {"inputPerMTok": 1, "outputPerMTok": 1, "cacheRead": 0.1}}},
            "model.pricing.cacheRead: unknown key (value 0.1); known keys in model.pricing: inputPerMTok, outputPerMTok, cachedInputPerMTok",
        ),
    ],
)
def test_bad_agent_and_pricing_values_are_refused_in_one_line(layer: dict[str, Any], message: str) -> None:
    assert message in refused(layer)


def test_agent_and_pricing_from_the_environment() -> None:
    assert env_layer({"SOBA_AGENT_APPROVAL": "all"}) == {"agent": {"approval": "all"}}
    assert env_layer({"SOBA_AGENT_MAX_SESSION_COST_USD": "0.5"}) == {"agent": {"maxSessionCostUsd": 0.5}}
    assert env_layer({"SOBA_MODEL_PRICING": '{"inputPerMTok": 1, "outputPerMTok": 4}'}) == {
        "model": {"pricing": {"inputPerMTok": 1, "outputPerMTok": 4}}
    }
    with pytest.raises(ConfigError, match="SOBA_AGENT_MAX_SESSION_COST_USD: agent.maxSessionCostUsd = Infinity"):
        env_layer({"SOBA_AGENT_MAX_SESSION_COST_USD": "Infinity"})


# -- compaction.model: a summary model of its own (SPEC §14) ----------------------------------


def summary_config(summary: Any, model: dict[str, Any] | None = None) -> SobaConfig:
    return build_config([("soba.json", {"model": model or {"name": "gpt-4o"}, "compaction": {"model": summary}})])


def test_the_summary_model_inherits_what_it_does_not_give_from_model() -> None:
    main = {"name": "gpt-4o", "baseUrl": "http://127.0.0.1:8080/v1", "apiKeyEnv": "MAIN_KEY", "contextWindow": 64000,
            "maxOutputTokens": 4000, "pricing": {"inputPerMTok": 2.5, "outputPerMTok": 10}}  # fmt: skip
    summary = summary_config({"name": "gpt-4o-mini"}, main).summary_model
    assert summary is not None
    assert (summary.provider, summary.name, summary.base_url, summary.api_key_env) == (
        "openai", "gpt-4o-mini", "http://127.0.0.1:8080/v1", "MAIN_KEY",
    )  # fmt: skip
    assert (summary.context_window, summary.max_output_tokens) == (64000, 4000)
    assert summary.pricing is None  # model.pricing prices gpt-4o, not gpt-4o-mini

    own = summary_config(
        {"name": "gpt-4o-mini", "baseUrl": None, "apiKeyEnv": "MINI_KEY", "contextWindow": 16000,
         "maxOutputTokens": 1000, "pricing": {"inputPerMTok": 0.15, "outputPerMTok": 0.6}}, main,
    ).summary_model  # fmt: skip
    assert own is not None and own.base_url is None and own.api_key_env == "MINI_KEY"  # null: the public address
    assert (own.context_window, own.max_output_tokens) == (16000, 1000)
    assert own.pricing is not None and own.pricing.input_per_m_tok == 0.15

    same = summary_config({"name": "gpt-4o", "contextWindow": 32000}, main).summary_model
    assert same is not None and same.pricing is not None and same.pricing.input_per_m_tok == 2.5  # the same model


def test_a_summary_model_of_another_provider_starts_from_that_providers_defaults() -> None:
    main = {"name": "gpt-4o", "baseUrl": "https://gateway.example/v1", "apiKeyEnv": "GATEWAY_KEY"}
    summary = summary_config({"name": "claude-haiku-4-5", "provider": "anthropic"}, main).summary_model
    assert summary is not None
    # Neither the gateway's address nor its key goes to Anthropic.
    assert (summary.provider, summary.base_url, summary.api_key_env) == ("anthropic", None, "ANTHROPIC_API_KEY")
    assert (summary.context_window, summary.max_output_tokens) == (200000, 8000)
    local = summary_config({"name": "SmolLM2-135M-Instruct", "provider": "local"}).summary_model
    assert local is not None and (local.api_key_env, local.context_window, local.max_output_tokens) == ("", 8192, 512)


def test_compaction_model_encodes_only_the_keys_given_and_round_trips(tmp_path: Path, isolated: dict[str, Any]) -> None:
    config = summary_config({"name": "gpt-4o-mini", "baseUrl": None, "contextWindow": 16000})
    assert config.to_json()["compaction"]["model"] == {"name": "gpt-4o-mini", "baseUrl": None, "contextWindow": 16000}
    again = recorded_config(config.to_json(), config.explicit_keys, "soba.json")
    assert again.summary_model == config.summary_model and again.to_json() == config.to_json()
    assert SobaConfig().summary_model is None
    write_json(tmp_path / "soba.json", {"compaction": {"model": {"name": "gpt-4o-mini"}}})
    loaded = load_config(tmp_path, **{**isolated, "environ": {"OPENAI_API_KEY": "k"}})
    assert (loaded.set_by("compaction.model") or "").endswith("soba.json")


@pytest.mark.parametrize(
    ("summary", "line"),
    [
        ({"name": "gpt-4o-mini", "contextWindow": -1}, "compaction.model.contextWindow = -1: input should be greater than 0"),
        ({"name": "gpt-4o-mini", "maxOutputTokens": 0}, "compaction.model.maxOutputTokens = 0: input should be greater than 0"),
        ({"contextWindow": 16000}, "compaction.model.name: required"),
        ({"name": " "}, 'compaction.model.name = " ": must not be empty'),
        ({"name": "x", "provider": "azure"}, "compaction.model.provider = \"azure\": input should be 'openai', 'anthropic' or 'local'"),
        ({"name": "x", "baseUrl": "ftp://host"}, 'compaction.model.baseUrl = "ftp://host": must be an http:// or https:// URL'),
        ({"name": "x", "pricing": {"inputPerMTok": -1, "outputPerMTok": 1}},
         "compaction.model.pricing.inputPerMTok = -1: input should be greater than or equal to 0"),
        ({"name": "x", "colour": "red"}, 'compaction.model.colour: unknown key (value "red"); known keys in compaction.model: name, '
         "provider, baseUrl, apiKeyEnv, contextWindow, maxOutputTokens, pricing"),
        ("gpt-4o-mini", 'compaction.model = "gpt-4o-mini": must be a JSON object'),
        ({"name": "x", "contextWindow": 4000}, "compaction.model.contextWindow = 4000: the summary model's window (4,000) leaves "
         "no room for a request after maxOutputTokens (8,000) and a safety reserve of 250"),
        ({"name": "x", "contextWindow": 4000, "maxOutputTokens": 3900}, "compaction.model.maxOutputTokens = 3900: the summary "
         "model's window (4,000) leaves no room for a request after maxOutputTokens (3,900) and a safety reserve of 250"),
    ],
)  # fmt: skip
def test_a_bad_summary_model_is_refused_in_one_line_naming_its_key(summary: Any, line: str) -> None:
    with pytest.raises(ConfigError) as refused:
        summary_config(summary)
    assert str(refused.value) == f"invalid configuration: {line} (in soba.json)"


def test_a_key_pasted_into_the_summary_model_is_never_shown() -> None:
    secret = "sk-proj-AbCdEf0123456789XyZaBcDeFgHiJ"
    for summary in ({"name": "x", "apiKeyEnv": secret}, {"name": "x", "apiKey": secret}):
        with pytest.raises(ConfigError) as refused:
            summary_config(summary)
        assert secret not in str(refused.value) and "compaction.model.apiKey" in str(refused.value)
    assert "compaction.model.apiKeyEnv names" in str(refused.value)  # where a key is read from: its own variable


def test_the_summary_model_from_the_environment() -> None:
    layer = env_layer({
        "SOBA_COMPACTION_MODEL": '{"name": "gpt-4o", "contextWindow": 32000}',
        "SOBA_COMPACTION_MODEL_NAME": "gpt-4o-mini",
        "SOBA_COMPACTION_MODEL_API_KEY_ENV": "MINI_KEY",
        "SOBA_COMPACTION_MODEL_PRICING": '{"inputPerMTok": 0.15, "outputPerMTok": 0.6}',
    })  # fmt: skip
    assert layer == {"compaction": {"model": {
        "name": "gpt-4o-mini", "contextWindow": 32000, "apiKeyEnv": "MINI_KEY",
        "pricing": {"inputPerMTok": 0.15, "outputPerMTok": 0.6},
    }}}  # fmt: skip  (a key's own variable wins over the object's)
    summary = build_config([("environment", layer)]).summary_model
    assert summary is not None and (summary.name, summary.context_window, summary.api_key_env) == ("gpt-4o-mini", 32000, "MINI_KEY")
    # A nested key alone is valid (the name may come from a file), and checked alone.
    assert env_layer({"SOBA_COMPACTION_MODEL_CONTEXT_WINDOW": "16000"}) == {"compaction": {"model": {"contextWindow": 16000}}}
    with pytest.raises(ConfigError) as refused:
        env_layer({"SOBA_COMPACTION_MODEL_CONTEXT_WINDOW": "-1"})
    assert str(refused.value) == (
        "invalid configuration: SOBA_COMPACTION_MODEL_CONTEXT_WINDOW: compaction.model.contextWindow = -1: "
        "input should be greater than 0"
    )
    assert env_layer({"SOBA_COMPACTION_MODEL": "null"}) == {"compaction": {"model": None}}


def test_the_embedded_model_writes_no_summary_under_another_name(tmp_path: Path, isolated: dict[str, Any]) -> None:
    write_json(tmp_path / "soba.json", {"model": {"provider": "local"}, "compaction": {"model": {"name": "gpt-4o-mini"}}})
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path, **isolated)
    message = str(refused.value)
    assert message.startswith('invalid configuration: compaction.model.name = "gpt-4o-mini" (in ')
    assert "the provider is 'local' (model.provider, set in " in message and "compaction.model.provider" in message

    write_json(tmp_path / "soba.json", {"compaction": {"model": {"name": "x", "provider": "local", "baseUrl": "http://127.0.0.1:1/v1"}}})
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path, **{**isolated, "environ": {"OPENAI_API_KEY": "k"}})
    assert 'compaction.model.baseUrl = "http://127.0.0.1:1/v1"' in str(refused.value)

    # A hosted summary model beside the embedded main one: its own provider, its own key.
    write_json(tmp_path / "soba.json", {
        "model": {"provider": "local"},
        "compaction": {"model": {"name": "gpt-4o-mini", "provider": "openai", "apiKeyEnv": "MINI_KEY"}},
    })  # fmt: skip
    config = load_config(tmp_path, **isolated)
    assert config.model.provider == "local" and config.summary_model is not None
    assert (config.summary_model.provider, config.summary_model.api_key_env) == ("openai", "MINI_KEY")
