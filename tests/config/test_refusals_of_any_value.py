"""Any value under any real key: the configuration is built (and what it encodes validates back
to the same configuration), or refused in one line that names the key and the layer — never a
traceback. The layers use the keys the sections declare, so the values reach every check."""

from __future__ import annotations

import math
import warnings

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soba_nb.config import ConfigError, SobaConfig, build_config, recorded_config
from soba_nb.config.settings import fields_of

SECTIONS = {
    info.encode_name: info.type
    for info in msgspec.structs.fields(SobaConfig)
    if isinstance(info.type, type) and issubclass(info.type, msgspec.Struct)
}
KEYS = {name: [*fields_of(section), "backgroundTimeoutMs", "unknownKey"] for name, section in SECTIONS.items()}

VALUES = (
    st.none()
    | st.booleans()
    | st.integers(-(10**3), 10**3)
    | st.sampled_from([0, 1, 512, 8192, 128_000, 100_000_000, 100_000_001, 2**63, 10**100, -(10**100)])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["openai", "anthropic", "local", "chat", "responses", "never", "all", "", "OPENAI_API_KEY",
                       "http://127.0.0.1:8080/v1", "ftp://host", "sk-proj-abcdefghijklmnopqrstuv0123456789"])
    | st.text(max_size=12)
    | st.lists(st.integers(), max_size=2)
    | st.fixed_dictionaries({}, optional={"inputPerMTok": st.floats() | st.integers(-2, 5) | st.text(max_size=2),
                                          "outputPerMTok": st.integers(-2, 5) | st.booleans(), "x": st.none()})
)
SERVER = st.fixed_dictionaries({}, optional={
    "command": VALUES | st.just("mcp-server-time"),
    "args": VALUES | st.lists(st.text(max_size=4), max_size=2),
    "env": VALUES | st.dictionaries(st.sampled_from(["TOKEN", "bad name"]), VALUES, max_size=2),
    "url": VALUES | st.just("http://127.0.0.1:1/mcp"),
    "x": st.none(),
})
MCP_SERVERS = st.dictionaries(st.sampled_from(["time", "a.b", ""]), SERVER | VALUES, max_size=2)
"""`mcpServers` (SPEC §19): a server's name, then its keys."""
LAYER = st.dictionaries(
    st.sampled_from([*KEYS, "bogus", "mcpServers"]),
    st.sampled_from([*KEYS]).flatmap(lambda section: st.dictionaries(st.sampled_from(KEYS[section]), VALUES, max_size=3))
    | MCP_SERVERS
    | VALUES,
    max_size=3,
)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(layers=st.lists(LAYER, min_size=1, max_size=2))
def test_any_value_is_taken_or_refused_in_one_line(layers: list[dict[str, object]]) -> None:
    named = [(f"layer{i}.json", layer) for i, layer in enumerate(layers)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a deprecated key's warning
            config = build_config(named)
    except ConfigError as error:
        message = str(error)
        assert message.startswith("invalid configuration: ") and "\n" not in message
        assert "Traceback" not in message and "msgspec" not in message and "Expected `" not in message
        return
    again = msgspec.convert(config.to_json(), SobaConfig)
    assert again.to_json() == config.to_json()
    assert again == config or any(server.env for server in config.mcp_servers.values())  # env values: not recorded
    for value in (config.model.context_window, config.compaction.keep_recent_tokens, config.compaction.min_savings_ratio):
        assert not isinstance(value, bool) and math.isfinite(value)
    assert 0 < config.compaction.keep_recent_tokens + 1 <= config.hard_limit


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ([1], "the configuration must be a JSON object"),
        ("text", "the configuration must be a JSON object"),
        ({5: 1}, '"5": unknown key'),
        ({"model": {5: 1}}, 'model."5": unknown key'),
        ({"model": {"pricing": {"inputPerMTok": 1, "outputPerMTok": 1, None: 0}}}, 'model.pricing.None: unknown key'),
        ({"model": "x`y - at `$.model`"}, 'model = "x`y - at `$.model`": must be a JSON object'),
        ({"x` - at `$.model": 1}, '"x` - at `$.model": unknown key'),
    ],
)
def test_what_no_json_file_holds_is_refused_in_one_line_too(data: object, said: str) -> None:
    """A recorded configuration comes from a transcript, which may be planted; Python callers may
    pass anything: still one line, no msgspec wording, the odd key named as JSON."""
    with pytest.raises(ConfigError) as refused:
        recorded_config(data, {}, "test")  # type: ignore[arg-type]
    message = str(refused.value)
    assert message.startswith(f"the recorded configuration is refused: {said}"), message
    assert "\n" not in message and "Expected `" not in message
