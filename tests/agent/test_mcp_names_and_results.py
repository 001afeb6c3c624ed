"""MCP tools as soba offers them (SPEC §19): names within the providers' rule that cannot clash
with soba's or each other, schemas without generated titles and bounded, results from the
SDK's own content types turned into text (an image named, never fetched), clipped."""

from __future__ import annotations

import re

import mcp_types

from soba_nb.agent.mcp.names import MAX_NAME_CHARS, is_mcp_tool, offered_name
from soba_nb.agent.mcp.results import MAX_RESULT_CHARS, outcome_of, tool_schema
from soba_nb.agent.tool_schemas import TOOL_SCHEMAS

RULE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def test_names_follow_the_providers_rule_and_never_clash():
    taken: set[str] = set()
    for tool in ("read file", "read.file", "读取", "x" * 100, "x" * 100, "python"):
        name = offered_name("my-server", tool, taken)
        assert RULE.match(name) and name not in taken and is_mcp_tool(name)
        taken.add(name)
    assert offered_name("time", "get_current_time", ()) == "mcp__time__get_current_time"
    assert "mcp__my-server__read_file_2" in taken and len(max(taken, key=len)) == MAX_NAME_CHARS
    assert not any(is_mcp_tool(schema.name) for schema in TOOL_SCHEMAS)


def test_schemas_lose_generated_titles_but_not_a_property_named_title_and_stay_bounded():
    schema = tool_schema("mcp__a__b", "a", "Says\x1b[2J hello", {
        "title": "bArguments", "type": "object",
        "properties": {"title": {"title": "Title", "type": "string"}, "n": {"anyOf": [{"type": "integer", "title": "N"}]}},
    })
    assert schema.parameters == {"type": "object", "properties": {"title": {"type": "string"}, "n": {"anyOf": [{"type": "integer"}]}}}
    assert schema.description == "[MCP server 'a'] Says\\x1b[2J hello"
    huge = tool_schema("mcp__a__c", "a", "x" * 5000, {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}})
    assert huge.parameters == {"type": "object", "properties": {}} and "too large to send" in huge.description
    assert len(huge.description) < 1200


def test_results_are_text_images_named_errors_kept_and_clipped():
    result = mcp_types.CallToolResult(content=[
        mcp_types.TextContent(type="text", text="first"),
        mcp_types.ImageContent(type="image", data="aGk=", mime_type="image/png"),
    ], is_error=True)
    outcome = outcome_of(result)
    assert outcome.content == "first\n[image: image/png, not shown]" and outcome.is_error
    big = outcome_of(mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="y" * 500_000)]))
    assert len(big.content) <= MAX_RESULT_CHARS + 100 and "characters clipped" in big.content and not big.is_error
    structured = outcome_of(mcp_types.CallToolResult(content=[], structured_content={"a": 1}))
    assert structured.content == '{"a": 1}'
